"""``growth`` works out, without booking anything, how much a node's fragmentation would
grow if a pod were placed there. Booking the pod for real and measuring the node again
must give the same number: the reference here, for both measures, for one-card,
multi-card, whole-card and CPU-only pods, on nodes part used."""

from __future__ import annotations

import dataclasses
import random

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
from tessera.placement import WorkloadMix
from tessera.placement.fit import feasible, primary_request, resolve_rows
from tessera.placement.fragmentation import (
    Measure,
    MixArrays,
    PackingMeasure,
    PublishedMeasure,
    frag_rows,
    growth,
)

MEMORY = 10000  # MiB a card


def inventory(name: str, cards: int, cpu: int, model: str, memory: int) -> NodeInventory:
    return NodeInventory(
        name, tuple(Card(f"{name}-g{i}", i, model, MEMORY) for i in range(cards)), cpu, memory
    )


def pod(
    name: str, percent: int | None, count: int = 1, cpu: int = 1000, cores: int | None = None
) -> PodRequest:
    """``percent`` of the memory of each of ``count`` cards (100: whole cards) and
    ``cores`` percent of their compute (default: as much as of the memory); None: no GPU."""
    if percent is None:
        return PodRequest("ns", name, (ContainerRequest("main"),), cpu_milli=cpu, memory_mib=512)
    gpu = (
        GpuRequest(count=count, exclusive=True)
        if percent == 100
        else GpuRequest(
            count=count,
            memory_mib=percent * MEMORY // 100,
            cores_percent=percent if cores is None else cores,
        )
    )
    return PodRequest("ns", name, (ContainerRequest("main", gpu),), cpu_milli=cpu, memory_mib=512)


PERCENT = PodRequest(
    "ns",
    "pct",
    (ContainerRequest("main", GpuRequest(count=1, memory_percent=30, cores_percent=20)),),
)
# Memory and compute in step, and apart (memory-heavy, compute-heavy): the measures
# read the scarcer of the two.
MIX = [pod("m1", 20), pod("m2", 50), pod("m3", 70), pod("m4", 100), pod("m5", 100, count=2),
       pod("m6", None, cpu=4000), pod("m7", 10, cores=60), pod("m8", 60, cores=10),
       PERCENT, dataclasses.replace(pod("m9", 20), memory_mib=2048)]  # fmt: skip
ASKS = [pod("a1", 30), pod("a2", 60), pod("a3", 100), pod("a4", 40, count=2),
        pod("a5", 100, count=2), pod("a6", None, cpu=2000),
        pod("a7", 50, cores=10), pod("a8", 10, cores=40, count=2), PERCENT,
        dataclasses.replace(pod("a9", 10), memory_mib=2048)]  # fmt: skip


def busy_cluster(seed: int) -> ClusterState:
    """Nodes of 1-4 cards with some slices already placed on them."""
    rng = random.Random(seed)
    state = ClusterState([
        inventory(f"n{i}", rng.randint(1, 4), rng.choice([4000, 16000]), rng.choice(["T4", "A100"]),
                  rng.choice([3000, 65536]))
        for i in range(6)
    ])  # fmt: skip
    for i in range(10):
        snap = state.snapshot()
        name = f"n{rng.randrange(6)}"
        free = [c for c in snap.cards_free(name)
                if c.memory_mib >= 3000 and c.cores_percent >= 40 and not c.exclusive]  # fmt: skip
        if not free:
            continue
        card = rng.choice(free).card
        percent, cores = rng.choice([(10, 10), (20, 20), (30, 5), (10, 40)])
        slices = (CardSlice(card.uuid, percent * MEMORY // 100, cores),)
        placed = pod(f"x{i}", percent, cores=cores)
        state.assign(placed, Assignment(name, (ContainerAssignment("main", slices),)))
    return state


def measured_after(state: ClusterState, row_name: str, p: PodRequest, cols: list[int],
                   mix: WorkloadMix, measure: Measure) -> float:  # fmt: skip
    """Book ``p`` on ``row_name``'s cards ``cols`` in a copy of the node, and measure it
    again (the measure of a node reads that node alone)."""
    after = state.node_without(row_name, ())
    gpu = primary_request(p)
    inv = state.node(row_name)
    containers: tuple[ContainerAssignment, ...] = ()
    if gpu is not None:
        slices = tuple(
            CardSlice(
                inv.cards[c].uuid,
                MEMORY if gpu.exclusive else gpu.memory_on(inv.cards[c]),
                100 if gpu.exclusive else gpu.cores(),
            )
            for c in cols
        )
        containers = (ContainerAssignment("main", slices, exclusive=gpu.exclusive),)
    after.assign(p, Assignment(row_name, containers))
    snap = after.snapshot()
    rows = np.asarray([snap.rows[row_name]], dtype=np.int64)
    k = MixArrays.build(mix.weights(), snap.models)  # the copy's own model list
    return float(frag_rows(snap.tables, rows, k, measure)[0][0])


@pytest.mark.parametrize(
    "measure", [PublishedMeasure(), PackingMeasure()], ids=lambda m: type(m).__name__
)
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_growth_is_what_booking_the_pod_and_measuring_again_gives(
    measure: Measure, seed: int
) -> None:
    state = busy_cluster(seed)
    snap = state.snapshot()
    mix = WorkloadMix(MIX)
    k = MixArrays.build(mix.weights(), snap.models)
    for p in ASKS:
        rows, _ = resolve_rows(snap, None)
        ok, demand = feasible(snap, p, rows)
        rows = rows[ok]
        card_ok = demand.card_ok[ok]
        before = frag_rows(snap.tables, rows, k, measure)[0]
        got, col = growth(snap.tables, rows, card_ok, p.cpu_milli, p.memory_mib, demand.primary,
                          k, measure)  # fmt: skip
        gpu = demand.primary
        for i, r in enumerate(rows.tolist()):
            name = snap.names[r]
            fitting = np.flatnonzero(card_ok[i]).tolist()
            if gpu is None:
                want = measured_after(state, name, p, [], mix, measure) - before[i]
                assert got[i] == pytest.approx(want, abs=1e-6), (p.name, name)
                assert col[i] == -1
            elif gpu.count == 1:
                each = {c: measured_after(state, name, p, [c], mix, measure) - before[i]
                        for c in fitting}  # fmt: skip
                assert got[i] == pytest.approx(min(each.values()), abs=1e-6), (p.name, name)
                assert each[int(col[i])] == pytest.approx(got[i], abs=1e-6)
            else:  # the ``count`` tightest fitting cards (least idle), the lower column first
                free = snap.cards_free(name)
                idle = {c: min(free[c].cores_percent / 100, free[c].memory_mib / MEMORY)
                        for c in fitting}  # the scarcer of memory and compute  # fmt: skip
                tightest = sorted(fitting, key=lambda c: (idle[c], c))[: gpu.count]
                want = measured_after(state, name, p, tightest, mix, measure) - before[i]
                assert got[i] == pytest.approx(want, abs=1e-6), (p.name, name)
