"""The burst-share coordinator's view of this node: one tenant per live allocation and
per prepared claim (the claims path writes the same files in its own folders).

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
from tessera.node.formats.layout import (
    ALLOWANCE_IN_FOLDER,
    LIMITS_IN_FOLDER,
    REGION_IN_FOLDER,
    AllocRecord,
    Layout,
)
from tessera.node.formats.limits import LimitsFiles

__all__ = ["AllocationTenants", "CoordinatorHost"]

log = logging.getLogger(__name__)


class AllocationTenants:
    def __init__(
        self,
        layout: Layout,
        allocations: Callable[[], list[AllocRecord]],
        claims: Callable[[], list[str]] = list,
    ) -> None:
        self.layout = layout
        self.allocations = allocations
        self.claims = claims  # UIDs of the prepared claims
        self._limits = LimitsFiles()

    def __call__(self) -> Iterable[Tenant]:
        folders = [(r.alloc_id, self.layout.alloc_dir(r.alloc_id)) for r in self.allocations()]
        folders += [(f"claim-{uid}", self.layout.claim_dir(uid)) for uid in self.claims()]
        out: list[Tenant] = []
        for name, folder in folders:
            try:
                limits = self._limits.read(folder / LIMITS_IN_FOLDER)
            except (OSError, FormatError):
                continue
            out.append(
                Tenant(name, limits, folder / REGION_IN_FOLDER, folder / ALLOWANCE_IN_FOLDER)
            )
        self._limits.keep_only(folder / LIMITS_IN_FOLDER for _, folder in folders)
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
