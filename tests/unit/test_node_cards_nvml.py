"""NvmlDiscovery's translation of NVML answers, against a STUB of the ``pynvml`` module.

The stub below is not NVML: it is a stand-in for the functions and constants of
nvidia-ml-py that ``NvmlDiscovery`` calls, returning what the real binding returns
(values, ctypes-like structs, ``NVMLError`` with ``.value``). It proves the translation
logic only; running against a real driver is a GPU check owed (docs/node-agent.md).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tessera.node.cards.nvml import NvmlDiscovery, model_name, sysfs_pci_address
from tessera.node.ports import DiscoveryError, GpuProcess, XidEvent

MIB = 1024 * 1024


class StubNvml:
    """A stub of the ``pynvml`` module (nvidia-ml-py) for a fake 4-card node.

    As strict as NVML where the code under test could go wrong: every call but
    ``nvmlInit`` is refused before it and after the last ``nvmlShutdown``
    (UNINITIALIZED; init and shutdown are counted, as NVML counts them), a handle must be
    one it gave, an index one it has, an event set one it created and has not freed,
    an event mask a number, and a wait's timeout whole milliseconds, none below 0
    (INVALID_ARGUMENT)."""

    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_UNKNOWN = 999
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0
    NVML_P2P_STATUS_NOT_SUPPORTED = 5
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_DEVICE_MIG_DISABLE = 0
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value
            super().__init__(f"NVML error {value}")

    class Handle:
        def __init__(self, i: int) -> None:
            self.i = i

    class EventSet:
        def __init__(self) -> None:
            self.freed = False

    def __init__(self) -> None:
        self.uuids = [f"GPU-0000000{i}-0000-4000-8000-00000000000{i}" for i in range(4)]
        self.totals = [81920 * MIB, 15843721216, 81920 * MIB, 81920 * MIB]  # card 1: a T4's
        self.linked = {(0, 1), (2, 3)}
        self.cuda = 12040
        self.lost: set[int] = set()
        self.events: list[Any] = []
        self.compute: dict[int, list[Any]] = {}
        self.graphics: dict[int, list[Any]] = {}
        self.registered: list[tuple[int, int]] = []  # (card, event mask)
        self.waits: list[int] = []  # each wait's timeout_ms
        self.sets: list[StubNvml.EventSet] = []
        self.p2p_asked: list[tuple[int, int]] = []
        self.frees = 0  # nvmlEventSetFree calls, good or not (a second free is a crash)
        self.inits = 0

    # --- what NVML checks ------------------------------------------------------------

    def _ready(self) -> None:
        if self.inits == 0:
            raise self.NVMLError(self.NVML_ERROR_UNINITIALIZED)

    def _card(self, h: Any) -> int:
        self._ready()
        if not isinstance(h, StubNvml.Handle) or not 0 <= h.i < len(self.uuids):
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return h.i

    def _live(self, es: Any) -> None:
        self._ready()
        if not isinstance(es, StubNvml.EventSet) or es.freed or es not in self.sets:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)

    # --- the functions --------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._ready()
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._ready()
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        self._ready()
        if not isinstance(i, int) or not 0 <= i < len(self.uuids):
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        return StubNvml.Handle(i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._ready()
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text not in self.uuids:
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return StubNvml.Handle(self.uuids.index(text))

    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        i = self._card(h)
        if i in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return self.uuids[i].encode()  # old bindings return bytes

    def nvmlDeviceGetName(self, h: Any) -> str:
        self._card(h)
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        i = self._card(h)
        if i in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(total=self.totals[i], free=0, used=0)

    def nvmlDeviceGetAttributes(self, h: Any) -> Any:
        if self._card(h) == 3:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=108)

    def nvmlDeviceGetNumaNodeId(self, h: Any) -> int:
        if self._card(h) >= 2:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)  # old driver: use sysfs
        return 0

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x3B + self._card(h):02X}:00.0".encode())

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int:
        pair = (self._card(a), self._card(b))
        if index != self.NVML_P2P_CAPS_INDEX_NVLINK or pair[0] == pair[1]:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        self.p2p_asked.append(pair)
        linked = (min(pair), max(pair)) in self.linked
        return self.NVML_P2P_STATUS_OK if linked else self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        on = self.NVML_DEVICE_MIG_ENABLE if self._card(h) == 2 else self.NVML_DEVICE_MIG_DISABLE
        return (on, on)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        if self._card(h) in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        i = self._card(h)
        if i in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return list(self.compute.get(i, []))

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        i = self._card(h)
        if i == 3:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)  # a compute-only card
        return list(self.graphics.get(i, []))

    def nvmlSystemGetDriverVersion(self) -> str:
        self._ready()
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._ready()
        return self.cuda

    def nvmlEventSetCreate(self) -> Any:
        self._ready()
        self.sets.append(StubNvml.EventSet())
        return self.sets[-1]

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, es: Any) -> None:
        i = self._card(h)
        self._live(es)
        if not isinstance(types, int):
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        if i == 3:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append((i, types))

    def nvmlEventSetWait_v2(self, es: Any, timeout_ms: int) -> Any:
        self._live(es)
        if not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT)
        self.waits.append(timeout_ms)
        if not self.events:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, es: Any) -> None:
        self.frees += 1
        self._live(es)
        es.freed = True


def _failing(stub: StubNvml, name: str) -> None:
    """``stub.name`` fails with an unknown error: for the card at index 1 when it takes
    a card (a handle or an index) first, always when it does not."""
    real = getattr(stub, name)

    def call(*args: Any) -> Any:
        first = args[0] if args else None
        card = first.i if isinstance(first, StubNvml.Handle) else first
        if not isinstance(card, int) or card == 1:
            raise stub.NVMLError(stub.NVML_ERROR_UNKNOWN)
        return real(*args)

    setattr(stub, name, call)


def _xid(card: int, xid: int) -> Any:
    return SimpleNamespace(eventType=8, eventData=xid, device=StubNvml.Handle(card))


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    for i, node in ((2, "1"), (3, "-1")):
        d = tmp_path / "bus/pci/devices" / f"0000:{0x3B + i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    return tmp_path


def test_facts_translate_every_field(sysfs: Path) -> None:
    stub = StubNvml()
    facts = NvmlDiscovery(stub, sysfs=sysfs).facts()
    assert [c.uuid for c in facts.cards] == stub.uuids
    c0, c1, c2, c3 = facts.cards
    assert (c0.index, c0.model, c0.memory_mib, c0.sm_count) == (0, "A100-SXM4-80GB", 81920, 108)
    assert [c.index for c in facts.cards] == [0, 1, 2, 3]
    assert c1.memory_mib == 15109 and isinstance(c1.memory_mib, int)  # 15109.75 MiB, floored
    assert c3.sm_count == 0  # not supported: unknown, not a failure
    assert [c.numa_node for c in facts.cards] == [0, 0, 1, -1]  # sysfs fallback for 2, 3
    assert (c0.nvlink_peers, c1.nvlink_peers, c2.nvlink_peers) == ((1,), (0,), (3,))
    assert stub.p2p_asked == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]  # each pair once
    assert facts.mig_enabled == frozenset({stub.uuids[2]})
    assert (facts.driver_version, facts.cuda_version) == ("550.54.15", "12.4")


class _OlderNode(StubNvml):
    """A node whose NUMA nodes come from sysfs or nowhere, with MIG only pending on card
    2 (enabled, not yet active: a reset away), and no CUDA version to report."""

    def nvmlDeviceGetNumaNodeId(self, h: Any) -> int:
        raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        if h.i == 3:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return super().nvmlDeviceGetPciInfo(h)

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        pending = self.NVML_DEVICE_MIG_ENABLE if h.i == 2 else self.NVML_DEVICE_MIG_DISABLE
        return (self.NVML_DEVICE_MIG_DISABLE, pending)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)


def test_numa_from_sysfs_or_unknown_and_mig_only_once_active(tmp_path: Path) -> None:
    # Card 0: sysfs says node 0; card 1: no numa_node file; card 2: "-1"; card 3: no PCI.
    for i, node in ((0, "0"), (2, "-1")):
        d = tmp_path / "bus/pci/devices" / f"0000:{0x3B + i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(node + "\n")
    facts = NvmlDiscovery(_OlderNode(), sysfs=tmp_path).facts()
    assert [c.numa_node for c in facts.cards] == [0, -1, -1, -1]
    assert facts.mig_enabled == frozenset()  # shared until MIG is on, not once it is asked
    assert facts.cuda_version == ""


def test_xid_events_registered_once_waited_for_and_drained() -> None:
    stub = StubNvml()
    d = NvmlDiscovery(stub)
    assert d.wait_events(0.25) == []  # before facts(): the cards are found first
    xid = stub.nvmlEventTypeXidCriticalError
    assert stub.registered == [(0, xid), (1, xid), (2, xid)]  # card 3: the probe only
    stub.lost.add(2)  # its UUID no longer reads: its event names no card
    stub.events = [_xid(1, 79), _xid(2, 31), _xid(0, 48)]
    assert d.wait_events(1.5) == [XidEvent(stub.uuids[1], 79), XidEvent(stub.uuids[0], 48)]
    assert d.wait_events(-1) == []
    # The first wait of a call waits; those after it only drain what is queued.
    assert stub.waits == [250, 1500, 0, 0, 0, 0]
    assert len(stub.sets) == 1  # one event set for the discovery's life
    d.close()
    assert stub.sets[0].freed and stub.inits == 0
    d.close()  # again: nothing left to free, NVML already shut down; quiet
    assert stub.frees == 1


def test_close_shuts_nvml_down_when_the_event_set_no_longer_frees() -> None:
    stub = StubNvml()
    d = NvmlDiscovery(stub)
    d.wait_events(0)

    def gone(es: Any) -> None:
        raise stub.NVMLError(stub.NVML_ERROR_GPU_IS_LOST)

    stub.nvmlEventSetFree = gone  # type: ignore[method-assign]
    d.close()
    assert stub.inits == 0


def test_probe_and_utilization_answer_for_a_card_and_not_for_a_lost_one() -> None:
    stub = StubNvml()
    d = NvmlDiscovery(stub)
    assert d.probe(stub.uuids[1])
    assert d.utilization(stub.uuids[1]) == 37.0
    stub.lost.add(1)
    assert not d.probe(stub.uuids[1])
    assert d.utilization(stub.uuids[1]) is None
    assert not d.probe("GPU-not-here")
    assert d.utilization("GPU-not-here") is None


def test_processes_one_per_pid_at_its_largest_figure_and_none_unknown() -> None:
    stub = StubNvml()
    d = NvmlDiscovery(stub)

    def proc(pid: int, used: int | None) -> Any:
        return SimpleNamespace(pid=pid, usedGpuMemory=used)

    # 41 and 46 hold a compute and a graphics context each (listed twice by NVML,
    # the same figure or not); 42's figure NVML cannot tell (None); 40 is compute only,
    # 43 graphics only; 45 holds a context and no memory.
    stub.compute = {
        0: [proc(40, 2 * MIB), proc(41, 100 * MIB), proc(42, None), proc(46, 300 * MIB)],
        1: [proc(45, 0)],
        3: [proc(44, 7 * MIB)],
    }
    stub.graphics = {0: [proc(41, 300 * MIB), proc(43, 5 * MIB), proc(46, 100 * MIB)]}
    assert sorted(d.processes(stub.uuids[0]), key=lambda p: p.pid) == [
        GpuProcess(40, 2 * MIB),
        GpuProcess(41, 300 * MIB),
        GpuProcess(43, 5 * MIB),
        GpuProcess(46, 300 * MIB),
    ]
    assert d.processes(stub.uuids[3]) == [GpuProcess(44, 7 * MIB)]  # graphics not supported
    assert d.processes(stub.uuids[1]) == [GpuProcess(45, 0)]
    assert d.processes(stub.uuids[2]) == []
    stub.lost.add(0)
    assert d.processes(stub.uuids[0]) == []
    assert d.processes("GPU-not-here") == []


class _Relinked(StubNvml):
    """NVLink between 0 and 3 and between 1 and 2; the status of 0 and 1 does not read."""

    def __init__(self) -> None:
        super().__init__()
        self.linked = {(0, 3), (1, 2)}

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int:
        if {a.i, b.i} == {0, 1}:
            raise self.NVMLError(self.NVML_ERROR_UNKNOWN)
        return super().nvmlDeviceGetP2PStatus(a, b, index)


def test_a_pair_whose_link_does_not_read_is_skipped_not_the_rest_of_its_row(sysfs: Path) -> None:
    facts = NvmlDiscovery(_Relinked(), sysfs=sysfs).facts()
    assert [c.nvlink_peers for c in facts.cards] == [(3,), (2,), (1,), (0,)]


class _OldBinding(StubNvml):
    """A binding (or driver) from before the optional functions: they are not there."""

    MISSING = frozenset({
        "nvmlDeviceGetAttributes", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMigMode", "nvmlDeviceGetP2PStatus", "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion",
    })  # fmt: skip

    def __getattribute__(self, name: str) -> Any:
        if name in _OldBinding.MISSING:
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_an_old_binding_without_the_optional_functions_gives_unknowns() -> None:
    facts = NvmlDiscovery(_OldBinding()).facts()
    assert [(c.sm_count, c.numa_node, c.nvlink_peers) for c in facts.cards] == [(0, -1, ())] * 4
    assert (facts.driver_version, facts.cuda_version, facts.mig_enabled) == ("", "", frozenset())


@pytest.mark.parametrize(
    ("cuda", "version"), [(12040, "12.4"), (11080, "11.8"), (12010, "12.1"), (13000, "13.0")]
)
def test_the_cuda_version_is_major_dot_minor(cuda: int, version: str) -> None:
    stub = StubNvml()
    stub.cuda = cuda
    assert NvmlDiscovery(stub).facts().cuda_version == version


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("nvmlDeviceGetCount", "nvmlDeviceGetCount: NVML error 999"),
        ("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex(1): NVML error 999"),
        ("nvmlDeviceGetUUID", "nvmlDeviceGetUUID (card at NVML index 1): NVML error 999"),
        ("nvmlDeviceGetName", "nvmlDeviceGetName (card at NVML index 1): NVML error 999"),
        (
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetMemoryInfo (card at NVML index 1): NVML error 999",
        ),
        (
            "nvmlDeviceGetAttributes",
            "nvmlDeviceGetAttributes (card at NVML index 1): NVML error 999",
        ),
        ("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode (card at NVML index 1): NVML error 999"),
        (
            "nvmlDeviceGetNumaNodeId",
            "nvmlDeviceGetNumaNodeId (card at NVML index 1): NVML error 999",
        ),
        ("nvmlSystemGetDriverVersion", "nvmlSystemGetDriverVersion: NVML error 999"),
    ],
)
def test_a_call_that_fails_is_named_with_its_card(call: str, message: str, sysfs: Path) -> None:
    stub = StubNvml()
    _failing(stub, call)
    with pytest.raises(DiscoveryError) as caught:
        NvmlDiscovery(stub, sysfs=sysfs).facts()
    assert str(caught.value) == message


def test_a_numa_node_read_from_sysfs_fails_with_its_card_named(sysfs: Path) -> None:
    stub = StubNvml()
    stub.nvmlDeviceGetNumaNodeId = _OlderNode.nvmlDeviceGetNumaNodeId.__get__(stub)  # type: ignore[method-assign]
    _failing(stub, "nvmlDeviceGetPciInfo")
    with pytest.raises(DiscoveryError) as caught:
        NvmlDiscovery(stub, sysfs=sysfs).facts()
    assert str(caught.value) == "nvmlDeviceGetPciInfo (card at NVML index 1): NVML error 999"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("nvmlEventSetCreate", "nvmlEventSetCreate: NVML error 999"),
        (
            "nvmlDeviceRegisterEvents",
            "nvmlDeviceRegisterEvents (GPU-00000001-0000-4000-8000-000000000001): NVML error 999",
        ),
        ("nvmlEventSetWait_v2", "nvmlEventSetWait_v2: NVML error 999"),
    ],
)
def test_an_event_call_that_fails_is_named(call: str, message: str) -> None:
    stub = StubNvml()
    d = NvmlDiscovery(stub)
    d.facts()
    _failing(stub, call)
    with pytest.raises(DiscoveryError) as caught:
        d.wait_events(0.1)
    assert str(caught.value) == message


def test_init_failure_is_a_discovery_error() -> None:
    stub = StubNvml()

    def fail() -> None:
        raise stub.NVMLError(9)  # driver not loaded

    stub.nvmlInit = fail  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError) as caught:
        NvmlDiscovery(stub)
    assert str(caught.value) == "nvmlInit: NVML error 9 (is the NVIDIA driver loaded?)"


def test_names() -> None:
    assert model_name("Tesla T4") == "T4"
    assert model_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
    assert model_name("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert model_name("GeForce GTX 1080 Ti") == "GTX 1080 Ti"
    assert sysfs_pci_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_pci_address("0000000A:3B:00.0") == "000a:3b:00.0"  # the domain is hex
    assert sysfs_pci_address("00000010:3B:00.0") == "0010:3b:00.0"
