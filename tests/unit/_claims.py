"""ResourceSlices and ResourceClaims of Tessera's driver, as the claims path's unit tests
need them."""

from __future__ import annotations

from typing import Any

from tessera.claims.devices import resource_slice
from tessera.model.clusterspec import make_cards


def a_slice(node: str = "c1", model: str = "A100") -> dict[str, Any]:
    """The slice of a claims node with four cards of ``model``."""
    return resource_slice(node, make_cards(node, 4, model), generation=1)


def claim(
    name: str,
    uid: str = "",
    memory: str | None = "8Gi",
    device: str = "gpu-0",
    pool: str = "c1",
    driver: str = "gpu.tessera.io",
    ns: str = "team-a",
    compute: str = "10",
    share_id: str | None = None,
) -> dict[str, Any]:
    """A claim allocated one device (``memory`` None: not allocated)."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid or f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {},
    }
    if memory is not None:
        consumed = {"memory": memory, "compute": compute, "slots": "1"}
        result = {"request": "gpu", "driver": driver, "pool": pool, "device": device,
                  "consumedCapacity": consumed}  # fmt: skip
        if share_id is not None:
            result["shareID"] = share_id
        obj["status"] = {"allocation": {"devices": {"results": [result]}}}
    return obj
