"""Replay with departures on traces small enough to work out by hand."""

from __future__ import annotations

import pytest

from tessera.errors import SpecError
from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.simulate.departures import Lifetime, parse_lifetimes, replay_departures
from tessera.simulate.trace import TraceTask

ONE_CARD = [NodeInventory("n", make_cards("n", 1, "A100"), 64_000, 262_144)]


def task(name: str, milli: int) -> TraceTask:
    return TraceTask(name, cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=milli)


@pytest.mark.parametrize("policy", ["binpack", "fragmentation", "best-fit"])
def test_waiting_tasks_take_the_card_when_it_frees_and_run_their_lifetime(policy: str) -> None:
    tasks = [task("a", 1000), task("b", 1000), task("c", 500)]
    lifetimes = {"a": Lifetime(0, 10), "b": Lifetime(2, 6), "c": Lifetime(3)}
    r = replay_departures(ONE_CARD, tasks, lifetimes, policy)
    # a runs 0-10; b waits 2-10, runs its 4 s 10-14; c waits 3-14, then stays.
    assert r.waits == (0, 8, 11)
    assert (r.start, r.end, r.placed_tasks, r.never_placed) == (0, 14, 3, 0)
    assert r.allocated_milli_seconds == 1000 * 14 and r.time_weighted_allocation == 1.0
    assert r.waiting_task_seconds == 1 * 1 + 2 * 7 + 1 * 4 and r.peak_waiting == 2
    assert r.mean_waiting == pytest.approx(19 / 14)


def test_a_card_freed_at_an_instant_is_free_for_an_arrival_at_that_instant() -> None:
    tasks = [task("a", 1000), task("b", 1000)]
    r = replay_departures(ONE_CARD, tasks, {"a": Lifetime(0, 5), "b": Lifetime(5, 9)}, "binpack")
    assert r.waits == (0, 0) and r.peak_waiting == 0 and r.end == 9
    assert r.allocated_milli_seconds == 1000 * 9


def test_a_waiting_task_does_not_block_a_later_one_that_fits() -> None:
    tasks = [task("a", 600), task("big", 1000), task("small", 300)]
    lifetimes = {"a": Lifetime(0, 10), "big": Lifetime(1, 2), "small": Lifetime(2, 4)}
    r = replay_departures(ONE_CARD, tasks, lifetimes, "binpack")
    # small fits beside a at once; big waits until both have left (a at 10).
    assert r.waits == (0, 0, 9)
    # a 600 x 10 + small 300 x 2 + big 1000 x 1 (10-11, its 1 s lifetime) = 7,600.
    assert r.end == 11 and r.allocated_milli_seconds == 6000 + 600 + 1000


def test_a_task_that_never_fits_is_counted_and_a_missing_deletion_never_leaves() -> None:
    tasks = [task("a", 1000), task("b", 1000)]
    r = replay_departures(ONE_CARD, tasks, {"a": Lifetime(0), "b": Lifetime(3, 4)}, "spread")
    assert (r.placed_tasks, r.never_placed, r.end) == (1, 1, 3)
    assert r.waiting_task_seconds == 0  # b arrived at the end


def test_lifetimes_read_from_the_trace_columns_and_bad_rows_are_named() -> None:
    text = ["name,creation_time,deletion_time\n", "a,0,10\n", "b,5,\n"]
    assert parse_lifetimes(text, "t.csv") == {"a": Lifetime(0, 10), "b": Lifetime(5, None)}
    with pytest.raises(SpecError, match="missing column"):
        parse_lifetimes(["name,creation_time\n", "a,0\n"], "t.csv")
    with pytest.raises(SpecError, match=r"t.csv line 2: column creation_time: must be an integer"):
        parse_lifetimes(["name,creation_time,deletion_time\n", "a,soon,3\n"], "t.csv")
    with pytest.raises(SpecError, match="no creation time"):
        replay_departures(ONE_CARD, [task("x", 500)], {}, "binpack")
