"""kube-scheduler's rotating search for feasible nodes, as the replay models it."""

from __future__ import annotations

import pytest

from tessera.cluster import ClusterState
from tessera.errors import PlacementError
from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tessera.placement import make_policy, place
from tessera.simulate.replay import place_in_cycles, replay, replay_stream
from tessera.simulate.sampling import NodeSearch, backoff_wait_s, nodes_to_find
from tessera.simulate.trace import TraceTask, to_pod_request
from tessera.simulate.workload import synthetic_cluster, synthetic_tasks


@pytest.mark.parametrize(
    ("percentage", "nodes", "expected"),
    [
        (0, 99, 99),  # below 100 nodes: every node, whatever the percentage
        (10, 99, 99),
        (0, 100, 100),
        (0, 500, 230),  # adaptive: 50 - 500/125 = 46 %
        (0, 1213, 497),  # 50 - 9 = 41 % of the openb cluster
        (0, 5000, 500),  # 50 - 40 = 10 %
        (0, 10000, 500),  # 50 - 80 < 5: floored at 5 %
        (10, 500, 100),  # 50 nodes, raised to the floor of 100
        (50, 1000, 500),
        (100, 5000, 5000),
    ],
)
def test_nodes_to_find_is_kube_schedulers_rule(percentage: int, nodes: int, expected: int) -> None:
    assert nodes_to_find(percentage, nodes) == expected


@pytest.mark.parametrize("percentage", [-1, 101])
def test_a_percentage_outside_0_to_100_is_refused(percentage: int) -> None:
    with pytest.raises(
        ValueError, match=rf"percentageOfNodesToScore must be 0..100 \(got {percentage}\)"
    ):
        NodeSearch(percentage)


def cluster(n: int, cpu_of: dict[int, int] | None = None) -> ClusterState:
    """``n`` one-card nodes named n000.. in row order; 8 CPUs unless ``cpu_of`` says."""
    cpu_of = cpu_of or {}
    return ClusterState(
        [
            NodeInventory(f"n{i:03}", make_cards(f"n{i:03}", 1, "T4"), cpu_of.get(i, 8000), 65536)
            for i in range(n)
        ]
    )


def names(rows: range) -> list[str]:
    return [f"n{i:03}" for i in rows]


POD = to_pod_request(TraceTask("p", 1000, 1024, 1, 500))


def test_windows_rotate_through_the_nodes_in_row_order() -> None:
    snap = cluster(200).snapshot()
    search = NodeSearch(50)  # 100 of 200 nodes
    assert search.window(snap, POD) == (names(range(0, 100)), 100)
    assert search.window(snap, POD) == (names(range(100, 200)), 100)
    assert search.window(snap, POD) == (names(range(0, 100)), 100)


def test_nodes_failing_kube_schedulers_filters_are_walked_but_not_sent() -> None:
    snap = cluster(200, cpu_of=dict.fromkeys(range(50), 500)).snapshot()  # n000-n049: no CPU
    search = NodeSearch(50)
    assert search.window(snap, POD) == (names(range(50, 150)), 150)
    # From n150 on: to the end, round past the 50 without CPU, and on to n099.
    assert search.window(snap, POD) == ([*names(range(150, 200)), *names(range(50, 100))], 150)
    assert search.start == 100


def test_a_node_with_just_the_pods_cpu_free_is_feasible() -> None:
    # NodeResourcesFit: requested + the pod's request <= allocatable, equality included.
    snap = cluster(200, cpu_of=dict.fromkeys(range(100), POD.cpu_milli)).snapshot()
    assert NodeSearch(50).window(snap, POD) == (names(range(0, 100)), 100)


def test_the_search_stops_at_the_node_that_completes_the_window() -> None:
    snap = cluster(200, cpu_of=dict.fromkeys(range(100, 200), 500)).snapshot()  # 100 feasible
    search = NodeSearch(50)  # looks for 100: the last one found is n099
    assert search.window(snap, POD) == (names(range(0, 100)), 100)
    assert search.start == 100


def test_a_cluster_without_nodes_has_an_empty_window() -> None:
    assert NodeSearch(0).window(ClusterState([]).snapshot(), POD) == ([], 0)


def test_a_window_short_of_feasible_nodes_walks_the_whole_cluster() -> None:
    snap = cluster(200, cpu_of=dict.fromkeys(range(120), 500)).snapshot()  # 80 feasible
    search = NodeSearch(50)
    search.start = 30
    assert search.window(snap, POD) == (names(range(120, 200)), 200)
    assert search.start == 30


def test_a_pod_only_a_later_window_can_hold_is_placed_on_a_later_cycle() -> None:
    state = full_but(200, 150)  # only the second window has room
    policy = make_policy("binpack", seed=1)
    decision, cycles = place_in_cycles(state.snapshot(), POD, policy, NodeSearch(50))
    assert (decision.node, cycles) == ("n150", 2)
    decision, cycles = place_in_cycles(state.snapshot(), POD, policy, None)  # every node
    assert (decision.node, cycles) == ("n150", 1)


def full_but(n: int, free: int) -> ClusterState:
    """``cluster(n)`` with every card held whole but node ``free``'s."""
    state = cluster(n)
    policy = make_policy("binpack", seed=1)
    for i in range(n):
        if i != free:
            whole = to_pod_request(TraceTask(f"w{i}", 100, 100, 1, 1000))
            state.assign(whole, place(state.snapshot(), whole, policy, [f"n{i:03}"]).assignment)
    return state


def test_the_replay_counts_the_tasks_placed_on_a_later_cycle_by_cycle() -> None:
    stream = [TraceTask("a", 100, 100, 1, 300), TraceTask("b", 100, 100, 1, 300)]
    nodes = [NodeInventory(f"n{i:03}", make_cards(f"n{i:03}", 1, "T4"), 8000, 65536)
             for i in range(200)]  # fmt: skip
    seen: list[tuple[int, int]] = []
    r = replay_stream(nodes, stream, "binpack", 1, 1.0, state=full_but(200, 120),
                      nodes_to_score=50, progress=lambda *p: seen.append(p))  # fmt: skip
    assert seen == [(1, 2), (2, 2)]
    # Each waits a cycle: the window n000-n099 is full, and after a's two windows the
    # search has come round to n000 again for b.
    assert (r.placed_tasks, r.retried_cycles, r.retried_tasks) == (2, {2: 2}, 2)
    every = replay_stream(nodes, stream, "binpack", 1, 1.0, state=full_but(200, 120))
    assert (every.placed_tasks, every.retried_cycles) == (2, {})


def test_a_pod_no_node_can_hold_fails_with_a_reason_for_every_node() -> None:
    snap = cluster(200).snapshot()
    too_big = to_pod_request(TraceTask("big", 1000, 1024, 2, 1000))  # two cards; nodes have one
    with pytest.raises(PlacementError) as err:
        place_in_cycles(snap, too_big, make_policy("binpack", seed=1), NodeSearch(50))
    assert len(err.value.reasons) == 200


def test_sampling_changes_nothing_below_100_nodes_and_is_recorded() -> None:
    nodes, tasks = synthetic_cluster()[:60], synthetic_tasks()[:400]
    every = replay(nodes, tasks, "fragmentation", 42, 1.3)
    adaptive = replay(nodes, tasks, "fragmentation", 42, 1.3, nodes_to_score=0)
    assert adaptive.allocated_milli == every.allocated_milli
    assert adaptive.placed_tasks == every.placed_tasks
    assert (every.nodes_to_score, adaptive.nodes_to_score, adaptive.retried_cycles) == (100, 0, {})


@pytest.mark.parametrize(("cycles", "wait"), [(1, 0), (2, 1), (3, 3), (5, 15), (7, 35)])
def test_backoff_doubles_from_1_s_to_at_most_10_s_per_retry(cycles: int, wait: float) -> None:
    assert backoff_wait_s(cycles) == wait


def test_a_node_with_just_the_pods_memory_free_is_feasible() -> None:
    full = to_pod_request(TraceTask("p", 1000, 65536, 1, 500))  # each node's whole memory
    snap = cluster(200).snapshot()
    assert NodeSearch(50).window(snap, full) == (names(range(0, 100)), 100)
