"""The burst-share coordinator's view of this node: one tenant per live allocation.

The node agent hosts ``coordinator.Coordinator`` (the libvgpu issue's) and gives it, every
tick, the containers it has allocated: their limits (read from the limits file it wrote,
re-read only when the file changes, e.g. corrected at PreStartContainer) and the host
paths of their usage region and allowance file. The coordinator reads each region once
per tick and skips (with a warning) a tenant whose region does not decode, so one
container cannot stop the coordinator for the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from tessera.errors import FormatError
from tessera.node.burst.coordinator import Coordinator, Tenant
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.formats.limits import Limits, decode_limits

__all__ = ["AllocationTenants", "CoordinatorHost"]

log = logging.getLogger(__name__)


class AllocationTenants:
    def __init__(self, layout: Layout, allocations: Callable[[], list[AllocRecord]]) -> None:
        self.layout = layout
        self.allocations = allocations
        self._limits: dict[str, tuple[int, Limits]] = {}  # alloc id -> (mtime ns, limits)

    def _read_limits(self, alloc_id: str) -> Limits | None:
        path = self.layout.alloc_dir(alloc_id) / "etc" / "limits"
        try:
            mtime = path.stat().st_mtime_ns
            cached = self._limits.get(alloc_id)
            if cached is not None and cached[0] == mtime:
                return cached[1]
            limits = decode_limits(path.read_text())
        except (OSError, FormatError):
            return None
        self._limits[alloc_id] = (mtime, limits)
        return limits

    def __call__(self) -> Iterable[Tenant]:
        out: list[Tenant] = []
        records = self.allocations()
        for rec in records:
            d = self.layout.alloc_dir(rec.alloc_id)
            limits = self._read_limits(rec.alloc_id)
            if limits is None:
                continue
            region = d / "usage" / "region"
            out.append(Tenant(rec.alloc_id, limits, region, d / "allowance" / "allowance"))
        for gone in set(self._limits) - {r.alloc_id for r in records}:
            self._limits.pop(gone, None)
        return out


class CoordinatorHost:
    """Runs the coordinator's ticks on a thread; an error ends one tick, not the loop."""

    def __init__(
        self,
        tenants: Callable[[], Iterable[Tenant]],
        period_s: float = 0.1,
        card_busy: Callable[[str], float | None] | None = None,
    ) -> None:
        # card_busy: the card's real utilisation (NVML), which the coordinator uses to
        # correct for tenants' overlapping measurement windows.
        self.coordinator = Coordinator(tenants, card_busy=card_busy)
        self.period_s = period_s
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="coordinator", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.coordinator.tick()
                self.ticks += 1
            except Exception:
                log.exception("burst-share coordinator tick")
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
