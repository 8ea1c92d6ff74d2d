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
from tessera.node.ports import DiscoveryError, XidEvent

MIB = 1024 * 1024


class StubNvml:
    """A stub of the ``pynvml`` module (nvidia-ml-py) for a fake 4-card node."""

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
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

    def __init__(self) -> None:
        self.uuids = [f"GPU-0000000{i}-0000-4000-8000-00000000000{i}" for i in range(4)]
        self.lost: set[int] = set()
        self.events: list[Any] = []
        self.registered: list[int] = []
        self.inited = False

    def nvmlInit(self) -> None:
        self.inited = True

    def nvmlShutdown(self) -> None:
        self.inited = False

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return SimpleNamespace(i=i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text not in self.uuids:
            raise self.NVMLError(6)
        return SimpleNamespace(i=self.uuids.index(text))

    def nvmlDeviceGetUUID(self, h: Any) -> bytes:
        return self.uuids[h.i].encode()  # old bindings return bytes

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return h.i

    def nvmlDeviceGetName(self, h: Any) -> str:
        return "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        if h.i in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(total=81920 * MIB, free=0, used=0)

    def nvmlDeviceGetAttributes(self, h: Any) -> Any:
        if h.i == 3:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=108)

    def nvmlDeviceGetNumaNodeId(self, h: Any) -> int:
        if h.i >= 2:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)  # old driver: use sysfs
        return 0

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=f"00000000:{0x3B + h.i:02X}:00.0".encode())

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, index: int) -> int:
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        linked = {(0, 1), (2, 3)}
        pair = (min(a.i, b.i), max(a.i, b.i))
        return self.NVML_P2P_STATUS_OK if pair in linked else self.NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetMigMode(self, h: Any) -> tuple[int, int]:
        on = self.NVML_DEVICE_MIG_ENABLE if h.i == 2 else self.NVML_DEVICE_MIG_DISABLE
        return (on, on)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        if h.i in self.lost:
            raise self.NVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, es: str) -> None:
        if h.i == 3:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(h.i)

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> Any:
        if not self.events:
            raise self.NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, es: str) -> None:
        pass


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
    assert c3.sm_count == 0  # not supported: unknown, not a failure
    assert [c.numa_node for c in facts.cards] == [0, 0, 1, -1]  # sysfs fallback for 2, 3
    assert (c0.nvlink_peers, c1.nvlink_peers, c2.nvlink_peers) == ((1,), (0,), (3,))
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


def test_xid_events_and_probe() -> None:
    stub = StubNvml()
    d = NvmlDiscovery(stub)
    d.facts()
    assert d.wait_events(0.01) == []
    assert stub.registered == [0, 1, 2]  # card 3 cannot report XIDs: probe only
    stub.events = [
        SimpleNamespace(eventType=8, eventData=79, device=SimpleNamespace(i=1)),
        SimpleNamespace(eventType=8, eventData=48, device=SimpleNamespace(i=0)),
    ]
    assert d.wait_events(1) == [XidEvent(stub.uuids[1], 79), XidEvent(stub.uuids[0], 48)]
    assert d.probe(stub.uuids[1])
    assert d.utilization(stub.uuids[1]) == 37.0
    stub.lost.add(1)
    assert not d.probe(stub.uuids[1])
    assert d.utilization(stub.uuids[1]) is None
    assert not d.probe("GPU-not-here")
    d.close()
    assert not stub.inited


def test_init_failure_is_a_discovery_error() -> None:
    stub = StubNvml()

    def fail() -> None:
        raise stub.NVMLError(9)  # driver not loaded

    stub.nvmlInit = fail  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError, match="nvmlInit"):
        NvmlDiscovery(stub)


def test_names() -> None:
    assert model_name("Tesla T4") == "T4"
    assert model_name("NVIDIA H100 80GB HBM3") == "H100 80GB HBM3"
    assert sysfs_pci_address("00000000:3B:00.0") == "0000:3b:00.0"
