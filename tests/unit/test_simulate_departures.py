"""Replay with departures on traces small enough to work out by hand, and against a
plain reference that retries every waiting task on the whole cluster."""

from __future__ import annotations

import dataclasses
import heapq
import random

import pytest

from tessera.cluster import ClusterState
from tessera.errors import PlacementError, SpecError
from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.placement import WorkloadMix, make_policy, place
from tessera.simulate.departures import (
    CURVE_POINTS,
    Lifetime,
    measure_window,
    parse_lifetimes,
    replay_departures,
)
from tessera.simulate.trace import TRACE_NAMESPACE, TraceTask, to_pod_request

ONE_CARD = [NodeInventory("n", make_cards("n", 1, "A100"), 64_000, 262_144)]


def task(name: str, milli: int, cards: int = 1) -> TraceTask:
    return TraceTask(name, cpu_milli=1000, memory_mib=1024, num_gpu=cards, gpu_milli=milli)


@pytest.mark.parametrize("policy", ["binpack", "fragmentation", "best-fit"])
def test_waiting_tasks_take_the_card_when_it_frees_and_run_their_lifetime(policy: str) -> None:
    tasks = [task("a", 1000), task("b", 1000), task("c", 500)]
    lifetimes = {"a": Lifetime(0, 10), "b": Lifetime(2, 6), "c": Lifetime(3)}
    r = replay_departures(ONE_CARD, tasks, lifetimes, policy)
    # a runs 0-10; b waits 2-10, runs its 4 s 10-14; c waits 3-14, then stays.
    assert r.waits == (0, 8, 11)
    assert (r.placed_tasks, r.never_placed) == (3, 0)
    # The window is the 1st to 99th percentile arrival: [0, 3] for three tasks.
    assert r.window == (0, 3) and r.span == 3
    assert r.allocated_milli_seconds == 1000 * 3 and r.time_weighted_allocation == 1.0
    # Demand adds b's 1000 waiting over [2, 3].
    assert r.demand_milli_seconds == 1000 * 3 + 1000 * 1
    assert r.time_weighted_demand == pytest.approx(4 / 3)
    assert r.waiting_task_seconds == 1 and r.peak_waiting == 2
    assert r.mean_waiting == pytest.approx(1 / 3)
    assert r.wait_quantile(0.5) == 8 and r.wait_quantile(0.99) == 11


def test_a_waiting_task_placed_inside_the_window_stops_counting_as_waiting() -> None:
    tasks = [task("a", 1000), task("b", 1000), task("c", 500)]
    lifetimes = {"a": Lifetime(0, 5), "b": Lifetime(1), "c": Lifetime(20)}
    r = replay_departures(ONE_CARD, tasks, lifetimes, "binpack")
    # Window [0, 20]: b waits over [1, 5], then holds the card; c arrives at the end.
    assert r.window == (0, 20) and r.waits == (0, 4)
    assert r.waiting_task_seconds == 4 and r.peak_waiting == 1
    assert r.demand_milli_seconds == 1000 * 20 + 1000 * 4
    assert set(r.waiting_curve[: CURVE_POINTS * 5 // 20]) == {0, 1}
    assert set(r.waiting_curve[CURVE_POINTS * 6 // 20 : -1]) == {0}


def test_the_figures_are_over_the_windows_span_and_quantiles_by_nearest_rank() -> None:
    tasks = [task("a", 1000), task("b", 1000), task("c", 500)]
    r = replay_departures(ONE_CARD, tasks, {"a": Lifetime(0, 10), "b": Lifetime(2, 6),
                                            "c": Lifetime(3)}, "binpack")  # fmt: skip
    later = dataclasses.replace(r, window=(1.0, 5.0), waits=(4.0, 1.0, 3.0, 2.0))
    assert later.span == 4
    assert later.time_weighted_allocation == pytest.approx(3000 / (1000 * 4))
    assert later.mean_waiting == pytest.approx(1 / 4)
    quantiles = [later.wait_quantile(q) for q in (0.0, 0.25, 0.26, 0.5, 0.75, 1.0)]
    assert quantiles == [1.0, 1.0, 2.0, 2.0, 3.0, 4.0]
    assert dataclasses.replace(r, waits=()).wait_quantile(0.5) == 0.0


def test_the_speedup_compresses_arrivals_but_not_lifetimes() -> None:
    tasks = [task("a", 1000), task("b", 1000)]
    lifetimes = {"a": Lifetime(0, 10), "b": Lifetime(20, 25)}
    slow = replay_departures(ONE_CARD, tasks, lifetimes, "binpack")
    assert slow.waits == (0, 0) and slow.window == (0, 20)
    fast = replay_departures(ONE_CARD, tasks, lifetimes, "binpack", speedup=4)
    # b arrives at 20 / 4 = 5 while a still runs until 10: it waits 5 s.
    assert fast.waits == (0, 5) and fast.window == (0, 5) and fast.speedup == 4
    assert fast.waiting_task_seconds == 0  # b waits after the window's last instant
    with pytest.raises(SpecError, match="speedup: must be > 0"):
        replay_departures(ONE_CARD, tasks, lifetimes, "binpack", speedup=0)


def test_a_card_freed_at_an_instant_is_free_for_an_arrival_at_that_instant() -> None:
    tasks = [task("a", 1000), task("b", 1000)]
    r = replay_departures(ONE_CARD, tasks, {"a": Lifetime(0, 5), "b": Lifetime(5, 9)}, "binpack")
    assert r.waits == (0, 0) and r.peak_waiting == 0
    assert r.allocated_milli_seconds == 1000 * 5


def test_a_waiting_task_does_not_block_a_later_one_that_fits() -> None:
    tasks = [task("a", 600), task("big", 1000), task("small", 300)]
    lifetimes = {"a": Lifetime(0, 10), "big": Lifetime(1, 2), "small": Lifetime(2, 4)}
    r = replay_departures(ONE_CARD, tasks, lifetimes, "binpack")
    # small fits beside a at once; big waits until both have left (a at 10).
    assert r.waits == (0, 0, 9)
    # Window [0, 2]: a's 600 all along, big's 1000 waiting over [1, 2].
    assert r.allocated_milli_seconds == 600 * 2
    assert r.demand_milli_seconds == 600 * 2 + 1000


def test_a_task_that_never_fits_is_counted_and_a_missing_deletion_never_leaves() -> None:
    tasks = [task("a", 1000), task("b", 1000)]
    r = replay_departures(ONE_CARD, tasks, {"a": Lifetime(0), "b": Lifetime(3, 4)}, "spread")
    assert (r.placed_tasks, r.never_placed) == (1, 1)
    assert r.waiting_task_seconds == 0  # b arrived at the window's end
    # Deleted at its creation instant (openb-pod-7285 of the default list): never leaves
    # either, as docs/simulator.md says; a duration is only one after the creation.
    assert [Lifetime(3, d).duration for d in (None, 2, 3, 4)] == [None, None, None, 1]


def test_the_window_leaves_out_the_first_and_last_percent_of_arrivals() -> None:
    assert measure_window([5.0]) == (5.0, 5.0)
    times = [float(t) for t in range(1, 201)]  # 200 arrivals: ranks 2 and 198
    assert measure_window(times) == (2.0, 198.0)
    assert measure_window(list(reversed(times))) == (2.0, 198.0)


@pytest.mark.parametrize("start", [0, 100])
def test_the_curves_sample_allocation_and_waiting_across_the_window(start: int) -> None:
    tasks = [task("a", 1000), task("b", 1000)]
    lifetimes = {"a": Lifetime(start, start + 50), "b": Lifetime(start + 100)}
    seen: list[tuple[int, int]] = []
    r = replay_departures(ONE_CARD, tasks, lifetimes, "binpack",
                          progress=lambda done, known: seen.append((done, known)))  # fmt: skip
    assert r.window == (start, start + 100)
    # Three events: a arrives (its departure is then known), a leaves, b arrives.
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert len(r.allocation_curve) == len(r.waiting_curve) == CURVE_POINTS + 1
    # a holds the card over [0, 50), none over [50, 100), b from 100.
    assert r.allocation_curve[:50] == (1.0,) * 50
    assert r.allocation_curve[50:100] == (0.0,) * 50 and r.allocation_curve[100] == 1.0
    assert set(r.waiting_curve) == {0}


def test_lifetimes_read_from_the_trace_columns_and_bad_rows_are_named() -> None:
    text = ["name,creation_time,deletion_time\n", "a,0,10\n", "b,5,\n"]
    assert parse_lifetimes(text, "t.csv") == {"a": Lifetime(0, 10), "b": Lifetime(5, None)}
    with pytest.raises(SpecError, match="missing column"):
        parse_lifetimes(["name,creation_time\n", "a,0\n"], "t.csv")
    with pytest.raises(SpecError, match=r"t.csv line 2: column creation_time: must be an integer"):
        parse_lifetimes(["name,creation_time,deletion_time\n", "a,soon,3\n"], "t.csv")
    with pytest.raises(SpecError, match="no creation time"):
        replay_departures(ONE_CARD, [task("x", 500)], {}, "binpack")


def reference_waits(
    nodes: list[NodeInventory], tasks: list[TraceTask], life: dict[str, Lifetime], policy: str
) -> list[tuple[str, float, str]]:
    """The rules without the shortcut: after a departure every waiting task is tried on
    the whole cluster, in arrival order. (task, wait, node) in placement order."""
    state, mix = ClusterState(nodes), WorkloadMix()
    chooser = make_policy(policy, mix=mix)
    events = [(float(life[t.name].created), 1, i) for i, t in enumerate(tasks)]
    heapq.heapify(events)
    waiting: list[int] = []
    out: list[tuple[str, float, str]] = []

    def attempt(i: int, now: float) -> bool:
        pod = to_pod_request(tasks[i])
        try:
            d = place(state.snapshot(), pod, chooser)
        except PlacementError:
            return False
        state.assign(pod, d.assignment)
        out.append((tasks[i].name, now - life[tasks[i].name].created, d.node))
        if (duration := life[tasks[i].name].duration) is not None:
            heapq.heappush(events, (now + duration, 0, i))
        return True

    while events:
        now, kind, i = heapq.heappop(events)
        if kind == 0:
            state.release(f"{TRACE_NAMESPACE}/{tasks[i].name}")
            waiting = [w for w in waiting if not attempt(w, now)]
        else:
            mix.observe(to_pod_request(tasks[i]))
            if not attempt(i, now):
                waiting.append(i)
    return out


@pytest.mark.parametrize("policy", ["binpack", "fragmentation", "best-fit", "spread"])
@pytest.mark.parametrize("seed", range(4))
def test_retrying_on_the_freed_node_alone_decides_as_the_whole_cluster_would(
    policy: str, seed: int
) -> None:
    rng = random.Random(seed)
    nodes = [
        NodeInventory(f"n{k}", make_cards(f"n{k}", rng.choice([1, 2, 4]), "A100"), 16_000, 65_536)
        for k in range(4)
    ]
    sizes = [200, 300, 500, 810, 1000]
    tasks, life = [], {}
    for k in range(120):
        cards = 2 if rng.random() < 0.1 else 1
        t = TraceTask(
            f"t{k}", rng.choice([500, 2000]), 1024, cards, 1000 if cards > 1 else rng.choice(sizes)
        )
        tasks.append(t)
        created = k * 3
        life[t.name] = Lifetime(created, created + rng.randint(1, 60))
    got = replay_departures(nodes, tasks, life, policy)
    want = reference_waits(nodes, tasks, life, policy)
    assert got.waits == tuple(w for _, w, _ in want)
    assert got.placed_tasks == len(want) and max(got.waits) > 0  # the trace contends


def test_copies_and_variant_copies_arrive_and_run_as_their_original() -> None:
    from dataclasses import replace

    from tessera.simulate.departures import departures_stream

    a = task("a", 500)
    tasks = [a, replace(a, name="a-shared-0")]
    stream, own = departures_stream(tasks, {"a": Lifetime(7, 19)}, 1000, 3.0, seed=1)
    assert len(stream) == 6 and any("-copy-" in t.name for t in stream)
    assert set(own.values()) == {Lifetime(7, 19)}
    with pytest.raises(SpecError) as caught:
        departures_stream([task("b", 500)], {"a": Lifetime(0)}, 1000, 1.0, seed=1)
    assert str(caught.value) == "lifetimes: no creation time for task 'b'"


def test_the_refusals_name_the_field_the_rule_and_the_value() -> None:
    def refused(**kwargs: object) -> str:
        args: dict[str, object] = {
            "nodes": ONE_CARD,
            "tasks": [task("a", 500)],
            "lifetimes": {"a": Lifetime(0)},
            "policy": "binpack",
        }
        with pytest.raises(SpecError) as caught:
            replay_departures(**{**args, **kwargs})  # type: ignore[arg-type]
        return str(caught.value)

    assert refused(speedup=0) == "speedup: must be > 0 (got 0)"
    assert refused(tasks=[]) == "tasks: must hold at least one task"
    many = [task(f"t{k}", 100) for k in range(7)]
    assert refused(tasks=many, lifetimes={"t3": Lifetime(0)}) == (
        "lifetimes: no creation time for task(s) ['t0', 't1', 't2', 't4', 't5']"
    )


def test_a_lifetimes_row_without_a_name_or_with_a_name_seen_before_is_refused() -> None:
    header = "name,creation_time,deletion_time\n"
    with pytest.raises(SpecError) as caught:
        parse_lifetimes([header, "a,0,10\n", "a,3,\n"])
    assert str(caught.value) == "tasks line 3: column name: duplicate task name (got 'a')"
    with pytest.raises(SpecError) as caught:
        parse_lifetimes([header, " ,0,10\n"], "t.csv")
    assert str(caught.value) == "t.csv line 2: column name: must not be empty"
    with pytest.raises(SpecError) as caught:
        parse_lifetimes([header, "a,3,later\n"], "t.csv")
    assert (
        str(caught.value) == "t.csv line 2: column deletion_time: must be an integer (got 'later')"
    )


def test_tasks_running_together_add_up_and_so_do_tasks_waiting_together() -> None:
    # Two halves share the card from 0; c and d (whole cards) both wait from 1 and 2.
    tasks = [task("a", 500), task("b", 500), task("c", 1000), task("d", 1000), task("e", 100)]
    lifetimes = {
        "a": Lifetime(0, 10), "b": Lifetime(0, 10), "c": Lifetime(1, 20),
        "d": Lifetime(2, 30), "e": Lifetime(4, 30),
    }  # fmt: skip
    r = replay_departures(ONE_CARD, tasks, lifetimes, "binpack")
    assert r.window == (0, 4)  # e fits beside nothing until 10, and waits too
    assert r.allocated_milli_seconds == 1000 * 4  # a and b together, the whole window
    # Waiting milli-GPU: c's 1000 over [1, 4], d's 1000 over [2, 4].
    assert r.demand_milli_seconds == 1000 * 4 + 1000 * 3 + 1000 * 2
    assert r.allocation_curve[-1] == 1.0 and r.peak_waiting == 3


def test_an_experiment_draws_its_copies_and_node_order_from_its_seed() -> None:
    from tessera.simulate.departures import departures_stream, replay_with_departures
    from tessera.simulate.metrics import gpu_capacity_milli
    from tessera.simulate.replay import node_order

    # Unlike nodes and long lifetimes: the cluster contends, and where the first tasks
    # land (the node order breaks binpack's ties) changes who waits.
    nodes = [
        NodeInventory(f"n{k}", make_cards(f"n{k}", cards, "A100"), cpu, 262_144)
        for k, (cards, cpu) in enumerate([(1, 4000), (2, 16_000), (4, 64_000), (1, 64_000)])
    ]
    tasks = [
        TraceTask(f"t{k}", [1000, 3000][k % 2], 1024, 2 if k % 7 == 0 else 1,
                  [300, 500, 1000, 700][k % 4])
        for k in range(30)
    ]  # fmt: skip
    life = {t.name: Lifetime(k, k + 20 + (k * 7) % 13) for k, t in enumerate(tasks)}
    told: list[tuple[int, int]] = []
    for seed in range(3):
        r = replay_with_departures(
            nodes, tasks, life, "binpack", seed, 2.0, 1.0, lambda d, k: told.append((d, k))
        )
        stream, own = departures_stream(tasks, life, gpu_capacity_milli(nodes), 2.0, seed)
        want = replay_departures(node_order(nodes, seed), stream, own, "binpack", seed, 1.0)
        other = replay_departures(node_order(nodes, 99), stream, own, "binpack", seed, 1.0)
        assert r.waits == want.waits != other.waits  # the order is this seed's, and it matters
        assert (r.seed, r.arrival, r.speedup, r.tasks) == (seed, 2.0, 1.0, len(stream))
    # Progress: every event counted, the last call of each experiment at (all, all).
    assert told and all(d <= k for d, k in told)
    assert sum(1 for d, k in told if d == k and d > 0) >= 3


def test_a_random_policy_takes_the_seed_it_is_given() -> None:
    nodes = [NodeInventory(f"n{k}", make_cards(f"n{k}", 1, "A100"), 64_000, 262_144)
             for k in range(2)]  # fmt: skip
    # b lands beside a or on the other card; only beside a leaves room for c.
    tasks = [task("a", 500), task("b", 500), task("c", 1000)]
    life = {"a": Lifetime(0), "b": Lifetime(1), "c": Lifetime(2)}
    placed = {replay_departures(nodes, tasks, life, "random", seed).placed_tasks
              for seed in range(12)}  # fmt: skip
    assert placed == {2, 3}


def test_copies_of_a_task_whose_own_name_has_dashes_run_as_it_did() -> None:
    from dataclasses import replace

    from tessera.simulate.departures import departures_stream

    a = task("openb-pod-0017", 500)
    tasks = [a, replace(a, name="openb-pod-0017-shared-0")]
    life = {"openb-pod-0017": Lifetime(7, 19), "openb-pod": Lifetime(1, 2)}
    stream, own = departures_stream(tasks, life, 1000, 3.0, seed=1)
    assert len(stream) == 6 and set(own.values()) == {Lifetime(7, 19)}


def test_an_experiment_reports_its_own_duration() -> None:
    import time

    began, began_cpu = time.perf_counter(), time.process_time()
    r = replay_departures(ONE_CARD, [task("a", 500)], {"a": Lifetime(0)}, "binpack")
    took, took_cpu = time.perf_counter() - began, time.process_time() - began_cpu
    assert 0 < r.seconds <= took and 0 < r.cpu_seconds <= took_cpu
    assert r.arrival == 0.0  # the task list as given
