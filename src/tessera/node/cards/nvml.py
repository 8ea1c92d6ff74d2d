"""The NVML discovery backend (nvidia-ml-py), for GPU nodes.

Every NVML call goes through ``self._nvml``, the ``pynvml`` module by default, so the
translation from NVML's answers to ``Card``s is tested on a machine without a GPU with a
stub of that module's functions (tests/unit/test_node_cards_nvml.py). Real NVML is a
GPU check owed (docs/node-agent.md).

What is read, per card: UUID, name (model), total memory, multiprocessor count, NUMA
node, NVLink peers, MIG mode; per node: driver and CUDA versions. A card's index is its
place in NVML's enumeration (what ``nvmlDeviceGetIndex`` would answer for it). Calls that a
driver or card does not support (``NVML_ERROR_NOT_SUPPORTED``, an old driver without the
function) degrade to "unknown" (0, -1, no peers) instead of failing discovery; anything
else is a ``DiscoveryError`` naming the call and the card.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import ModuleType
from typing import Any

from tessera.model.types import Card
from tessera.node.ports import DiscoveryError, GpuProcess, NodeFacts, XidEvent

__all__ = ["NvmlDiscovery", "model_name", "sysfs_pci_address"]

_MIB = 1024 * 1024


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str since 11.515; older ones return bytes.
    return value.decode() if isinstance(value, bytes) else value


def model_name(nvml_name: str) -> str:
    """The model as the inventory names it: NVML's name without the vendor prefix.

    ``"NVIDIA A100-SXM4-80GB"`` -> ``"A100-SXM4-80GB"``; ``"Tesla T4"`` -> ``"T4"``.
    """
    name = nvml_name.strip()
    for prefix in ("NVIDIA ", "Tesla ", "GeForce "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.strip()


def sysfs_pci_address(bus_id: str) -> str:
    """NVML's bus id (``00000000:3B:00.0``) as sysfs names it (``0000:3b:00.0``)."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"


class NvmlDiscovery:
    def __init__(self, nvml: ModuleType | Any = None, sysfs: str | Path = "/sys") -> None:
        if nvml is None:
            import pynvml  # nvidia-ml-py; imported only on GPU nodes

            nvml = pynvml
        self._nvml = nvml
        self._sysfs = Path(sysfs)
        self._events: Any = None
        self._handles: dict[str, Any] = {}
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"nvmlInit: {exc} (is the NVIDIA driver loaded?)") from exc

    # --- helpers -------------------------------------------------------------------

    def _code(self, exc: BaseException) -> int | None:
        return getattr(exc, "value", None)

    def _unsupported(self, exc: BaseException) -> bool:
        n = self._nvml
        return self._code(exc) in (
            n.NVML_ERROR_NOT_SUPPORTED,
            n.NVML_ERROR_FUNCTION_NOT_FOUND,
        )

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise DiscoveryError(f"{what}: {exc}") from exc

    def _optional(self, fn_name: str, default: Any, *args: Any, where: str = "") -> Any:
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            return default
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if self._unsupported(exc):
                return default
            of = f" ({where})" if where else ""
            raise DiscoveryError(f"{fn_name}{of}: {exc}") from exc

    # --- facts ---------------------------------------------------------------------

    def _numa(self, handle: Any, where: str) -> int:
        node = self._optional("nvmlDeviceGetNumaNodeId", None, handle, where=where)
        if node is not None and node >= 0:
            return int(node)
        # Older drivers: the PCI device's numa_node in sysfs (-1 on single-socket hosts).
        pci = self._optional("nvmlDeviceGetPciInfo", None, handle, where=where)
        if pci is None:
            return -1
        path = self._sysfs / "bus/pci/devices" / sysfs_pci_address(_text(pci.busId)) / "numa_node"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return -1

    def facts(self) -> NodeFacts:
        n = self._nvml
        count = self._call("nvmlDeviceGetCount", n.nvmlDeviceGetCount)
        handles: list[tuple[int, Any]] = []
        cards: list[Card] = []
        mig: set[str] = set()
        for i in range(count):
            where = f"card at NVML index {i}"
            h = self._call(f"nvmlDeviceGetHandleByIndex({i})", n.nvmlDeviceGetHandleByIndex, i)
            uuid = _text(self._call(f"nvmlDeviceGetUUID ({where})", n.nvmlDeviceGetUUID, h))
            name = _text(self._call(f"nvmlDeviceGetName ({where})", n.nvmlDeviceGetName, h))
            mem = self._call(f"nvmlDeviceGetMemoryInfo ({where})", n.nvmlDeviceGetMemoryInfo, h)
            attrs = self._optional("nvmlDeviceGetAttributes", None, h, where=where)
            sm = int(attrs.multiprocessorCount) if attrs is not None else 0
            mode = self._optional("nvmlDeviceGetMigMode", None, h, where=where)
            if mode is not None and mode[0] == n.NVML_DEVICE_MIG_ENABLE:
                mig.add(uuid)
            handles.append((i, h))
            self._handles[uuid] = h
            cards.append(
                Card(
                    uuid=uuid,
                    index=i,
                    model=model_name(name),
                    memory_mib=int(mem.total) // _MIB,
                    sm_count=sm,
                    numa_node=self._numa(h, where),
                )
            )
        peers = self._nvlink_peers(handles)
        cards = [
            Card(
                uuid=c.uuid,
                index=c.index,
                model=c.model,
                memory_mib=c.memory_mib,
                sm_count=c.sm_count,
                numa_node=c.numa_node,
                nvlink_peers=tuple(sorted(peers.get(c.index, ()))),
            )
            for c in cards
        ]
        driver = _text(self._optional("nvmlSystemGetDriverVersion", ""))
        cuda = self._optional("nvmlSystemGetCudaDriverVersion", 0)
        return NodeFacts(
            cards=tuple(sorted(cards, key=lambda c: c.index)),
            driver_version=driver,
            cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "",
            mig_enabled=frozenset(mig),
        )

    def _nvlink_peers(self, handles: list[tuple[int, Any]]) -> dict[int, set[int]]:
        # P2P status over NVLink covers direct links and NVSwitch fabrics alike; reading
        # each link's remote PCI address would miss peers behind a switch.
        n = self._nvml
        peers: dict[int, set[int]] = {}
        fn = getattr(n, "nvmlDeviceGetP2PStatus", None)
        if fn is None:
            return peers
        for a, (ia, ha) in enumerate(handles):
            for ib, hb in handles[a + 1 :]:
                try:
                    status = fn(ha, hb, n.NVML_P2P_CAPS_INDEX_NVLINK)
                except n.NVMLError:
                    continue
                if status == n.NVML_P2P_STATUS_OK:
                    peers.setdefault(ia, set()).add(ib)
                    peers.setdefault(ib, set()).add(ia)
        return peers

    # --- health ----------------------------------------------------------------------

    def _event_set(self) -> Any:
        if self._events is not None:
            return self._events
        n = self._nvml
        if not self._handles:
            self.facts()
        es = self._call("nvmlEventSetCreate", n.nvmlEventSetCreate)
        for uuid, h in self._handles.items():
            try:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
            except n.NVMLError as exc:
                if not self._unsupported(exc):
                    raise DiscoveryError(f"nvmlDeviceRegisterEvents ({uuid}): {exc}") from exc
                # Cards that cannot report XIDs are watched by the probe only.
        self._events = es
        return es

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        n = self._nvml
        es = self._event_set()
        out: list[XidEvent] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = n.nvmlEventSetWait_v2(es, timeout_ms)
            except n.NVMLError as exc:
                if self._code(exc) == n.NVML_ERROR_TIMEOUT:
                    return out
                raise DiscoveryError(f"nvmlEventSetWait_v2: {exc}") from exc
            if data.eventType == n.nvmlEventTypeXidCriticalError:
                # data.device is a fresh ctypes handle; its UUID names the card.
                try:
                    uuid = _text(n.nvmlDeviceGetUUID(data.device))
                except n.NVMLError:
                    uuid = None
                if uuid is not None:
                    out.append(XidEvent(uuid, int(data.eventData)))
            timeout_ms = 0  # drain what is queued, then return

    def probe(self, uuid: str) -> bool:
        n = self._nvml
        try:
            h = n.nvmlDeviceGetHandleByUUID(uuid)
            n.nvmlDeviceGetMemoryInfo(h)
        except n.NVMLError:
            return False
        return True

    def utilization(self, uuid: str) -> float | None:
        n = self._nvml
        try:
            h = n.nvmlDeviceGetHandleByUUID(uuid)
            return float(n.nvmlDeviceGetUtilizationRates(h).gpu)
        except n.NVMLError:
            return None

    def processes(self, uuid: str) -> list[GpuProcess]:
        # Compute and graphics contexts both hold device memory; a process with both is
        # listed twice by NVML with the same figure, so keep one entry per pid. The pids
        # are the host's when the agent runs in the host's pid namespace (hostPID).
        n = self._nvml
        try:
            h = n.nvmlDeviceGetHandleByUUID(uuid)
            listed = list(n.nvmlDeviceGetComputeRunningProcesses(h))
            with contextlib.suppress(n.NVMLError):
                listed += list(n.nvmlDeviceGetGraphicsRunningProcesses(h))
        except n.NVMLError:
            return []
        seen: dict[int, int] = {}
        for p in listed:
            used = p.usedGpuMemory
            if used is not None:  # None: NVML cannot tell (e.g. under some WSL/vGPU setups)
                seen[int(p.pid)] = max(seen.get(int(p.pid), 0), int(used))
        return [GpuProcess(pid, used) for pid, used in seen.items()]

    def close(self) -> None:
        n = self._nvml
        if self._events is not None:
            with contextlib.suppress(n.NVMLError):
                n.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(n.NVMLError):  # shut down already, or the driver gone
            n.nvmlShutdown()
