"""The fragmentation measure (published and packing) and the policy's cached growth."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.cluster import ClusterState
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
from tessera.placement.fit import feasible, resolve_rows
from tessera.placement.fragmentation import (
    MixArrays,
    PackingMeasure,
    PublishedMeasure,
    frag_rows,
    growth,
)
from tessera.placement.fragmentation_policy import FragmentationNodes


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
