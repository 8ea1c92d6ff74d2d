"""Keep the cyclic garbage collector's full passes off the extender's long-lived state.

A full (generation 2) collection walks every object the collector tracks. At 5,000
nodes the extender's state alone is ~125,000 of them, and a full pass stalls every
request in flight for ~70 ms (docs/benchmarks.md) -- a filter that meets one answers
in 70 ms instead of 2. The state read by a list lives until the next re-list, so after
the first lists and after every re-list (``SchedulerConfig.freeze_heap``) the
survivors are moved to the permanent generation (``gc.freeze``): later full passes
walk only what came after. An object frozen and later dropped is still freed by
reference counting; only one caught in a reference cycle would stay.
"""

from __future__ import annotations

import gc
import logging
import time

__all__ = ["freeze_long_lived"]

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
