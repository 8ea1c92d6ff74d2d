"""What a hold keeps for its preemptor: its placement once the victims are gone, not the
whole node; the whole node when the placement is not known."""

from __future__ import annotations

from tessera.cluster.state import ClusterState
from tessera.model.clusterspec import make_cards
from tessera.model.types import (
    Assignment,
    CardSlice,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    NodeInventory,
    PodRequest,
)
from tessera.scheduler.holds import Hold, HoldBook, leaves_room
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.web import gpu_map
from tests.unit._scheduler_world import node_obj

INV = NodeInventory("n1", make_cards("n1", 3, "A100"), cpu_milli=8_000, memory_mib=64 * 1024)
CARDS = [c.uuid for c in INV.cards]


def pod(name: str, memory: int | None = None, cpu: int = 0) -> PodRequest:
    gpu = GpuRequest(1, exclusive=True) if memory is None else GpuRequest(
        1, memory_mib=memory, cores_percent=10)  # fmt: skip
    return PodRequest("team", name, (ContainerRequest("main", gpu),), cpu_milli=cpu)


def on(card: int, memory: int | None = None) -> Assignment:
    mib = INV.cards[card].memory_mib if memory is None else memory
    cores = 100 if memory is None else 10
    slices = (CardSlice(CARDS[card], mib, cores),)
    return Assignment("n1", (ContainerAssignment("main", slices, exclusive=memory is None),))


def hold(key: str, victims: set[str], request: PodRequest | None, decision: Assignment | None,
         priority: int = 1000) -> Hold:  # fmt: skip
    return Hold(key, "u", priority, "n1", frozenset(victims), 60.0, request=request,
                decision=decision)  # fmt: skip


def cluster() -> ClusterState:
    """v0 (a victim) on card 0, v1 (a victim) on card 1; card 2 free."""
    state = ClusterState([INV])
    state.assign(pod("v0"), on(0))
    state.assign(pod("v1"), on(1))
    return state


def test_a_pod_may_take_what_the_preemptor_does_not_need() -> None:
    first = hold("team/p", {"team/v0"}, pod("p"), on(0))
    assert leaves_room(cluster(), [first], pod("x"), on(2))
    assert not leaves_room(cluster(), [first], pod("x", memory=1000), on(0, 1000))


def test_every_hold_on_the_node_keeps_its_placement() -> None:
    first = hold("team/p", {"team/v0"}, pod("p"), on(0))
    second = hold("team/q", {"team/v1"}, pod("q", memory=30000), on(1, 30000))
    assert not leaves_room(cluster(), [first, second], pod("x", memory=20000), on(1, 20000))
    assert leaves_room(cluster(), [first, second], pod("x", memory=10000), on(1, 10000))


def test_the_node_cpu_counts_for_the_preemptor_too() -> None:
    first = hold("team/p", {"team/v0"}, pod("p", cpu=6000), on(0))
    assert leaves_room(cluster(), [first], pod("x", cpu=2000), on(2))
    assert not leaves_room(cluster(), [first], pod("x", cpu=2001), on(2))


def test_a_hold_whose_placement_is_not_known_holds_the_whole_node() -> None:
    adopted = hold("team/p", {"team/v0"}, None, None)  # from another leader's annotation
    assert not leaves_room(cluster(), [adopted], pod("x", memory=1000), on(2, 1000))
    # A record without its placement, for a pod whose spec is known: the same.
    unplaced = hold("team/p", {"team/v0"}, pod("p"), None)
    assert not leaves_room(cluster(), [unplaced], pod("x", memory=1000), on(2, 1000))


def test_holds_against_a_pod_are_those_for_pods_as_important_or_more() -> None:
    book = HoldBook()
    book.put(hold("team/p", {"team/v0"}, pod("p"), on(0), priority=1000))
    book.put(hold("team/q", {"team/v1"}, pod("q"), on(1), priority=100))
    assert {n: [h.key for h in hs] for n, hs in book.against("team/x", 100).items()} == {
        "n1": ["team/p", "team/q"]}  # fmt: skip
    assert [h.key for h in book.against("team/x", 500)["n1"]] == ["team/p"]
    assert book.against("team/p", 1000) == {}  # not against itself


def test_the_gpu_map_says_what_of_a_node_is_held() -> None:
    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 3, "A100")])
    cards = state.cluster.node("n1").cards
    two = Assignment("n1", (ContainerAssignment("main", tuple(
        CardSlice(c.uuid, c.memory_mib, 100) for c in cards[1:]), exclusive=True),))  # fmt: skip
    state.holds.put(hold("team/p", {"team/v"}, pod("p"), two))
    state.holds.put(hold("team/q", {"team/w"}, None, None, priority=500))
    [node] = gpu_map(state).nodes
    assert node.held == (
        "held for team/p (priority 1000): cards 1, 2; team/q (priority 500): the whole node"
    )


def test_holds_may_come_as_any_iterable() -> None:
    first = hold("team/p", {"team/v0"}, pod("p"), on(0))
    assert leaves_room(cluster(), iter([first]), pod("x"), on(2))
    assert not leaves_room(cluster(), iter([first]), pod("x", memory=1000), on(0, 1000))
