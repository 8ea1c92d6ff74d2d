"""The fragmentation measure (published and packing) and the policy's cached growth."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tessera.cluster import ClusterState
from tessera.cluster.snapshot import Snapshot
from tessera.model.types import (
    Assignment,
    Card,
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    NodeInventory,
    PodRequest,
)
from tessera.placement import WorkloadMix, fragmentation_rate, node_fragmentation
from tessera.placement.base import Demand
from tessera.placement.fit import feasible, resolve_rows
from tessera.placement.fragmentation import (
    MixArrays,
    PackingMeasure,
    PublishedMeasure,
    frag_rows,
    growth,
)
from tessera.placement.fragmentation_policy import FragmentationNodes
from tessera.placement.mix import RequestClass


def node(name: str = "n", cards: int = 2, cpu: int = 32000, model: str = "T4") -> NodeInventory:
    return NodeInventory(
        name, tuple(Card(f"{name}-g{i}", i, model, 10000) for i in range(cards)), cpu, 65536
    )


def share(
    percent: int, name: str = "p", cpu: int = 1000, count: int = 1, **kw: object
) -> PodRequest:
    gpu = (
        GpuRequest(count=count, exclusive=True, **kw)  # type: ignore[arg-type]
        if percent == 100
        else GpuRequest(count=count, memory_percent=percent, cores_percent=percent, **kw)  # type: ignore[arg-type]
    )
    return PodRequest("ns", name, (ContainerRequest("main", gpu),), cpu_milli=cpu)


def occupy(
    state: ClusterState, node_name: str, col: int, percent: int, key: str, cores: int | None = None
) -> None:
    """``percent`` of card ``col``'s memory and ``cores`` percent of its compute (default:
    as much as of its memory) taken by pod ``key``."""
    cores = percent if cores is None else cores
    gpu = GpuRequest(count=1, memory_percent=percent, cores_percent=cores)
    pod = PodRequest("ns", key, (ContainerRequest("main", gpu),))
    uuid = f"{node_name}-g{col}"
    state.assign(
        pod,
        Assignment(
            node_name, (ContainerAssignment("main", (CardSlice(uuid, percent * 100, cores),)),)
        ),
    )


def demand_of(snap: Snapshot, pod: PodRequest) -> Demand:
    """``pod``'s demand over every node of ``snap`` (all of them fit it here)."""
    ok, demand = feasible(snap, pod, resolve_rows(snap, None)[0])
    assert ok.all()
    return demand


@pytest.mark.parametrize(
    ("nodes", "used", "mix", "expected"),
    [
        # card 0 has 0.3 idle, card 1 is whole; a 0.5 share cannot use 0.3.
        ([node()], [(0, 70)], [share(50)], 0.3),
        # a 0.2 share can use both leftovers: nothing is fragmented.
        ([node()], [(0, 70)], [share(20)], 0.0),
        # the node's CPU cannot run the task: all idle GPU (1.3) is fragmented.
        ([node(cpu=500)], [(0, 70)], [share(20)], 1.3),
        # two whole cards wanted, one whole card free: all idle GPU.
        ([node()], [(0, 70)], [share(100, count=2)], 1.3),
        # another model: all idle GPU.
        ([node()], [(0, 70)], [share(20, models=frozenset({"A100"}))], 1.3),
        # weighted: half 0.5-shares (0.3 fragmented), half CPU-only (nothing).
        ([node()], [(0, 70)], [share(50), PodRequest("ns", "c", (ContainerRequest("m"),))], 0.15),
    ],
)
def test_published_measure(
    nodes: list[NodeInventory], used: list[tuple[int, int]], mix: list[PodRequest], expected: float
) -> None:
    state = ClusterState(nodes)
    for i, (col, percent) in enumerate(used):
        occupy(state, "n", col, percent, f"u{i}")
    snap = state.snapshot()
    observed = WorkloadMix(mix)
    assert node_fragmentation(snap, observed)["n"] == pytest.approx(expected)
    assert fragmentation_rate(snap, observed) == pytest.approx(expected / 1.3)


@pytest.mark.parametrize(
    ("used_percent", "used_cores", "class_percent", "class_cores"),
    [
        (70, 10, 50, 10),  # memory is what card 0 lacks for the class
        (10, 70, 10, 50),  # compute is
    ],
)
def test_the_measures_read_memory_and_compute_apart(
    used_percent: int, used_cores: int, class_percent: int, class_cores: int
) -> None:
    # Card 0 keeps 0.3 of one of the two idle (the scarcer), card 1 is whole. The class
    # fits card 1 only: card 0's 0.3 is fragmented for it.
    state = ClusterState([node()])
    occupy(state, "n", 0, used_percent, "u", cores=used_cores)
    gpu = GpuRequest(count=1, memory_percent=class_percent, cores_percent=class_cores)
    mix = WorkloadMix([PodRequest("ns", "m", (ContainerRequest("main", gpu),), cpu_milli=100)])
    snap = state.snapshot()
    assert node_fragmentation(snap, mix)["n"] == pytest.approx(0.3)
    k = MixArrays.build(mix.weights(), snap.models)
    packing, idle = frag_rows(snap.tables, np.asarray([0]), k, PackingMeasure())
    assert idle[0] == pytest.approx(1.3)
    # Packing: one task on card 1, its size the larger of its two shares; the rest idles.
    assert packing[0] == pytest.approx(1.3 - max(class_percent, class_cores) / 100)


@pytest.mark.parametrize(("cpu", "expected"), [(1500, 1.5), (10_000, 1.1)])
def test_packing_measure_counts_one_next_task_per_card_within_the_cpu(
    cpu: int, expected: float
) -> None:
    state = ClusterState([node(cpu=cpu)])
    occupy(state, "n", 0, 10, "u")  # card 0: 0.9 idle, card 1: 1.0 idle
    snap = state.snapshot()
    t = snap.tables
    rows = np.asarray([0])
    two_fifths = MixArrays.build(WorkloadMix([share(40)]).weights(), snap.models)
    published, idle = frag_rows(t, rows, two_fifths, PublishedMeasure())
    packing, _ = frag_rows(t, rows, two_fifths, PackingMeasure())
    assert idle[0] == pytest.approx(1.9)
    assert published[0] == pytest.approx(0.0)  # 0.4 fits both cards
    # One 0.4 task on each card it fits (two, not the four that would pack in), as many
    # as the CPU allows (1000 per task): with 1500, one; with plenty, two. The rest of the
    # 1.9 idle counts as unusable for the class.
    assert packing[0] == pytest.approx(expected)


def test_cached_growth_equals_a_fresh_computation_after_changes() -> None:
    rng = np.random.default_rng(7)
    nodes = [node(f"n{i}", cards=4) for i in range(12)]
    state = ClusterState(nodes)
    mix = WorkloadMix([share(p, name=f"m{p}") for p in (20, 30, 50, 100)])
    scorer = FragmentationNodes(mix, max_refresh=None)
    pod = share(30, name="probe")
    for step in range(40):
        snap = state.snapshot()
        rows, _ = resolve_rows(snap, None)
        _, demand = feasible(snap, pod, rows)
        cached, cached_col = scorer.growth_rows(snap, demand)
        k = scorer.classes(snap)
        assert k is not None
        fresh, fresh_col = growth(
            snap.tables,
            demand.rows,
            demand.card_ok,
            pod.cpu_milli,
            0,
            demand.primary,
            k,
            scorer.measure,
        )
        np.testing.assert_allclose(cached, fresh, rtol=1e-5, atol=1e-6)
        assert (cached_col == fresh_col).all()
        target = int(rng.integers(len(nodes)))
        free = [c for c in snap.cards_free(f"n{target}") if c.cores_percent >= 20]
        if free:
            occupy(state, f"n{target}", int(free[0].card.index), 20, f"s{step}")


def test_growth_prefers_the_card_that_wastes_least() -> None:
    # Card 0 has 0.5 free, card 1 is whole; the mix is mostly whole-card work.
    state = ClusterState([node()])
    occupy(state, "n", 0, 50, "u")
    snap = state.snapshot()
    mix = WorkloadMix([share(100, name=f"w{i}") for i in range(3)] + [share(50, name="h")])
    scorer = FragmentationNodes(mix)
    rows, _ = resolve_rows(snap, None)
    _, demand = feasible(snap, share(40), rows)
    _, col = scorer.growth_rows(snap, demand)
    assert col[0] == 0  # the half-used card, not the whole one


def test_the_mix_as_arrays_reads_every_kind_of_class() -> None:
    classes = [
        (RequestClass(500, 256, None), 0.1),  # CPU only
        (RequestClass(1000, 512, GpuRequest(count=1, memory_mib=3000, cores_percent=20)), 0.2),
        (
            RequestClass(
                2000,
                0,
                GpuRequest(
                    count=1, memory_percent=25, cores_percent=40, models=frozenset({"A100"})
                ),
            ),
            0.3,
        ),
        (RequestClass(4000, 1024, GpuRequest(count=2, exclusive=True)), 0.4),
    ]
    k = MixArrays.build(classes, ("T4", "A100"))
    np.testing.assert_array_equal(k.weight, [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(k.cpu, [500, 1000, 2000, 4000])
    np.testing.assert_array_equal(k.mem, [256, 512, 0, 1024])
    np.testing.assert_array_equal(k.count, [0, 1, 1, 2])
    np.testing.assert_array_equal(k.mem_fixed, [0, 3000, 0, 0])
    np.testing.assert_array_equal(k.mem_percent, [0, 0, 25, 100])  # whole cards: all of it
    np.testing.assert_array_equal(k.cores, [0, 20, 40, 100])
    np.testing.assert_allclose(k.cores_f_share, [0, 0.2, 0.4, 1.0])
    np.testing.assert_array_equal(k.whole, [False, False, False, True])
    for name in ("weight", "cpu", "mem", "count", "mem_fixed", "mem_percent", "cores"):
        assert getattr(k, name).dtype == (np.float64 if name == "weight" else np.int64), name
    # One row per model, and a last one for "no card" (model -1): nothing runs there.
    np.testing.assert_array_equal(
        k.allowed,
        [[True, True, False, True], [True, True, True, True], [False, False, False, False]],
    )


def test_an_unhealthy_card_is_neither_idle_nor_somewhere_a_class_fits() -> None:
    inv = NodeInventory(
        "n", (Card("n-g0", 0, "T4", 10000), Card("n-g1", 1, "T4", 10000, healthy=False)), 32000,
        65536,
    )  # fmt: skip
    snap = ClusterState([inv]).snapshot()
    pair = WorkloadMix([share(20, count=2)])  # two cards: the node has one it can use
    k = MixArrays.build(pair.weights(), snap.models)
    rows = np.asarray([0])
    packing, idle = frag_rows(snap.tables, rows, k, PackingMeasure())
    assert idle[0] == pytest.approx(1.0)
    assert node_fragmentation(snap, pair)["n"] == pytest.approx(1.0)  # all of it, for the pair
    assert packing[0] == pytest.approx(1.0)  # no pair of cards to put the next task on


@pytest.mark.parametrize("scarce", ["cpu", "memory"])
def test_a_class_that_needs_exactly_what_the_node_has_left_runs_there(scarce: str) -> None:
    state = ClusterState([node(cpu=1000)])
    wants = share(20, cpu=1000)
    if scarce == "memory":
        wants = dataclasses.replace(wants, memory_mib=65536)  # all the node's memory
    snap = state.snapshot()
    assert node_fragmentation(snap, WorkloadMix([wants]))["n"] == 0.0
    # Growth reads the node's room the same way before and after: taking nothing, none.
    k = MixArrays.build(WorkloadMix([wants]).weights(), snap.models)
    rows = np.asarray([0])
    card_ok = np.ones((1, 2), dtype=np.bool_)
    delta, _ = growth(snap.tables, rows, card_ok, 0, 0, None, k, PackingMeasure())
    assert delta[0] == 0.0


def test_packing_counts_whole_groups_for_a_multi_card_class() -> None:
    # Three idle cards and a class of two whole cards: one group; the third card idles.
    snap = ClusterState([node(cards=3)]).snapshot()
    k = MixArrays.build(WorkloadMix([share(100, count=2)]).weights(), snap.models)
    packing, idle = frag_rows(snap.tables, np.asarray([0]), k, PackingMeasure())
    assert (packing[0], idle[0]) == (pytest.approx(1.0), pytest.approx(3.0))


def test_packing_counts_the_next_tasks_the_nodes_memory_allows() -> None:
    # Two idle cards, but memory (65536 MiB) for one 40,000 MiB task: one 0.4 task.
    snap = ClusterState([node()]).snapshot()
    big = dataclasses.replace(share(40), memory_mib=40_000)
    k = MixArrays.build(WorkloadMix([big]).weights(), snap.models)
    packing, _ = frag_rows(snap.tables, np.asarray([0]), k, PackingMeasure())
    assert packing[0] == pytest.approx(2.0 - 0.4)


def test_packing_leaves_nothing_unusable_for_cpu_only_work() -> None:
    # Half the mix CPU-only: it strands no GPU; the other half is 0.4 tasks, one per card.
    snap = ClusterState([node()]).snapshot()
    cpu_only = PodRequest("ns", "c", (ContainerRequest("m"),), cpu_milli=500)
    k = MixArrays.build(WorkloadMix([share(40), cpu_only]).weights(), snap.models)
    packing, _ = frag_rows(snap.tables, np.asarray([0]), k, PackingMeasure())
    assert packing[0] == pytest.approx(0.5 * (2.0 - 2 * 0.4))


def test_rate_and_node_values_without_a_mix_or_without_idle_gpu() -> None:
    state = ClusterState([node(cards=1)])
    assert fragmentation_rate(state.snapshot(), WorkloadMix()) == 0.0
    assert node_fragmentation(state.snapshot(), WorkloadMix()) == {"n": 0.0}
    occupy(state, "n", 0, 50, "half")
    mix = WorkloadMix([share(60)])  # the 0.5 left is all fragmented: less than a card idle
    assert fragmentation_rate(state.snapshot(), mix) == pytest.approx(1.0)
    occupy(state, "n", 0, 50, "rest")  # nothing idle: a rate of 0, not a division by 0
    assert fragmentation_rate(state.snapshot(), mix) == 0.0


def test_equal_growth_goes_to_the_tighter_card() -> None:
    # Whole-card work fits neither part-used card, so 0.2 on either grows nothing
    # differently; the tighter card (1, 0.6 idle) keeps card 0's larger share whole.
    state = ClusterState([node()])
    occupy(state, "n", 0, 20, "u0")
    occupy(state, "n", 1, 40, "u1")
    snap = state.snapshot()
    for measure in (PublishedMeasure(), PackingMeasure()):
        scorer = FragmentationNodes(WorkloadMix([share(100)]), measure=measure)
        demand = demand_of(snap, share(20))
        delta, col = scorer.growth_rows(snap, demand)
        assert (delta[0], col[0]) == (pytest.approx(-0.2), 1), type(measure).__name__


def test_a_percent_of_an_odd_sized_card_is_whole_mib_rounded_down() -> None:
    # 50 % of 10,001 MiB is 5,000 MiB, as the filter books it: the class fits the 5,000
    # left, and after a 50 % pod on an empty card the 5,001 left fits a 5,001 MiB class.
    def odd_node() -> NodeInventory:
        return NodeInventory("n", (Card("n-g0", 0, "T4", 10_001),), 32000, 65536)

    state = ClusterState([odd_node()])
    held = PodRequest("ns", "u", (ContainerRequest("main", GpuRequest(count=1, memory_mib=5001)),))
    slices = (CardSlice("n-g0", 5001, 50),)
    state.assign(held, Assignment("n", (ContainerAssignment("main", slices),)))
    assert node_fragmentation(state.snapshot(), WorkloadMix([share(50)]))["n"] == 0.0

    snap = ClusterState([odd_node()]).snapshot()
    fixed = GpuRequest(count=1, memory_mib=5001, cores_percent=50)
    k = MixArrays.build(
        WorkloadMix([PodRequest("ns", "m", (ContainerRequest("main", fixed),))]).weights(),
        snap.models,
    )
    half = share(50)
    demand = demand_of(snap, half)
    delta, _ = growth(
        snap.tables, demand.rows, demand.card_ok, 0, 0, demand.primary, k, PublishedMeasure()
    )
    assert delta[0] == 0.0
