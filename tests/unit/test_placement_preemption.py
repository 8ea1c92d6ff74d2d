"""Victims for a higher-priority pod: the fewest, least important pods whose cards let it
fit, on the node where they matter least (pure core)."""

from __future__ import annotations

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
from tessera.placement import make_policy
from tessera.placement.preemption import Holder, choose_preemption, preemption_on_node

POLICY = make_policy("binpack")


def node(name: str = "n1", cards: int = 2) -> NodeInventory:
    return NodeInventory(name, make_cards(name, cards, "A100"), cpu_milli=64_000,
                         memory_mib=256 * 1024)  # fmt: skip


def request(name: str, count: int = 1, memory: int | None = None) -> PodRequest:
    gpu = GpuRequest(count, exclusive=True) if memory is None else GpuRequest(
        count, memory_mib=memory, cores_percent=10)  # fmt: skip
    return PodRequest("team", name, (ContainerRequest("main", gpu),))


def holder(inv: NodeInventory, name: str, priority: int, card: int, memory: int | None = None,
           evictable: bool = True) -> Holder:  # fmt: skip
    c = inv.cards[card]
    slices = (CardSlice(c.uuid, memory if memory else c.memory_mib, 10 if memory else 100),)
    a = Assignment(inv.name, (ContainerAssignment("main", slices, exclusive=memory is None),))
    return Holder(f"uid-{name}", priority, request(name, 1, memory), a, evictable)


def names(p: object) -> list[str]:
    assert p is not None
    return [v.key.partition("/")[2] for v in p.victims]  # type: ignore[attr-defined]


def test_the_least_important_pod_goes_and_no_more() -> None:
    inv = node()
    held = [holder(inv, "low", 10, 0), holder(inv, "mid", 20, 1)]
    got = preemption_on_node(inv, held, request("urgent"), 100, POLICY)
    assert names(got) == ["low"]
    assert got is not None and got.decision.node == "n1"
    [slice_] = got.decision.containers[0].slices
    assert slice_.uuid == inv.cards[0].uuid  # the card the victim frees
    two = preemption_on_node(inv, held, request("big", count=2), 100, POLICY)
    assert names(two) == ["low", "mid"]


def test_no_victim_of_equal_or_higher_priority_or_being_bound() -> None:
    inv = node()
    held = [holder(inv, "peer", 100, 0), holder(inv, "boss", 200, 1)]
    assert preemption_on_node(inv, held, request("urgent"), 100, POLICY) is None
    pinned = [holder(inv, "low", 10, 0, evictable=False), holder(inv, "boss", 200, 1)]
    assert preemption_on_node(inv, pinned, request("urgent"), 100, POLICY) is None


def test_nothing_is_evicted_where_the_pod_fits_already() -> None:
    inv = node()
    assert preemption_on_node(inv, [holder(inv, "low", 10, 0)], request("p"), 100, POLICY) is None


def test_slices_go_least_important_first_until_the_memory_is_there() -> None:
    inv = node(cards=1)
    total = inv.cards[0].memory_mib
    held = [holder(inv, f"s{i}", 10 + i, 0, memory=8000) for i in range(total // 8000)]
    free = total - 8000 * len(held)
    got = preemption_on_node(inv, held, request("p", memory=free + 12000), 100, POLICY)
    assert names(got) == ["s0", "s1"]  # two slices free 16,000 MiB: enough, and the least


def test_the_node_whose_victims_matter_least_is_chosen() -> None:
    a, b, c = node("a"), node("b"), node("c", cards=1)
    nodes = [
        (a, [holder(a, "a-mid", 50, 0), holder(a, "a-mid2", 50, 1)]),
        (b, [holder(b, "b-low", 10, 0), holder(b, "b-boss", 500, 1)]),
        (c, [holder(c, "c-low", 10, 0)]),
    ]
    got = choose_preemption(nodes, request("urgent"), 100, POLICY)
    assert got is not None and got.node == "b" and names(got) == ["b-low"]  # b before c: first
    assert choose_preemption(nodes, request("urgent"), 10, POLICY) is None
