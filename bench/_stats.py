"""Order statistics the benchmarks print."""

from __future__ import annotations


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``: the nearest rank, no interpolation."""
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]
