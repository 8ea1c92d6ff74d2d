"""The fragmentation policy keeps what it computed (card features per row, each request
class's growth per row, the mix as arrays) and refreshes it as rows, the mix and the
card models change. Below its refresh bound the cache must be invisible: a policy that
has scored every step of a busy history scores as one made afresh."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tessera.cluster import ClusterState
from tessera.errors import PlacementError
from tessera.model.types import PodRequest
from tessera.placement import WorkloadMix, make_policy, place, score_nodes
from tests.unit.test_placement import gpu_pod, node, share

KINDS = (
    share(mem=4000, cores=30),
    share(mem=12000, cores=50),
    share(mem=2000, cores=10, models=frozenset({"A100"})),
    share(mem=3000, cores=20, uuids=frozenset({"n1-g0", "n2-g1"})),  # per pod: not cached
    share(mem=3000, cores=20),  # the same class unpinned: must not get the pinned growth
    gpu_pod(count=1, exclusive=True),
    gpu_pod(count=2, exclusive=True),
    gpu_pod(count=2, memory_mib=6000, cores_percent=40),
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_long_lived_policy_scores_as_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    state = ClusterState([
        node(f"n{i}", cards=rng.choice([1, 2, 4]), memory=rng.choice([16000, 40000]),
             model=rng.choice(["T4", "A100"]))
        for i in range(10)
    ])  # fmt: skip
    mix = WorkloadMix([dataclasses.replace(k, name=f"seen-{i}") for i, k in enumerate(KINDS)])
    policy = make_policy("fragmentation", mix=mix)
    booked: list[PodRequest] = []
    for step in range(90):
        if step == 45:  # a third card model, wider nodes: the arrays are rebuilt
            for i in range(8):
                state.add_node(node(f"late{i}", cards=8, memory=80000, model="H100"))
        pod = dataclasses.replace(rng.choice(KINDS), name=f"p{step}")
        mix.observe(pod)  # the 32nd observation freezes the mix anew
        if booked and rng.random() < 0.3:
            state.release(booked.pop(rng.randrange(len(booked))).key)
        snap = state.snapshot()
        fresh = make_policy("fragmentation", mix=mix)
        kept = score_nodes(snap, pod, None, policy)
        assert kept == pytest.approx(score_nodes(snap, pod, None, fresh)), step
        try:
            decision = place(snap, pod, policy)
        except PlacementError:
            continue
        assert decision.node == place(snap, pod, fresh).node
        state.assign(pod, decision.assignment)
        booked.append(pod)
    assert mix.version >= 2 and len(booked) > 10  # the history did what it is for


def test_a_pinned_pods_growth_is_not_kept_for_its_class() -> None:
    # A pin narrows the cards, so the growth differs; the class drops the pin, so what is
    # kept for the class must not come from the pinned pod.
    state = ClusterState([node(f"n{i}", cards=2) for i in range(3)])
    for name in ("a", "b"):
        busy = dataclasses.replace(share(mem=6000, cores=30), name=name)
        state.assign(busy, place(state.snapshot(), busy, make_policy("binpack")).assignment)
    mix = WorkloadMix([dataclasses.replace(k, name=f"seen-{i}") for i, k in enumerate(KINDS)])
    policy = make_policy("fragmentation", mix=mix)
    snap = state.snapshot()
    pinned = share(mem=3000, cores=20, uuids=frozenset({"n0-g1"}))
    unpinned = share(mem=3000, cores=20)
    fresh_pinned = score_nodes(snap, pinned, None, make_policy("fragmentation", mix=mix))
    fresh = score_nodes(snap, unpinned, None, make_policy("fragmentation", mix=mix))
    assert fresh_pinned["n0"] != pytest.approx(fresh["n0"])  # the pin matters here
    assert score_nodes(snap, pinned, None, policy) == pytest.approx(fresh_pinned)
    assert score_nodes(snap, unpinned, None, policy) == pytest.approx(fresh)


def test_a_policy_scores_as_a_fresh_one_after_the_cluster_outgrows_its_tables() -> None:
    # Ten nodes fit the first table (16 rows); ten more of the same model make it 32 rows
    # with the card models unchanged, so only the change of size tells the kept growth
    # is too short.
    state = ClusterState([node(f"n{i}") for i in range(10)])
    mix = WorkloadMix([dataclasses.replace(k, name=f"seen-{i}") for i, k in enumerate(KINDS)])
    policy = make_policy("fragmentation", mix=mix)
    pod = share(mem=4000, cores=30)
    score_nodes(state.snapshot(), pod, None, policy)
    for i in range(10, 20):
        state.add_node(node(f"n{i}"))
    snap = state.snapshot()
    fresh = make_policy("fragmentation", mix=mix)
    assert score_nodes(snap, pod, None, policy) == pytest.approx(
        score_nodes(snap, pod, None, fresh)
    )
