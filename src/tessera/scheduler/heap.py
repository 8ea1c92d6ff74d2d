"""Keep the cyclic garbage collector's passes off the extender's long-lived state.

A full (generation 2) collection walks every object the collector tracks. At 5,000
nodes the extender's state alone is ~125,000 of them, and a full pass stalls every
request in flight for ~70 ms (docs/benchmarks.md) -- a filter that meets one answers
in 70 ms instead of 2. 200,000 pods add 3 million, and a pass over them takes a second.

So each list runs inside ``listing()``: a pass first, over what is not frozen (little:
the state of the lists before is), then the collector paused while the list is decoded
and booked. A list makes millions of objects in no cycle; the passes they would set off
cost a list of 50,000 pods 40 % of its time and every verb in flight a wait of up to a
second. After each list, with ``SchedulerConfig.freeze_heap``, what it made is moved to
the permanent generation (``freeze_listed``, still inside the pause) without a pass: later
passes walk only what came after. An object frozen and later dropped is still freed by
reference counting; only one caught in a reference cycle would stay, and a list makes
none (a 200,000-pod list: 0 unreachable objects; nor do filters and binds served
meanwhile: 0 after 2,000 filters, 0 after 500 binds).

The GPU map's build pauses the collector too (``collector_paused``): its objects form
no cycles either.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Iterator

__all__ = ["collector_paused", "freeze_listed", "freeze_long_lived", "listing"]

log = logging.getLogger(__name__)


def freeze_long_lived() -> None:
    """Collect what is garbage now, then freeze every survivor (``gc.get_freeze_count``
    says how many objects are frozen, these and any frozen before). A pass over the
    whole heap: for a world built once (the benchmarks'), not after each list."""
    start = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info(
        "heap: %d objects frozen out of full GC passes (%.0f ms)",
        gc.get_freeze_count(),
        (time.perf_counter() - start) * 1000,
    )


def freeze_listed() -> None:
    """Freeze what the list just made, with no pass: ``listing()`` collected before it.
    Not counted: ``gc.get_freeze_count`` walks every frozen object (230 ms holding the
    interpreter at 200,000 pods), where the freeze itself is a splice of lists."""
    gc.freeze()
    log.info("heap: what the list made is frozen out of the collector's passes")


@contextlib.contextmanager
def listing() -> Iterator[None]:
    """Where a list runs: garbage collected first (a pass over what is not frozen), then
    the collector paused until the list is booked and frozen. With another list (or the
    GPU map's build) under way, no pass: it would walk the millions of objects that one
    is making (lists come together after an API server restart)."""
    if not _PAUSES.any():
        gc.collect()
    with collector_paused():
        yield


class _Pauses:
    """Pauses of the collector from several threads at once: it resumes when the last
    ends, and only if it was running when the first began."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._depth = 0
        self._resume = False

    def any(self) -> bool:
        with self._mu:
            return self._depth > 0

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


_PAUSES = _Pauses()
collector_paused = _PAUSES.paused
