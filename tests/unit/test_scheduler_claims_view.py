"""What the GPU map page keeps of the claims path: this driver's slices, and claims only
while an allocation names one of its devices."""

from __future__ import annotations

from typing import Any

from tessera.kube.port import WatchEvent
from tessera.scheduler.claims_view import _allocated_here, _Kept, _own_slice


def claim(name: str, driver: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if driver is not None:
        result = {"request": "gpu", "driver": driver, "pool": "n1", "device": "gpu-4"}
        status = {"allocation": {"devices": {"results": [result]}}}
    return {"metadata": {"namespace": "ns", "name": name}, "status": status}


def test_claims_are_kept_only_while_allocated_on_this_driver() -> None:
    kept = _Kept(_allocated_here)
    kept.replace([claim("ours", "gpu.tessera.io"), claim("theirs", "gpu.nvidia.com"),
                  claim("waiting", None)])  # fmt: skip
    assert [c["metadata"]["name"] for c in kept.items()] == ["ours"]
    kept.apply(WatchEvent("MODIFIED", claim("ours", None)))  # deallocated
    kept.apply(WatchEvent("ADDED", claim("new", "gpu.tessera.io")))
    assert [c["metadata"]["name"] for c in kept.items()] == ["new"]
    kept.apply(WatchEvent("DELETED", claim("new", "gpu.tessera.io")))
    assert kept.items() == []


def test_only_this_drivers_slices_are_kept() -> None:
    kept = _Kept(_own_slice)
    ours = {"metadata": {"name": "n1-gpu.tessera.io"}, "spec": {"driver": "gpu.tessera.io"}}
    theirs = {"metadata": {"name": "n1-other"}, "spec": {"driver": "gpu.nvidia.com"}}
    kept.replace([ours, theirs])
    assert kept.items() == [ours]
