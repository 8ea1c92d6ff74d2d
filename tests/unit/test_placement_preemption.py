"""Victims for a higher-priority pod: the fewest, least important pods whose cards let it
fit, on the node where they matter least (pure core)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.cluster.state import ClusterState
from tessera.errors import PlacementError
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
from tessera.placement.place import place
from tessera.placement.preemption import (
    Holder,
    Preemption,
    choose_preemption,
    preemption_on_node,
)

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


def test_the_most_important_victim_decides_where() -> None:
    # On d the least important pod of all must go, but with a pod more important than
    # either of e's: e is chosen.
    d, e = node("d", cards=1), node("e", cards=1)
    nodes = [
        (d, [holder(d, "d-least", 1, 0, memory=15000), holder(d, "d-30", 30, 0, memory=15000)]),
        (e, [holder(e, "e-20", 20, 0, memory=15000), holder(e, "e-20b", 20, 0, memory=15000)]),
    ]
    got = choose_preemption(nodes, request("urgent", memory=30000), 100, POLICY)
    assert got is not None and got.node == "e" and names(got) == ["e-20", "e-20b"]


def _reference(
    inv: NodeInventory, holders: list[Holder], pod: PodRequest, priority: int
) -> tuple[list[str], Assignment | None] | None:
    """The reprieve with the placement core asked after every candidate given back: what
    the witness shortcut of ``preemption_on_node`` must agree with."""

    def fit(state: ClusterState) -> Assignment | None:
        try:
            return place(state.snapshot(), pod, POLICY).assignment
        except PlacementError:
            return None

    state = ClusterState([inv])
    candidates = []
    for h in holders:
        if h.evictable and h.priority < priority:
            candidates.append(h)
        else:
            state.assign(h.request, h.assignment)
    if not candidates or fit(state) is None:
        return None
    victims = sorted(candidates, key=lambda h: (h.priority, h.key))
    for h in sorted(candidates, key=lambda h: (-h.priority, h.key)):
        try:
            state.assign(h.request, h.assignment)
        except PlacementError:
            continue
        if fit(state) is not None:
            victims.remove(h)
        else:
            state.release(h.key)
    decision = fit(state)
    if not victims or decision is None:
        return None
    return [v.key for v in victims], decision


_CPU = st.sampled_from([0, 500, 2000, 3000])
_HOST_MEMORY = st.sampled_from([0, 1024, 3072, 4096])  # MiB, of the node's 8192
_ask = st.one_of(
    st.tuples(st.integers(1, 2), st.none(), _CPU, _HOST_MEMORY),  # whole cards
    st.tuples(st.just(1), st.sampled_from([4000, 8000, 10000, 20000]), _CPU, _HOST_MEMORY),
)

Ask = tuple[int, int | None, int] | tuple[int, int | None, int, int]


def _request(name: str, ask: Ask) -> PodRequest:
    """(cards, GPU MiB per card or None for whole cards, CPU milli[, host memory MiB])."""
    count, memory, cpu, *host = ask
    gpu = GpuRequest(count, exclusive=True) if memory is None else GpuRequest(
        count, memory_mib=memory, cores_percent=10)  # fmt: skip
    return PodRequest("team", name, (ContainerRequest("main", gpu),), cpu_milli=cpu,
                      memory_mib=host[0] if host else 0)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    asks=st.lists(st.tuples(_ask, st.sampled_from([5, 10, 20, 100]), st.booleans()), max_size=14),
    wanted=_ask,
    cards=st.integers(1, 4),
)
def test_the_reprieve_shortcut_chooses_the_victims_asking_every_time_would(
    asks: list[tuple[Ask, int, bool]], wanted: Ask, cards: int
) -> None:
    inv = NodeInventory("n1", make_cards("n1", cards, "A100"), cpu_milli=6000,
                        memory_mib=8192)  # fmt: skip
    state, holders = ClusterState([inv]), []
    for i, (ask, prio, evictable) in enumerate(asks):  # fill the node as a scheduler would
        req = _request(f"h{i:02d}", ask)
        try:
            a = place(state.snapshot(), req, POLICY).assignment
        except PlacementError:
            continue
        state.assign(req, a)
        holders.append(Holder(f"uid-{i}", prio, req, a, evictable or prio >= 50))
    pod = _request("urgent", wanted)
    got = preemption_on_node(inv, holders, pod, 50, POLICY)
    expected = _reference(inv, holders, pod, 50)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert ([v.key for v in got.victims], got.decision) == expected


def whole_card(inv: NodeInventory, card: int, name: str, priority: int, ask: Ask) -> Holder:
    """A pod holding card ``card`` of ``inv`` whole, asking ``ask`` as ``_request`` reads it."""
    c = inv.cards[card]
    whole = (CardSlice(c.uuid, c.memory_mib, 100),)
    a = Assignment(inv.name, (ContainerAssignment("main", whole, exclusive=True),))
    return Holder(f"uid-{name}", priority, _request(name, ask), a)


def test_a_pod_given_back_on_another_card_can_still_take_the_cpu_the_preemptor_needs() -> None:
    inv = NodeInventory("n1", make_cards("n1", 2, "A100"), cpu_milli=4000, memory_mib=65536)
    # x on one card, y (more important) on the other
    holders = [
        whole_card(inv, 0, "x", 10, (1, None, 0)),
        whole_card(inv, 1, "y", 20, (1, None, 2000)),
    ]
    pod = _request("urgent", (1, None, 3000))
    got = preemption_on_node(inv, holders, pod, 50, POLICY)
    # y frees the CPU the urgent pod needs; x alone would free a card but not the CPU.
    assert names(got) == ["y"]
    assert ([v.key for v in got.victims], got.decision) == _reference(inv, holders, pod, 50)


def test_a_pod_on_a_card_out_of_service_does_not_stop_preemption_elsewhere_on_the_node() -> None:
    """A node where a pod holds a cordoned card: that pod is booked as it is, the cordoned
    card is not freed for the urgent pod, and the low-priority pod on another card goes."""
    from dataclasses import replace

    base = node(cards=3)
    inv = replace(base, cards=(replace(base.cards[0], cordoned=True), *base.cards[1:]))
    held = [holder(inv, "a-on-cordoned", 10, 0), holder(inv, "low", 10, 1),
            holder(inv, "mid", 20, 2)]  # fmt: skip
    got = preemption_on_node(inv, held, request("urgent"), 100, POLICY)
    assert names(got) == ["low"]  # not the cordoned card's pod, though it ranks first
    assert got is not None
    assert [s.uuid for s in got.decision.containers[0].slices] == [inv.cards[1].uuid]


def test_a_more_important_pod_on_a_cordoned_card_is_booked_as_it_is() -> None:
    """A pod that is no candidate, on a card out of service, is already there: it is
    counted where it is, not refused as a new placement would be."""
    from dataclasses import replace

    base = node(cards=2)
    inv = replace(base, cards=(replace(base.cards[0], cordoned=True), base.cards[1]))
    held = [holder(inv, "boss", 200, 0), holder(inv, "low", 10, 1)]
    assert names(preemption_on_node(inv, held, request("urgent"), 100, POLICY)) == ["low"]


def test_the_cpu_and_memory_of_pods_that_stay_count_when_a_candidate_is_given_back() -> None:
    """boss (no candidate) takes most of the node's CPU, or memory; low, on a card the
    urgent pod does not need, holds what is left of it: low goes, though its card is not
    the one the urgent pod takes."""
    inv = NodeInventory("n1", make_cards("n1", 3, "A100"), cpu_milli=10_000, memory_mib=10_000)
    for boss, low, pod in (
        ((1, None, 8000, 0), (1, None, 1500, 0), (1, None, 1000, 0)),
        ((1, None, 0, 8000), (1, None, 0, 1500), (1, None, 0, 1000)),
    ):
        holders = [whole_card(inv, 0, "boss", 200, boss), whole_card(inv, 2, "low", 10, low)]
        got = preemption_on_node(inv, holders, _request("urgent", pod), 50, POLICY)
        assert names(got) == ["low"]
        assert got is not None
        assert got.decision.containers[0].slices[0].uuid == inv.cards[1].uuid


def test_a_candidate_that_cannot_be_booked_again_does_not_stop_the_others_given_back() -> None:
    inv = node(cards=2)
    stale = holder(node("elsewhere"), "stale", 15, 0)  # booked on a card not on this node
    held = [stale, holder(inv, "mid", 12, 1), holder(inv, "low", 10, 0)]
    got = preemption_on_node(inv, held, request("urgent"), 100, POLICY)
    assert names(got) == ["low", "stale"]  # mid, given back after stale, stays


def test_a_preemption_says_who_goes_for_cards_and_who_for_quota_room() -> None:
    inv = node(cards=2)
    low, mid = holder(inv, "low", 10, 0), holder(inv, "mid", 20, 1)
    quota = holder(inv, "q", 5, 0)
    decision = Assignment("n1", ())
    p = Preemption("n1", (quota, low, mid), decision, for_quota=frozenset({quota.key}))
    assert p.describe() == (
        "evicting on n1 for cards: team/low (priority 10), team/mid (priority 20); "
        "for quota room: team/q (priority 5)"
    )
    assert Preemption("n1", (low,), decision).describe() == (
        "evicting on n1 for cards: team/low (priority 10)"
    )
