"""The shortest run of quota victims: the least n that fits, found without asking
about runs much longer than the answer (scheduler/preemption_planner.py)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tessera.scheduler.preemption_planner import shortest_run


@given(st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=5001))
def test_the_least_run_that_fits_asking_little_beyond_it(k: int, needed: int) -> None:
    asked: list[int] = []

    def fits(n: int) -> bool:
        assert 1 <= n <= k, n  # only runs that exist are asked about
        asked.append(n)
        return n >= needed

    got = shortest_run(k, fits)
    assert got == (needed if needed <= k else None)
    if got is not None:
        assert max(asked) <= 2 * got  # a run of all k only when nothing shorter fits
        assert len(asked) <= 2 * math.ceil(math.log2(got)) + 2
    else:
        assert k in asked or k == 0
