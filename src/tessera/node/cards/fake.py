"""The fake discovery backend: cards from the node CSV, faults injected by tests or files.

The node is the CSV row whose ``sn`` is the agent's node name (``clusterspec``), so a fake
agent on a kwok node of the dev cluster sees the same cards the simulator and the
scheduler assume.

Faults, for tests (methods) and for a running fake agent (files in ``fault_dir``):

* ``inject_xid(uuid, xid)``, or a line ``<uuid> <xid>`` appended to ``fault_dir/xid``;
* ``set_probe(uuid, ok)``, or the UUID listed (one a line) in ``fault_dir/probe-fail``;
* ``set_utilization(uuid, percent)`` for what NVML would report as the card's busy time,
  or lines ``<uuid> <percent>`` in ``fault_dir/utilization`` (a method's value wins).

With ``device_dir`` the cards are also files, one per card (``<dir>/<uuid>``), which
libvgpu's fake driver in a container maps when that folder is mounted and
``FAKECUDA_DEVICE_DIR`` names it (libvgpu/fake/fake_dev.h): the agent creates each file
sized to its card, and reads back each process's device memory as NVML's
running-processes query would report it (``processes``).
"""

from __future__ import annotations

import os
import struct
import threading
import time
from pathlib import Path

from tessera.model.clusterspec import read_nodes_csv
from tessera.model.types import Card
from tessera.node.ports import DiscoveryError, GpuProcess, NodeFacts, XidEvent

__all__ = ["FakeDiscovery", "host_pids"]

# libvgpu/fake/fake_dev.h: the plain fields of a card's file, at fixed offsets.
_TOTAL_AT = 8
_PROCS_AT = 56
_PROC = struct.Struct("<iIQQQ")  # pid (in its namespace), pad, pid ns inode, start, bytes
_PROC_MAX = 64
_PID_CACHE_S = 0.5


def host_pids() -> dict[tuple[int, int, int], int]:
    """(pid namespace inode, pid in that namespace, start time) -> pid here, for every
    process. The start time (clock ticks since boot, /proc/<pid>/stat field 22) tells a
    process from an earlier one that had the same pid in a namespace with the same inode.

    /proc/<pid>/status lists a process's pid in each namespace from ours down to its own
    (NSpid); the last is the pid it sees itself as.
    """
    out: dict[tuple[int, int, int], int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{entry.name}/ns/pid").st_ino
            with open(f"/proc/{entry.name}/stat") as f:
                start = int(f.read().rsplit(")", 1)[1].split()[19])
            with open(f"/proc/{entry.name}/status") as f:
                for line in f:
                    if line.startswith("NSpid:"):
                        out[(ns, int(line.split()[-1]), start)] = int(entry.name)
                        break
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return out


class FakeDiscovery:
    def __init__(
        self,
        cards: tuple[Card, ...],
        fault_dir: str | Path | None = None,
        driver_version: str = "fake-0.0",
        cuda_version: str = "12.4",
        device_dir: str | Path | None = None,
    ) -> None:
        self._cards = tuple(cards)
        self._device_dir = Path(device_dir) if device_dir is not None else None
        self._pids: tuple[float, dict[tuple[int, int, int], int]] = (0.0, {})
        if self._device_dir is not None:
            self._make_device_files(self._device_dir)
        self._uuids = {c.uuid for c in cards}
        self._driver = driver_version
        self._cuda = cuda_version
        self._fault_dir = Path(fault_dir) if fault_dir is not None else None
        self._xid_offset = 0
        self._events: list[XidEvent] = []
        self._probe_fail: set[str] = set()
        self._busy: dict[str, float] = {}
        self._cond = threading.Condition()
        self._closed = False

    @classmethod
    def from_csv(
        cls,
        path: str | Path,
        node: str,
        fault_dir: str | Path | None = None,
        device_dir: str | Path | None = None,
    ) -> FakeDiscovery:
        """The cards of row ``node`` in the node CSV at ``path``."""
        for inv in read_nodes_csv(path):
            if inv.name == node:
                return cls(inv.cards, fault_dir=fault_dir, device_dir=device_dir)
        raise DiscoveryError(f"node {node!r} is not in {Path(path).name} (column sn)")

    # --- injection ---------------------------------------------------------------

    def inject_xid(self, uuid: str, xid: int) -> None:
        self._check(uuid)
        with self._cond:
            self._events.append(XidEvent(uuid, xid))
            self._cond.notify_all()

    def set_probe(self, uuid: str, ok: bool) -> None:
        self._check(uuid)
        with self._cond:
            if ok:
                self._probe_fail.discard(uuid)
            else:
                self._probe_fail.add(uuid)

    def set_utilization(self, uuid: str, percent: float | None) -> None:
        self._check(uuid)
        with self._cond:
            if percent is None:
                self._busy.pop(uuid, None)
            else:
                self._busy[uuid] = percent

    def _check(self, uuid: str) -> None:
        if uuid not in self._uuids:
            raise DiscoveryError(f"no card {uuid} on this fake node")

    # --- Discovery ---------------------------------------------------------------

    def facts(self) -> NodeFacts:
        return NodeFacts(cards=self._cards, driver_version=self._driver, cuda_version=self._cuda)

    def wait_events(self, timeout_s: float) -> list[XidEvent]:
        with self._cond:
            self._read_xid_file()
            if not self._events and not self._closed:
                # A file writer does not notify; wake at least every 100 ms to read it.
                self._cond.wait(timeout=min(timeout_s, 0.1) if self._fault_dir else timeout_s)
                self._read_xid_file()
            out, self._events = self._events, []
            return out

    def probe(self, uuid: str) -> bool:
        if uuid not in self._uuids:
            return False
        with self._cond:
            if uuid in self._probe_fail:
                return False
        if self._fault_dir is not None:
            try:
                listed = (self._fault_dir / "probe-fail").read_text().split()
            except FileNotFoundError:
                listed = []
            return uuid not in listed
        return True

    def utilization(self, uuid: str) -> float | None:
        with self._cond:
            if uuid in self._busy:
                return self._busy[uuid]
        if self._fault_dir is None:
            return None
        try:
            lines = (self._fault_dir / "utilization").read_text().splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0] == uuid:
                try:
                    return float(parts[1])
                except ValueError:
                    return None  # a typo in a fixture: unknown, as NVML would say
        return None

    def processes(self, uuid: str) -> list[GpuProcess]:
        if self._device_dir is None or uuid not in self._uuids:
            return []
        try:
            data = (self._device_dir / uuid).read_bytes()[: _PROCS_AT + _PROC_MAX * _PROC.size]
        except OSError:
            return []
        now = time.monotonic()
        if now - self._pids[0] > _PID_CACHE_S:
            self._pids = (now, host_pids())
        pids = self._pids[1]
        out = []
        for k in range(_PROC_MAX):
            at = _PROCS_AT + k * _PROC.size
            if at + _PROC.size > len(data):
                break
            pid, _, pidns, start, used = _PROC.unpack_from(data, at)
            host = pids.get((pidns, pid, start))
            if used > 0 and host is not None:  # a process the driver lists is alive
                out.append(GpuProcess(host, used))
        return out

    def _make_device_files(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for c in self._cards:
            path = folder / c.uuid
            if path.exists():
                continue
            header = bytearray(_PROCS_AT + _PROC_MAX * _PROC.size)
            struct.pack_into("<Q", header, _TOTAL_AT, c.memory_mib << 20)
            tmp = folder / f".{c.uuid}.tmp"
            tmp.write_bytes(bytes(header))
            tmp.chmod(0o666)
            os.replace(tmp, path)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _read_xid_file(self) -> None:
        # Called with the condition held. Lines with an unknown UUID or a bad number are
        # skipped: a typo in a test fixture must not take the agent down.
        if self._fault_dir is None:
            return
        path = self._fault_dir / "xid"
        try:
            with path.open("rb") as f:
                f.seek(self._xid_offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # only whole lines
        self._xid_offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in self._uuids and parts[1].isdigit():
                self._events.append(XidEvent(parts[0], int(parts[1])))
