from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from tessera.model.types import CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.burst.coordinator import Coordinator, Tenant
from tessera.node.burst.tenants import AllocationTenants, CoordinatorHost
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.formats.limits import encode_limits, limits_for
from tessera.node.formats.usage import encode_region
from tests.unit._wait import eventually

U = "GPU-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e01"


def write(layout: Layout, alloc_id: str, cores: int) -> AllocRecord:
    rec = AllocRecord(alloc_id, (f"{U}::0",), "uid", "ns", alloc_id, "c", (U,), True, "v", 0.0)
    ca = ContainerAssignment("c", (CardSlice(U, 1000, cores),), ComputePolicy.BURST_SHARE)
    layout.write_alloc(rec, encode_limits(limits_for(ca)))
    (layout.alloc_dir(alloc_id) / "usage" / "region").write_bytes(encode_region())
    return rec


def test_tenants_follow_the_allocations_and_their_limits_files(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    recs = [write(layout, "a", 30), write(layout, "b", 20)]
    tenants = AllocationTenants(layout, lambda: recs)
    got = {t.name: t for t in tenants()}
    assert sorted(got) == ["a", "b"]
    assert got["a"].limits.cards[0].cores_percent == 30
    assert got["a"].region == layout.alloc_dir("a") / "usage" / "region"
    assert got["a"].allowance == layout.alloc_dir("a") / "allowance" / "allowance"
    # A corrected limits file (PreStartContainer) is read again.
    ca = ContainerAssignment("c", (CardSlice(U, 1000, 45),), ComputePolicy.BURST_SHARE)
    limits = layout.alloc_dir("a") / "etc" / "limits"
    os.chmod(limits, 0o644)
    limits.write_text(encode_limits(limits_for(ca)))
    os.utime(limits, ns=(1, 10**18))
    assert {t.name: t for t in tenants()}["a"].limits.cards[0].cores_percent == 45


def test_a_garbled_region_leaves_only_that_tenant_out_of_the_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One read of each region per tick: a tenant whose region does not decode gets no
    allowance written (libvgpu falls back to its floor) and is warned about once; the
    others are decided as usual, and the tenant is back once its region reads again."""
    layout = Layout(tmp_path)
    recs = [write(layout, "a", 30), write(layout, "b", 20)]
    region_b = layout.alloc_dir("b") / "usage" / "region"
    region_b.write_bytes(b"garbage")
    coordinator = Coordinator(AllocationTenants(layout, lambda: recs))
    with caplog.at_level(logging.WARNING):
        assert sorted(coordinator.tick()) == ["a"]
        assert sorted(coordinator.tick()) == ["a"]
    warnings = [r.getMessage() for r in caplog.records if "tenant b" in r.getMessage()]
    assert len(warnings) == 1 and "usage region" in warnings[0]
    assert not (layout.alloc_dir("b") / "allowance" / "allowance").exists()
    region_b.write_bytes(encode_region())
    assert sorted(coordinator.tick()) == ["a", "b"]
    # Garbled again, and a garbled for the first time: each is warned about again.
    region_b.write_bytes(b"garbage")
    (layout.alloc_dir("a") / "usage" / "region").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING):
        assert coordinator.tick() == {}
    warned = [r.getMessage() for r in caplog.records if "usage region" in r.getMessage()]
    assert [m.split(":")[0] for m in warned] == [
        "coordinator skips tenant b",
        "coordinator skips tenant a",
        "coordinator skips tenant b",
    ]


def test_prepared_claims_are_tenants_beside_the_allocations(tmp_path: Path) -> None:
    """A claim's folder is read like an allocation's; a folder whose limits do not read
    yet (the claim being prepared) is left out, not the ones after it."""
    layout = Layout(tmp_path)
    recs = [write(layout, "a", 30)]
    for uid, cores in (("u-half", None), ("u1", 25)):
        folder = layout.claim_dir(uid)
        (folder / "etc").mkdir(parents=True)
        if cores is not None:
            ca = ContainerAssignment("c", (CardSlice(U, 1000, cores),), ComputePolicy.BURST_SHARE)
            (folder / "etc" / "limits").write_text(encode_limits(limits_for(ca)))
    tenants = AllocationTenants(layout, lambda: recs, claims=lambda: ["u-half", "u1"])
    got = {t.name: t for t in tenants()}
    assert sorted(got) == ["a", "claim-u1"]
    assert got["claim-u1"].limits.cards[0].cores_percent == 25
    assert got["claim-u1"].region == layout.claim_dir("u1") / "usage" / "region"


def test_the_host_ticks_on_its_thread_until_stopped_and_survives_a_bad_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = Layout(tmp_path)
    recs = [write(layout, "a", 30)]
    inner = AllocationTenants(layout, lambda: recs)
    calls = [0]
    asked: list[str] = []

    def tenants() -> list[Tenant]:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("first tick fails")
        return list(inner())

    def card_busy(uuid: str) -> float | None:
        asked.append(uuid)
        return None

    host = CoordinatorHost(tenants, period_s=0.01, card_busy=card_busy)
    with caplog.at_level(logging.ERROR):
        host.start()
        try:
            eventually(lambda: host.ticks >= 2)
        finally:
            host.stop()
    assert any("coordinator tick" in r.getMessage() for r in caplog.records)
    assert (layout.alloc_dir("a") / "allowance" / "allowance").exists()
    assert asked and set(asked) == {U}
    ticks = host.ticks
    time.sleep(0.05)
    assert host.ticks == ticks  # stopped
