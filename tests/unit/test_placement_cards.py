"""Concrete cards for a pod's GPU containers on one node (placement/cards.py): which cards
a container may take, and how a pod's own containers share a card -- app slices add up,
an init slice runs before them and needs only what was free before the pod came."""

from __future__ import annotations

import pytest

from tessera.cluster import ClusterState
from tessera.errors import PlacementError
from tessera.model.podspec import parse_pod
from tessera.model.types import Card, ContainerRequest, GpuRequest, NodeInventory, PodRequest
from tessera.placement import filter_nodes, make_policy, pick_cards, place, score_nodes
from tests.unit.test_placement import book, node


def inventory(*cards: Card) -> NodeInventory:
    return NodeInventory(name="n", cards=cards, cpu_milli=8000, memory_mib=64000)


def card(i: int, memory: int = 16000, model: str = "T4", **kw: object) -> Card:
    return Card(f"n-g{i}", i, model, memory, **kw)  # type: ignore[arg-type]


def share(mem: int, cores: int = 10, **kw: object) -> GpuRequest:
    return GpuRequest(count=1, memory_mib=mem, cores_percent=cores, **kw)  # type: ignore[arg-type]


WHOLE = GpuRequest(count=1, exclusive=True)


def pod(*containers: tuple[str, GpuRequest, bool]) -> PodRequest:
    """Containers as (name, request, init)."""
    return PodRequest(
        "ns", "p", tuple(ContainerRequest(n, g, init) for n, g, init in containers), 0, 0
    )


def cards_of(state: ClusterState, p: PodRequest) -> dict[str, list[str]]:
    """Container -> card UUIDs taken, with binpack (the tightest card that fits)."""
    a = pick_cards(state.snapshot(), p, "n", make_policy("binpack"))
    return {c.name: [s.uuid for s in c.slices] for c in a.containers}


# n-g0 is the smaller card: binpack takes it whenever it may.
SMALL_FIRST = (card(0, memory=8000), card(1))


def test_binpack_takes_the_smaller_card_when_nothing_rules_it_out() -> None:
    for cards in (SMALL_FIRST, (card(0, memory=8000), card(1, model="A100"))):
        state = ClusterState([inventory(*cards)])
        assert cards_of(state, pod(("main", share(1000), False))) == {"main": ["n-g0"]}


@pytest.mark.parametrize(
    ("g0", "request_"),
    [
        ({"healthy": False}, share(1000)),
        ({"cordoned": True}, share(1000)),
        ({}, share(1000, uuids=frozenset({"n-g1"}))),
        ({}, share(1000, uuids_exclude=frozenset({"n-g0"}))),
        ({}, share(1000, models=frozenset({"A100"}))),
    ],
    ids=["unhealthy", "cordoned", "other-pinned", "excluded", "other-model"],
)
def test_a_card_out_of_service_or_not_allowed_is_passed_over(
    g0: dict[str, object], request_: GpuRequest
) -> None:
    state = ClusterState([inventory(card(0, memory=8000, **g0), card(1, model="A100"))])
    assert cards_of(state, pod(("main", request_, False))) == {"main": ["n-g1"]}


def test_a_card_another_pod_holds_whole_is_passed_over() -> None:
    state = ClusterState([inventory(*SMALL_FIRST)])
    book(state, PodRequest("ns", "whole", (ContainerRequest("main", WHOLE),), 0, 0),
         node_name="n")  # fmt: skip
    assert state.snapshot().cards_free("n")[0].exclusive  # binpack gave it n-g0
    assert cards_of(state, pod(("main", share(1000), False))) == {"main": ["n-g1"]}


def test_the_pods_own_whole_card_takes_none_of_its_other_slices() -> None:
    state = ClusterState([inventory(card(0), card(1))])
    got = cards_of(state, pod(("whole", WHOLE, False), ("share", share(1000), False)))
    assert got["whole"] != got["share"]
    one = ClusterState([inventory(card(0))])
    with pytest.raises(PlacementError):
        cards_of(one, pod(("whole", WHOLE, False), ("share", share(1000), False)))


def test_an_init_container_may_hold_a_card_whole_before_the_app_slice() -> None:
    one = ClusterState([inventory(card(0))])
    assert cards_of(one, pod(("setup", WHOLE, True), ("main", share(1000), False))) == {
        "setup": ["n-g0"],
        "main": ["n-g0"],
    }


@pytest.mark.parametrize(
    ("slices", "fits"),
    [
        ([(10000, 10), (6000, 10)], True),  # app slices add up to the card's 16000 MiB
        ([(10000, 10), (7000, 10)], False),
        ([(1000, 60), (1000, 40)], True),  # and to its 100 % of cores
        ([(1000, 60), (1000, 50)], False),
    ],
)
def test_app_slices_of_one_pod_add_up_on_a_card(slices: list[tuple[int, int]], fits: bool) -> None:
    one = ClusterState([inventory(card(0))])
    p = pod(*((f"c{i}", share(m, k), False) for i, (m, k) in enumerate(slices)))
    if fits:
        assert all(v == ["n-g0"] for v in cards_of(one, p).values())
    else:
        with pytest.raises(PlacementError, match="does not fit on n"):
            cards_of(one, p)


@pytest.mark.parametrize("init_mem", [16000, 10000])
def test_an_init_slice_needs_only_what_was_free_before_the_pod(init_mem: int) -> None:
    # 10000 MiB of app slice and an init slice up to the whole card: the init container
    # runs first, so the pod holds max(init, app), not the sum.
    one = ClusterState([inventory(card(0))])
    p = pod(("setup", share(init_mem, 100), True), ("main", share(10000, 100), False))
    assert cards_of(one, p) == {"setup": ["n-g0"], "main": ["n-g0"]}


@pytest.mark.parametrize(("apps", "slots", "fits"), [(3, 3, True), (3, 2, False), (1, 1, True)])
def test_a_card_takes_no_more_of_the_pods_containers_than_it_has_slots(
    apps: int, slots: int, fits: bool
) -> None:
    one = ClusterState([inventory(card(0, slots=slots))])
    p = pod(("setup", share(1000), True), *((f"c{i}", share(1000), False) for i in range(apps)))
    if fits:
        assert all(v == ["n-g0"] for v in cards_of(one, p).values())
    else:
        with pytest.raises(PlacementError):
            cards_of(one, p)


def test_scores_leave_out_a_node_whose_cards_cannot_hold_the_containers_together() -> None:
    # Each 10000 MiB slice fits on a's one card by itself, both together do not.
    state = ClusterState([node("a", cards=1), node("b", cards=2)])
    p = pod(("one", share(10000), False), ("two", share(10000), False))
    assert set(score_nodes(state.snapshot(), p, None, make_policy("binpack"))) == {"b"}
    assert filter_nodes(state.snapshot(), p).feasible == ["b"]


def test_place_falls_back_to_the_next_best_node_when_the_best_cannot_hold_them_together() -> None:
    # binpack ranks a (fullest) > b > c; a's one card cannot hold both 10000 MiB slices.
    state = ClusterState([node("a", cards=1), node("b", cards=2), node("c", cards=2)])
    for name in ("a", "b"):
        book(state, PodRequest("ns", f"x-{name}", (ContainerRequest("m", share(2000)),), 0, 0),
             node_name=name)  # fmt: skip
    p = pod(("one", share(10000), False), ("two", share(10000), False))
    scores = score_nodes(state.snapshot(), PodRequest("ns", "q", p.containers[:1], 0, 0), None,
                         make_policy("binpack"))  # fmt: skip
    assert scores["a"] > scores["b"] > scores["c"]
    assert place(state.snapshot(), p, make_policy("binpack")).node == "b"


def test_a_card_is_not_over_committed_by_an_init_container_beside_a_gpu_sidecar() -> None:
    # proxy (a sidecar, 2,000 MiB) starts, then load (8,000) runs beside it: 10,000 MiB at
    # once, more than the 9,000 MiB card. Counted as "the larger of one init slice and the
    # app slices", the pod looked like 8,000 and was placed there.
    spec = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "u"},
        "spec": {
            "initContainers": [
                {"name": "proxy", "restartPolicy": "Always",
                 "resources": {"limits": {"tessera.io/gpu-memory": "2000"}}},
                {"name": "load", "resources": {"limits": {"tessera.io/gpu-memory": "8000"}}},
            ],
            "containers": [
                {"name": "app", "resources": {"limits": {"tessera.io/gpu-memory": "1000"}}}
            ],
        },
    }  # fmt: skip
    request = parse_pod(spec)
    assert request is not None
    small = ClusterState([inventory(card(0, memory=9000))])
    with pytest.raises(PlacementError):
        pick_cards(small.snapshot(), request, "n", make_policy("binpack"))
    roomy = ClusterState([inventory(card(0, memory=11000))])
    a = pick_cards(roomy.snapshot(), request, "n", make_policy("binpack"))
    assert a.footprint() == {"n-g0": (11000, 0, False)}  # all three held at once, at most
