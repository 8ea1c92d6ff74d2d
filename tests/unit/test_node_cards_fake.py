from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tessera.model.clusterspec import card_uuid
from tessera.node.cards.fake import FakeDiscovery, host_pids
from tessera.node.ports import DiscoveryError, GpuProcess, XidEvent

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


# libvgpu/fake/fake_dev.h: a card's file; each process record is pid (as it sees itself),
# pad, pid namespace inode, start time (clock ticks since boot), device bytes.
RECORD = struct.Struct("<iIQQQ")
RECORDS_AT, RECORDS = 56, 64


def _me() -> tuple[int, int, int]:
    """This process as the fake driver records it: (pid ns inode, pid in it, start)."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    with open("/proc/self/status") as f:
        inner = next(int(line.split()[-1]) for line in f if line.startswith("NSpid:"))
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    return ns, inner, start


def _record(path: Path, slot: int, pid: int, ns: int, start: int, used: int) -> None:
    with path.open("r+b") as f:
        f.seek(RECORDS_AT + slot * RECORD.size)
        f.write(RECORD.pack(pid, 0, ns, start, used))


def test_the_device_files_are_sized_to_their_cards_and_kept_across_restarts(
    tmp_path: Path,
) -> None:
    (tmp_path / "nodes.csv").write_text(CSV)
    devices = tmp_path / "dev"
    FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-a", device_dir=devices)
    u = card_uuid("node-a", 0)
    data = (devices / u).read_bytes()
    assert len(data) == RECORDS_AT + RECORDS * RECORD.size
    assert struct.unpack_from("<Q", data, 8)[0] == 40 * 1024 << 20  # an A100's 40 GiB
    assert (devices / u).stat().st_mode & 0o777 == 0o666  # any container user maps it
    assert sorted(p.name for p in devices.iterdir()) == sorted(
        card_uuid("node-a", i) for i in range(2)
    )  # no temporary file left
    ns, pid, start = _me()
    _record(devices / u, 0, pid, ns, start, 1 << 30)
    FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-a", device_dir=devices)  # restart
    assert RECORD.unpack_from((devices / u).read_bytes(), RECORDS_AT)[4] == 1 << 30


def test_processes_are_the_live_ones_the_driver_lists_by_their_pid_here(tmp_path: Path) -> None:
    (tmp_path / "nodes.csv").write_text(CSV)
    devices = tmp_path / "dev"
    d = FakeDiscovery.from_csv(tmp_path / "nodes.csv", "node-a", device_dir=devices)
    u0, u1 = card_uuid("node-a", 0), card_uuid("node-a", 1)
    ns, pid, start = _me()
    _record(devices / u0, 0, pid, ns, start, 3 << 30)
    _record(devices / u0, 1, pid, ns, start + 1, 1 << 30)  # an earlier process, same pid
    _record(devices / u0, 2, pid, ns + 1, start, 1 << 30)  # another namespace
    _record(devices / u0, 3, pid, ns, start, 0)  # listed, holding nothing
    _record(devices / u0, RECORDS - 1, pid, ns, start, 5 << 30)  # the last slot counts
    assert d.processes(u0) == [GpuProcess(os.getpid(), 3 << 30), GpuProcess(os.getpid(), 5 << 30)]
    assert d.processes(u1) == []
    assert d.processes("GPU-not-here") == []
    assert FakeDiscovery(d.facts().cards).processes(u0) == []  # no device folder: none
    (devices / u1).write_bytes(b"\0" * (RECORDS_AT + RECORD.size // 2))  # cut short
    assert d.processes(u1) == []
    (devices / u1).unlink()
    assert d.processes(u1) == []


def test_host_pids_find_this_process() -> None:
    assert host_pids()[_me()] == os.getpid()
