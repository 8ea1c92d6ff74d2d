"""Keep the cyclic garbage collector's full passes off the extender's long-lived state.

A full (generation 2) collection walks every object the collector tracks. At 5,000
nodes the extender's state alone is ~125,000 of them, and a full pass stalls every
request in flight for ~70 ms (docs/benchmarks.md) -- a filter that meets one answers
in 70 ms instead of 2. The state read by a list lives until the next re-list, so after
the first lists and after every re-list (``SchedulerConfig.freeze_heap``) the
survivors are moved to the permanent generation (``gc.freeze``): later full passes
walk only what came after. An object frozen and later dropped is still freed by
reference counting; only one caught in a reference cycle would stay.

While a list is decoded and booked (and while the GPU map is built) the collector is
paused (``collector_paused``): those make millions of objects in no cycle, and the
passes they would set off -- full ones over the growing heap among them -- cost a list
of 50,000 pods 40 % of its time and every verb in flight a wait of up to a second.
Reference counting frees what they drop all the same.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator

__all__ = ["collector_paused", "freeze_long_lived"]

log = logging.getLogger(__name__)


def freeze_long_lived() -> None:
    """Collect what is garbage now, then freeze every survivor (``gc.get_freeze_count``
    says how many objects are frozen, these and any frozen before)."""
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info(
        "heap: %d objects frozen out of full GC passes (%.0f ms)",
        frozen,
        (time.perf_counter() - start) * 1000,
    )


class _Pauses:
    """Pauses of the collector from several threads at once: it resumes when the last
    ends, and only if it was running when the first began."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._depth = 0
        self._resume = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._mu:
            if self._depth == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._depth += 1
        try:
            yield
        finally:
            with self._mu:
                self._depth -= 1
                if self._depth == 0 and self._resume:
                    gc.enable()


collector_paused = _Pauses().paused
