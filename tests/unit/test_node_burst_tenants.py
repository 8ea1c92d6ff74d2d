from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tessera.model.types import CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.burst.coordinator import Coordinator
from tessera.node.burst.tenants import AllocationTenants
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.formats.limits import encode_limits, limits_for
from tessera.node.formats.usage import encode_region

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
