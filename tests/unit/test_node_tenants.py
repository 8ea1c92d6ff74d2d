from __future__ import annotations

import os
from pathlib import Path

from tessera.model.types import CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.layout import AllocRecord, Layout
from tessera.node.limits import encode_limits, limits_for
from tessera.node.tenants import AllocationTenants
from tessera.node.usage import encode_region

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


def test_a_garbled_region_leaves_only_that_tenant_out(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    recs = [write(layout, "a", 30), write(layout, "b", 20)]
    (layout.alloc_dir("b") / "usage" / "region").write_bytes(b"garbage")
    assert [t.name for t in AllocationTenants(layout, lambda: recs)()] == ["a"]
