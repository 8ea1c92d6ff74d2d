"""The vectorised fit test's pieces on their own: the row index of its hot path, the
request scoring reasons about, and card pins over any set and order of candidates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tessera.cluster import ClusterState
from tessera.model.types import ContainerRequest, GpuRequest, PodRequest
from tessera.placement import filter_nodes, make_policy, pick_cards
from tessera.placement.fit import primary_request, selector
from tests.unit.test_placement import book, gpu_pod, node


@given(st.permutations(range(6)).flatmap(lambda p: st.integers(0, 6).map(lambda k: p[:k])))
@example([0, 1, 3, 2, 4])  # first and last where a slice would have them, middle swapped
@example([0, 2, 1])
@example([0, 1, 2])
def test_the_row_selector_indexes_exactly_the_rows_given(rows: list[int]) -> None:
    table = np.arange(6) * 10
    index = np.asarray(rows, dtype=np.int64)
    assert table[selector(index)].tolist() == table[index].tolist()


def _pod(*gpus: GpuRequest | None) -> PodRequest:
    containers = tuple(ContainerRequest(f"c{i}", g) for i, g in enumerate(gpus))
    return PodRequest("ns", "p", containers, cpu_milli=0, memory_mib=0)


SHARE_4G = GpuRequest(count=1, memory_mib=4000, cores_percent=10)
SHARE_8G = GpuRequest(count=1, memory_mib=8000, cores_percent=10)
TWO_1G = GpuRequest(count=2, memory_mib=1000, cores_percent=10)
WHOLE = GpuRequest(count=1, exclusive=True)
HALF = GpuRequest(count=1, memory_percent=50)
FIFTH = GpuRequest(count=1, memory_percent=20)


@pytest.mark.parametrize(
    ("gpus", "primary"),
    [
        ((SHARE_4G,), 0),
        ((None, SHARE_4G), 1),  # a container without a GPU is passed over
        ((SHARE_4G, SHARE_8G), 1),  # more memory
        ((FIFTH, HALF), 1),  # more memory, as a percent
        ((SHARE_8G, TWO_1G), 1),  # more cards before more memory
        ((TWO_1G, WHOLE), 1),  # a whole card before anything shared
        ((SHARE_8G, GpuRequest(count=1, memory_mib=8000, cores_percent=50)), 0),  # tie: first
    ],
)
def test_the_primary_request_is_whole_cards_then_more_cards_then_more_memory(
    gpus: tuple[GpuRequest | None, ...], primary: int
) -> None:
    assert primary_request(_pod(*gpus)) is gpus[primary]


def test_a_pod_without_a_gpu_has_no_primary_request() -> None:
    assert primary_request(_pod(None)) is None


@pytest.mark.parametrize("pin", ["b-g0", "b-g1"])
@pytest.mark.parametrize(
    ("names", "feasible"),
    [
        (["b", "a"], ["b"]),  # the pinned card's node first among the candidates
        (["a", "b"], ["b"]),
        (["b", "c"], ["b"]),
        (["a", "c"], []),  # not among them: no other node takes its place
        (None, ["b"]),
    ],
)
def test_a_pinned_card_admits_its_node_only_and_is_the_card_taken(
    pin: str, names: list[str] | None, feasible: list[str]
) -> None:
    state = ClusterState([node("a"), node("b"), node("c")])
    other = "b-g1" if pin == "b-g0" else "b-g0"  # full: only the pinned card fits on b
    book(state, gpu_pod("full", count=1, memory_mib=16000, uuids=frozenset({other})), "binpack")
    snap = state.snapshot()
    pod = gpu_pod(count=1, memory_mib=1000, uuids=frozenset({pin}))
    assert filter_nodes(snap, pod, names).feasible == feasible
    taken = pick_cards(snap, pod, "b", make_policy("binpack")).containers[0].slices[0].uuid
    assert taken == pin


@pytest.mark.parametrize("names", [["a", "b"], ["b", "a"], ["b"], ["c", "b"], ["a", "b", "c"]])
def test_an_excluded_card_is_excluded_on_its_node_only(names: list[str]) -> None:
    """b-g0 is card 0 of the second node: its row and column differ."""
    state = ClusterState([node(n, cards=1) for n in "abc"])
    pod = gpu_pod(count=1, memory_mib=1000, uuids_exclude=frozenset({"b-g0"}))
    assert filter_nodes(state.snapshot(), pod, names).feasible == [n for n in names if n != "b"]
