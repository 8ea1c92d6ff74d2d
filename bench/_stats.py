"""Order statistics the benchmarks print, and a lock that times how long it is held."""

from __future__ import annotations

import time
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``: the nearest rank, no interpolation."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


class HoldTimer:
    """The state's lock, timing how long each outermost hold lasts (what a verb waits)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.depth, self.since, self.longest = inner, 0, 0.0, 0.0

    def __enter__(self) -> None:
        self.inner.acquire()
        self.depth += 1
        if self.depth == 1:
            self.since = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        if self.depth == 0:
            self.longest = max(self.longest, time.perf_counter() - self.since)
        self.inner.release()
