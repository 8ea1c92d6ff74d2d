from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import PlacementError
from tessera.model.clusterspec import make_cards, read_nodes_csv
from tessera.model.types import NodeInventory
from tessera.simulate.arrivals import arrival_stream
from tessera.simulate.metrics import gpu_capacity_milli
from tessera.simulate.replay import (
    failure_reason,
    node_order,
    reason_category,
    replay,
    replay_stream,
)
from tessera.simulate.trace import TraceTask, read_tasks_csv
from tessera.simulate.workload import synthetic_cluster, synthetic_tasks


def node(name: str, cards: int, cpu: int, mem: int) -> NodeInventory:
    return NodeInventory(name, make_cards(name, cards, "T4"), cpu, mem)


# 7 T4 cards = 7000 milli-GPU.
NODES = [node("n0", 2, 8000, 32768), node("n1", 1, 4000, 16384), node("n2", 4, 16000, 65536)]

# In arrival order. Worked by hand for binpack (busiest node first, ties to the first
# node; on the node, the fullest card that fits):
STREAM = [
    TraceTask("a", 1000, 1024, 1, 500),  # all empty: n0, card 0 -> 50% left
    TraceTask("b", 1000, 1024, 1, 1000),  # n0 is the busiest: its free card 1
    TraceTask("c", 1000, 1024, 1, 600),  # n0's 50% is too small; n1 (first of equals)
    TraceTask("d", 8000, 8192, 4, 1000),  # only n2 has four free cards
    TraceTask("e", 1000, 1024, 1, 500),  # n0 card 0, exactly its 50%
    TraceTask("f", 7000, 1024),  # CPU only: n0 has 5000 CPU left, n1 3000; n2 8000
    TraceTask("g", 1000, 20000, 1, 400),  # FAILS: n1 (40% left) lacks memory, others GPU
    TraceTask("h", 500, 1024, 1, 100),  # n1's 40%
    TraceTask("i", 20000, 1024),  # FAILS: no node has 20000 CPU left
    TraceTask("j", 1000, 1024, 2, 1000),  # FAILS: no two free cards anywhere
]


def test_binpack_on_a_hand_worked_trace() -> None:
    r = replay_stream(NODES, STREAM, "binpack", seed=42, arrival=1.3)
    assert (r.capacity_milli, r.arrived_milli, r.arrived_ratio) == (7000, 9100, 1.3)
    assert (r.arrived_tasks, r.placed_tasks, r.failed_tasks) == (10, 7, 3)
    assert r.allocated_milli == 500 + 1000 + 600 + 4000 + 500 + 100
    assert r.gpu_allocation_ratio == 6700 / 7000
    assert r.failed_by_reason == {"gpu": 2, "cpu": 1}
    assert r.failed_by_class == {"shared": 1, "cpu-only": 1, "2-gpu": 1}
    # g brings arrivals to exactly 7000 (100%): a..e were placed by then.
    assert r.allocation_at(100) == 6600 / 7000
    # d brings arrivals from 2100 (30%) to 6100 (87.1%): every point in between reads
    # the allocation after d.
    assert r.curve[30] == 2100 / 7000
    assert r.curve[31:88] == (6100 / 7000,) * 57
    assert r.curve[88] == 6600 / 7000
    assert len(r.curve) == 131 and r.curve[0] == 0.0
    assert 0.0 <= r.fragmentation_rate <= 1.0


def test_same_seed_same_result_for_every_policy() -> None:
    nodes = synthetic_cluster(scale=0.02)
    tasks = synthetic_tasks(count=150)
    for policy in ("fragmentation", "best-fit", "binpack", "spread", "random"):
        a = replay(nodes, tasks, policy, seed=42, arrival=1.3)
        b = replay(nodes, tasks, policy, seed=42, arrival=1.3)
        assert (a.allocated_milli, a.curve, a.failed_by_reason) == (
            b.allocated_milli,
            b.curve,
            b.failed_by_reason,
        ), policy
        assert a.fragmentation_rate == b.fragmentation_rate
        assert a.arrived_ratio <= 1.3


def test_replay_is_replay_stream_on_the_seeded_node_order() -> None:
    nodes = synthetic_cluster(scale=0.02)
    tasks = synthetic_tasks(count=150)
    order = node_order(nodes, 42)
    assert sorted(n.name for n in order) == sorted(n.name for n in nodes)
    assert order != nodes and order == node_order(nodes, 42)
    stream = arrival_stream(tasks, gpu_capacity_milli(nodes), 1.3, 42)
    a = replay(nodes, tasks, "binpack", seed=42, arrival=1.3)
    b = replay_stream(order, stream, "binpack", seed=42, arrival=1.3)
    assert (a.allocated_milli, a.curve) == (b.allocated_milli, b.curve)


def test_reason_categories() -> None:
    assert reason_category("insufficient cpu") == "cpu"
    assert reason_category("insufficient memory") == "memory"
    assert reason_category("no card with 47% memory and 47% cores free") == "gpu"
    assert reason_category("fewer than 8 free whole cards") == "gpu"
    assert reason_category("fewer than 2 cards of an allowed model") == "gpu"
    assert reason_category("model T4 not in A10") == "model"
    assert reason_category("no GPU on node") == "no-gpu"
    assert reason_category("no healthy card") == "no-gpu"
    assert reason_category("no card with an allowed UUID") == "model"
    assert reason_category("cards cannot hold all GPU containers together") == "gpu"
    err = PlacementError("x", {"a": "insufficient cpu", "b": "no free whole card", "c": "no card"})
    assert failure_reason(err) == "gpu"
    assert failure_reason(PlacementError("x")) == "no nodes"


@pytest.mark.slow
def test_openb_one_seed_end_to_end(openb_dir: Path) -> None:
    """The real trace, one seed, arrivals to 30% of capacity: nearly everything fits."""
    nodes = read_nodes_csv(openb_dir / "openb_node_list_gpu_node.csv")
    tasks = read_tasks_csv(openb_dir / "openb_pod_list_default.csv")
    r = replay(nodes, tasks, "fragmentation", seed=42, arrival=0.3)
    assert r.capacity_milli == 6_212_000
    assert 0.3 - 0.001 < r.arrived_ratio <= 0.3
    assert all("-copy-" not in str(k) for k in r.failed_by_class)
    assert r.gpu_allocation_ratio > 0.29
    assert 2000 < r.arrived_tasks < 3000


def test_replay_hands_its_seed_mix_arrival_and_progress_on() -> None:
    import time

    from tessera.placement import WorkloadMix, make_policy

    made: list[tuple[str, int, WorkloadMix]] = []

    def make(name: str, seed: int, mix: WorkloadMix) -> object:
        made.append((name, seed, mix))
        return make_policy(name, seed=seed, mix=mix)

    told: list[tuple[int, int]] = []
    began, began_cpu = time.perf_counter(), time.process_time()
    r = replay(NODES, STREAM, "binpack", 5, 1.1, lambda d, k: told.append((d, k)), make=make)  # type: ignore[arg-type]
    took, took_cpu = time.perf_counter() - began, time.process_time() - began_cpu
    ((name, seed, mix),) = made
    assert (name, seed, r.seed, r.arrival) == ("binpack", 5, 5, 1.1)
    assert mix.seen == r.arrived_tasks  # the mix the policy reads is the one observed
    assert told[-1] == (r.arrived_tasks, r.arrived_tasks)
    assert 0 < r.seconds <= took and 0 < r.cpu_seconds <= took_cpu


def test_a_random_policy_takes_the_replays_seed_and_failures_add_up_by_class() -> None:
    order = [node("n0", 1, 8000, 32768), node("n1", 1, 8000, 32768)]
    # b lands beside a or on the other card; only beside a leaves room for c.
    stream = [TraceTask("a", 1000, 1024, 1, 500), TraceTask("b", 1000, 1024, 1, 500),
              TraceTask("c", 1000, 1024, 1, 1000)]  # fmt: skip
    placed = {replay_stream(order, stream, "random", seed, 1.0).placed_tasks
              for seed in range(12)}  # fmt: skip
    assert placed == {2, 3}
    big = [TraceTask(f"x{k}", 1000, 1024, 1, 1000) for k in range(4)]
    r = replay_stream(order, big, "binpack", 0, 2.0)
    assert r.failed_by_class == {"1-gpu": 2}


def test_the_fragmentation_policy_reads_the_mix_the_replay_observes() -> None:
    from tessera.placement import WorkloadMix, make_policy

    nodes = synthetic_cluster(scale=0.02)
    stream = arrival_stream(synthetic_tasks(count=150), gpu_capacity_milli(nodes), 1.0, 4)

    def outcome(make: object = None) -> tuple[object, ...]:
        r = replay_stream(nodes, stream, "fragmentation", 4, 1.0, make=make)  # type: ignore[arg-type]
        return r.placed_tasks, r.allocated_milli, r.curve, r.fragmentation_rate

    def reading(name: str, seed: int, mix: WorkloadMix) -> object:
        return make_policy(name, seed=seed, mix=mix)

    def blind(name: str, seed: int, mix: WorkloadMix) -> object:
        return make_policy(name, seed=seed)  # a mix nobody observes into

    assert outcome() == outcome(reading)
    assert outcome() != outcome(blind)  # the mix changes where this stream goes
