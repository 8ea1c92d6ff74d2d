from __future__ import annotations

from pathlib import Path

import pytest

from tessera.model.clusterspec import card_uuid
from tessera.node.cards.fake import FakeDiscovery
from tessera.node.ports import DiscoveryError, XidEvent

CSV = (
    "sn,cpu_milli,memory_mib,gpu,model\nnode-a,32000,131072,2,A100\nnode-b,32000,131072,8,V100M16\n"
)


def test_picks_its_row_by_node_name(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(CSV)
    d = FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-b")
    facts = d.facts()
    assert [c.uuid for c in facts.cards] == [card_uuid("node-b", i) for i in range(8)]
    assert facts.cards[0].model == "V100M16" and facts.cards[0].nvlink_peers
    with pytest.raises(DiscoveryError, match="node-z"):
        FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-z")


def test_injected_xids_and_probe_failures(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(CSV)
    d = FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-a")
    u = card_uuid("node-a", 0)
    assert d.wait_events(0.01) == []
    d.inject_xid(u, 79)
    assert d.wait_events(1) == [XidEvent(u, 79)]
    d.set_probe(u, False)
    assert not d.probe(u) and d.probe(card_uuid("node-a", 1))
    d.set_probe(u, True)
    assert d.probe(u)
    assert d.utilization(u) is None
    d.set_utilization(u, 42.0)
    assert d.utilization(u) == 42.0
    with pytest.raises(DiscoveryError):
        d.inject_xid("GPU-nope", 79)


def test_faults_from_files(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(CSV)
    faults = tmp_path / "faults"
    faults.mkdir()
    d = FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-a", fault_dir=faults)
    u = card_uuid("node-a", 1)
    (faults / "xid").write_text(f"{u} 48\nGPU-unknown 79\nnot a line\n{u} 4")  # last: partial
    assert d.wait_events(0.01) == [XidEvent(u, 48)]
    with (faults / "xid").open("a") as f:
        f.write("3\n")
    assert d.wait_events(0.01) == [XidEvent(u, 43)]
    (faults / "probe-fail").write_text(u + "\n")
    assert not d.probe(u)
    assert d.utilization(u) is None
    u0 = card_uuid("node-a", 0)
    (faults / "utilization").write_text(f"{u} 37.5\n{u0} lots\n")
    assert d.utilization(u) == 37.5
    assert d.utilization(u0) is None  # a typo reads as unknown, as NVML would say
    d.set_utilization(u, 80.0)
    assert d.utilization(u) == 80.0  # a method's value wins over the file
