"""The fragmentation policy's node scorer and card picker: what they score, the bound on
the rows one decision refreshes, and the requests they cannot keep per class."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.cluster import ClusterState
from tessera.cluster.snapshot import Snapshot
from tessera.model.types import ContainerRequest, PodRequest
from tessera.placement import WorkloadMix, make_policy, pick_cards
from tessera.placement.base import gpu_used_fraction
from tessera.placement.fragmentation_policy import FragmentationNodes
from tests.unit.test_placement_fragmentation import demand_of, node, occupy, share


def one_card_nodes(*used_percent: int) -> ClusterState:
    """One single-card node per entry, ``n<i>``, its card that much used."""
    state = ClusterState([node(f"n{i}", cards=1) for i in range(len(used_percent))])
    for i, percent in enumerate(used_percent):
        if percent:
            occupy(state, f"n{i}", 0, percent, f"u{i}")
    return state


def test_growth_decides_and_the_busier_node_only_breaks_ties() -> None:
    # Whole-card work fits neither node's part-used card 0: 0.1 there grows nothing on
    # either (the idle drops by 0.1 on both); node b, busier, wins by the tie-break alone.
    state = ClusterState([node("a"), node("b")])
    occupy(state, "a", 0, 50, "ua")
    occupy(state, "b", 0, 70, "ub")
    snap = state.snapshot()
    scorer = FragmentationNodes(WorkloadMix([share(100)]))
    demand = demand_of(snap, share(10))
    delta, _ = scorer.growth_rows(snap, demand)
    assert delta == pytest.approx([-0.1, -0.1])
    scores = scorer.score_rows(snap, demand)
    used = gpu_used_fraction(snap, demand.rows)
    assert used == pytest.approx([0.25, 0.35])
    assert scores == pytest.approx(-delta + 1e-3 * used)  # the default tie-break weight
    assert scores[1] > scores[0]


def reference(snap: Snapshot, pod: PodRequest, mix: WorkloadMix) -> np.ndarray:
    """Every row's growth, each one computed (no bound on the refresh)."""
    delta, _ = FragmentationNodes(mix, max_refresh=None).growth_rows(snap, demand_of(snap, pod))
    return delta


def test_one_decision_refreshes_only_the_busiest_stale_rows_the_rest_score_last() -> None:
    # n3 is the busiest, n1 and n5 tie behind it: with room for two, n3 and n1 (the
    # earlier of the tied rows). The rest sit the decision out, scored below every row
    # computed; they are refreshed by later decisions, busiest first.
    state = one_card_nodes(20, 60, 40, 70, 0, 60)
    snap = state.snapshot()
    mix = WorkloadMix([share(30), share(100)])
    pod = share(10)
    want = reference(snap, pod, mix)
    scorer = FragmentationNodes(mix, max_refresh=2)
    refreshed: set[int] = set()
    for batch in ({3, 1}, {5, 2}, {0, 4}):
        refreshed |= batch
        delta, _ = scorer.growth_rows(snap, demand_of(snap, pod))
        skipped = sorted(set(range(6)) - refreshed)
        for row in sorted(refreshed):
            assert delta[row] == pytest.approx(want[row]), (batch, row)
        last = max(want[r] for r in refreshed) + 1.0
        assert [delta[r] for r in skipped] == pytest.approx([last] * len(skipped)), batch
    assert scorer.growth_rows(snap, demand_of(snap, pod))[0] == pytest.approx(want)


def test_by_default_one_decision_refreshes_at_most_256_rows() -> None:
    state = one_card_nodes(*[0] * 258)  # all equally idle: the first 256 rows
    snap = state.snapshot()
    mix = WorkloadMix([share(30)])
    delta, _ = FragmentationNodes(mix).growth_rows(snap, demand_of(snap, share(10)))
    want = reference(snap, share(10), mix)
    assert delta[:256] == pytest.approx(want[:256])
    assert delta[256:] == pytest.approx([want[:256].max() + 1.0] * 2)


def test_a_cpu_only_pod_grows_what_its_cpu_strands() -> None:
    # 2,000 milli-CPU and 0.3 tasks of 1,000: two fit (1.4 unusable). A CPU-only pod
    # taking 1,500 leaves room for none: all 2.0 idle is unusable, a growth of 0.6.
    snap = ClusterState([node(cpu=2000)]).snapshot()
    scorer = FragmentationNodes(WorkloadMix([share(30)]))
    cpu_pod = PodRequest("ns", "c", (ContainerRequest("main"),), cpu_milli=1500)
    delta, col = scorer.growth_rows(snap, demand_of(snap, cpu_pod))
    assert (delta[0], col[0]) == (pytest.approx(0.6), -1)


def test_a_pinned_pods_growth_is_that_of_its_gpu_on_the_pinned_card() -> None:
    # Whole-card work: 0.2 on the pinned card 1 leaves one whole card, 0.8 unusable.
    snap = ClusterState([node()]).snapshot()
    scorer = FragmentationNodes(WorkloadMix([share(100)]))
    pinned = share(20, uuids=frozenset({"n-g1"}))
    delta, col = scorer.growth_rows(snap, demand_of(snap, pinned))
    assert (delta[0], col[0]) == (pytest.approx(0.8), 1)


def test_without_a_mix_every_row_grows_nothing_and_names_no_card() -> None:
    snap = ClusterState([node("a"), node("b")]).snapshot()
    delta, col = FragmentationNodes(WorkloadMix()).growth_rows(snap, demand_of(snap, share(10)))
    assert delta.tolist() == [0.0, 0.0]
    assert col.tolist() == [-1, -1]
    assert col.dtype == np.int64


def test_the_card_picker_keeps_a_share_the_mix_can_use_where_binpack_would_not() -> None:
    # Card 0 has 0.5 free, card 1 0.7; the mix is 0.5 tasks. 0.2 on card 1 leaves 0.5 on
    # each, both usable; binpack takes the tighter card 0 and strands 0.3 and 0.2.
    state = ClusterState([node()])
    occupy(state, "n", 0, 50, "u0")
    occupy(state, "n", 1, 30, "u1")
    snap = state.snapshot()
    mix = WorkloadMix([share(50)])
    small = share(20)
    for name, card in [("fragmentation", "n-g1"), ("binpack/fragmentation", "n-g1"),
                       ("binpack", "n-g0")]:  # fmt: skip
        got = pick_cards(snap, small, "n", make_policy(name, mix=mix))
        assert got.containers[0].slices[0].uuid == card, name
    only = share(20, uuids=frozenset({"n-g0"}))  # one candidate: no choice to make
    got = pick_cards(snap, only, "n", make_policy("fragmentation", mix=mix))
    assert got.containers[0].slices[0].uuid == "n-g0"


def test_fragmentation_without_a_mix_picks_cards_as_binpack() -> None:
    state = ClusterState([node()])
    occupy(state, "n", 1, 30, "u1")  # card 1 is the busier
    snap = state.snapshot()
    got = pick_cards(snap, share(20), "n", make_policy("fragmentation", mix=WorkloadMix()))
    assert got.containers[0].slices[0].uuid == "n-g1"
