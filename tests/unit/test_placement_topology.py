"""The topology policy's rules one at a time (placement/topology.py): a node bonus for
``count`` fitting cards on one NUMA node and for a card with ``count - 1`` fitting NVLink
peers, multi-card requests only; a card set chosen by its links, then by how many of its
cards share the seed's NUMA node, then by fullness, then by the lower column."""

from __future__ import annotations

import pytest

from tessera.cluster import ClusterState
from tessera.model.types import Card, NodeInventory
from tessera.placement import make_policy, pick_cards, place, score_nodes
from tests.unit.test_placement import book, share


def inv(
    name: str, numa: tuple[int, ...], links: dict[int, tuple[int, ...]] | None = None
) -> NodeInventory:
    """A node with one 16000 MiB card per ``numa`` entry; ``links``: card -> NVLink peers."""
    cards = tuple(
        Card(f"{name}-g{i}", i, "T4", 16000, numa_node=n, nvlink_peers=(links or {}).get(i, ()))
        for i, n in enumerate(numa)
    )
    return NodeInventory(name, cards, 8000, 64000)


UNKNOWN = (-1, -1, -1, -1)


def chosen(state: ClusterState, count: int) -> list[int]:
    a = pick_cards(state.snapshot(), share(count=count, mem=1000), "n", make_policy("topology"))
    return sorted(int(s.uuid.rsplit("g", 1)[1]) for s in a.containers[0].slices)


@pytest.mark.parametrize(
    "other",
    [
        inv("other", (0, 0, 1, 1)),  # exactly two cards on one NUMA node
        inv("other", UNKNOWN, {2: (3,), 3: (2,)}),  # one linked pair among unlinked cards
    ],
    ids=["numa", "nvlink"],
)
def test_a_two_card_request_prefers_the_node_that_can_keep_its_cards_together(
    other: NodeInventory,
) -> None:
    # "plain" comes first, so it wins every tie: only a bonus moves the pod.
    state = ClusterState([inv("plain", UNKNOWN), other])
    assert place(state.snapshot(), share(count=2), make_policy("topology")).node == "other"


def test_an_unknown_numa_node_is_not_a_numa_node() -> None:
    state = ClusterState([inv("plain", (0, 0, 1, 2)), inv("unknown", UNKNOWN)])
    scores = score_nodes(state.snapshot(), share(count=2), None, make_policy("topology"))
    assert scores["plain"] > scores["unknown"]


def test_a_link_to_a_card_the_pod_cannot_take_earns_nothing() -> None:
    """far's card 0 is linked to card 2 only, and card 2 is full: no fitting card has a
    fitting peer, so far scores as plain does (same cards, same use, no links)."""
    three = (-1, -1, -1)
    state = ClusterState([inv("plain", three), inv("far", three, {0: (2,), 2: (0,)})])
    for name in ("plain", "far"):
        full = share(name=f"full-{name}", mem=16000, cores=10, uuids=frozenset({f"{name}-g2"}))
        book(state, full, node_name=name)
    scores = score_nodes(state.snapshot(), share(count=2), None, make_policy("topology"))
    assert scores["far"] == scores["plain"]


def test_a_one_card_request_is_scored_as_binpack_scores_it() -> None:
    state = ClusterState([inv("plain", UNKNOWN), inv("other", (0, 0, 1, 1), {0: (1,), 1: (0,)})])
    for policy in ("topology", "binpack"):
        scores = score_nodes(state.snapshot(), share(count=1), None, make_policy(policy))
        assert scores["plain"] == scores["other"], policy


def test_the_set_with_the_most_links_wins() -> None:
    state = ClusterState([inv("n", (0, 0, 0, 0), {1: (2,), 2: (1,)})])
    assert chosen(state, 2) == [1, 2]


def test_without_links_the_set_on_one_numa_node_wins_then_the_fuller() -> None:
    state = ClusterState([inv("n", (0, 1, 0, 1))])
    assert chosen(state, 2) in ([0, 2], [1, 3])
    book(state, share(name="x", mem=4000, cores=10), node_name="n")  # binpack: card 0
    book(state, share(name="y", mem=4000, cores=10), node_name="n")  # card 0 again
    book(state, share(name="z", mem=2000, cores=10, uuids=frozenset({"n-g1"})), node_name="n")
    assert chosen(state, 2) == [0, 2]  # numa 0 holds more than numa 1
    assert chosen(state, 3) == [0, 1, 2]  # the third card crosses: the fuller of 1 and 3


def test_between_two_numa_nodes_alike_the_fuller_set_wins_whatever_the_seed_order() -> None:
    state = ClusterState([inv("n", (0, 1, 0, 1))])
    for card in (1, 3):  # numa 1's cards, later seeds than numa 0's
        pin = frozenset({f"n-g{card}"})
        book(state, share(name=f"x{card}", mem=4000, cores=10, uuids=pin), node_name="n")
    assert chosen(state, 2) == [1, 3]


def test_a_set_on_one_numa_node_beats_a_fuller_set_across_two() -> None:
    state = ClusterState([inv("n", (0, 1, 1))])
    book(state, share(name="x", mem=8000, cores=10, uuids=frozenset({"n-g0"})), node_name="n")
    assert chosen(state, 2) == [1, 2]


def test_equal_cards_go_lowest_column_first() -> None:
    assert chosen(ClusterState([inv("n", UNKNOWN)]), 2) == [0, 1]
