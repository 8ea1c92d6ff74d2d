"""ClusterState: bookings, releases, node events, snapshots and the invariant check."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.cluster import ClusterState
from tessera.cluster.booking import Booking
from tessera.cluster.invariants import check
from tessera.errors import PlacementError, SpecError
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
from tessera.placement import make_policy, place


def node(
    name: str, cards: int = 2, memory: int = 16000, cpu: int = 8000, model: str = "T4"
) -> NodeInventory:
    return NodeInventory(
        name=name,
        cards=tuple(Card(f"{name}-g{i}", i, model, memory) for i in range(cards)),
        cpu_milli=cpu,
        memory_mib=64000,
    )


def pod(name: str, gpu: GpuRequest | None = None, cpu: int = 1000) -> PodRequest:
    return PodRequest("ns", name, (ContainerRequest("main", gpu),), cpu_milli=cpu, memory_mib=1000)


def on(
    node_name: str, *uuids: str, mem: int = 4000, cores: int = 30, exclusive: bool = False
) -> Assignment:
    slices = tuple(CardSlice(u, mem, cores) for u in uuids)
    return Assignment(node_name, (ContainerAssignment("main", slices, exclusive=exclusive),))


SHARE = GpuRequest(count=1, memory_mib=4000, cores_percent=30)


def test_assign_books_and_release_gives_back() -> None:
    state = ClusterState([node("a")])
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    free = {
        c.card.uuid: (c.memory_mib, c.cores_percent, c.tenants)
        for c in state.snapshot().cards_free("a")
    }
    assert free == {"a-g0": (12000, 70, 1), "a-g1": (16000, 100, 0)}
    assert state.snapshot().cpu_free("a") == 7000
    assert state.release("ns/p") is True
    assert state.release("ns/p") is False
    assert state.snapshot().cards_free("a")[0].memory_mib == 16000
    assert state.snapshot().cpu_free("a") == 8000
    assert state.check_invariants() == []


@pytest.mark.parametrize(
    ("existing", "request_", "assignment", "reason"),
    [
        ([], SHARE, on("zz", "a-g0"), "node not in the cluster state"),
        ([], SHARE, on("a", "b-g0"), "card b-g0 is not on this node"),
        (
            [],
            GpuRequest(count=1, memory_mib=20000),
            on("a", "a-g0", mem=20000),
            "has 16000 MiB free, needs 20000",
        ),
        (
            [("x", SHARE, on("a", "a-g0", cores=80))],
            SHARE,
            on("a", "a-g0"),
            "has 20% cores free, needs 30",
        ),
        (
            [("x", SHARE, on("a", "a-g0"))],
            GpuRequest(count=1, exclusive=True),
            on("a", "a-g0", mem=16000, cores=100, exclusive=True),
            "has tenants",
        ),
        (
            [
                (
                    "x",
                    GpuRequest(count=1, exclusive=True),
                    on("a", "a-g0", mem=16000, cores=100, exclusive=True),
                )
            ],
            SHARE,
            on("a", "a-g0"),
            "held whole",
        ),
        (
            [],
            GpuRequest(count=2, memory_mib=4000, cores_percent=30),
            on("a", "a-g0"),
            "1 cards given, 2 requested",
        ),
        (
            [],
            GpuRequest(count=2, memory_mib=4000, cores_percent=30),
            on("a", "a-g0", "a-g0"),
            "a card appears twice",
        ),
        (
            [],
            GpuRequest(count=1, memory_mib=1, models_exclude=frozenset({"T4"})),
            on("a", "a-g0", mem=1),
            "model T4) not allowed",
        ),
        (
            [],
            GpuRequest(count=1, memory_mib=1, uuids_exclude=frozenset({"a-g0"})),
            on("a", "a-g0", mem=1),
            "not allowed",
        ),
        ([("x", SHARE, on("a", "a-g1"))], SHARE, on("a", "a-g0"), "insufficient cpu"),
        ([], SHARE, on("a", "a-g0", exclusive=True), "exclusive/init flags differ"),
        (
            [],
            SHARE,
            Assignment(
                "a", (ContainerAssignment("main", (CardSlice("a-g0", 4000, 30),), init=True),)
            ),
            "exclusive/init flags differ",
        ),
    ],
)
def test_assign_refuses_what_breaks_an_invariant_and_changes_nothing(
    existing: list[tuple[str, GpuRequest, Assignment]],
    request_: GpuRequest,
    assignment: Assignment,
    reason: str,
) -> None:
    state = ClusterState([node("a"), node("b")])
    for name, gpu, a in existing:
        state.assign(pod(name, gpu, cpu=7500 if reason == "insufficient cpu" else 1000), a)
    before = state.snapshot()
    with pytest.raises(PlacementError) as err:
        state.assign(pod("p", request_), assignment)
    assert reason in str(err.value)
    assert reason in err.value.reasons[assignment.node]
    after = state.snapshot()
    assert after is before  # nothing changed, not even the generation
    assert state.booking("ns/p") is None


def test_unhealthy_card_takes_nothing_new() -> None:
    inv = node("a")
    sick = NodeInventory(
        "a", (inv.cards[0], Card("a-g1", 1, "T4", 16000, healthy=False)), 8000, 64000
    )
    state = ClusterState([sick])
    with pytest.raises(PlacementError, match="unhealthy"):
        state.assign(pod("p", SHARE), on("a", "a-g1"))


def test_double_assign_is_a_spec_error_naming_the_pod() -> None:
    state = ClusterState([node("a")])
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    with pytest.raises(SpecError, match="pod: already assigned"):
        state.assign(pod("p", SHARE), on("a", "a-g1"))


def test_exclusive_booking_takes_the_whole_card() -> None:
    state = ClusterState([node("a")])
    whole = GpuRequest(count=1, exclusive=True)
    state.assign(pod("p", whole), on("a", "a-g0", mem=16000, cores=100, exclusive=True))
    card = state.snapshot().cards_free("a")[0]
    assert (card.memory_mib, card.cores_percent, card.exclusive) == (0, 0, True)
    state.release("ns/p")
    card = state.snapshot().cards_free("a")[0]
    assert (card.memory_mib, card.cores_percent, card.exclusive) == (16000, 100, False)


def test_snapshot_is_cheap_and_never_moves() -> None:
    state = ClusterState([node("a")])
    first = state.snapshot()
    assert state.snapshot() is first  # nothing changed: the same object
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    second = state.snapshot()
    assert second is not first and second.generation > first.generation
    assert first.cards_free("a")[0].memory_mib == 16000  # the old view did not move
    assert second.cards_free("a")[0].memory_mib == 12000
    assert not first.tables.free_mem.flags.writeable


def test_copy_on_write_reuses_free_tables_and_never_moves_a_held_view() -> None:
    """The arrays of a snapshot nobody holds are reused (only changed rows copied); the
    arrays of one still held, or a slice of them, are never written."""
    state = ClusterState([node("a"), node("b"), node("c")])
    held = state.snapshot()
    held_slice = held.tables.free_mem[1:]  # a view outliving nothing but itself
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    state.snapshot()  # dropped at once, like a scheduling cycle's
    state.assign(pod("q", SHARE), on("b", "b-g1"))
    state.snapshot()
    state.release("ns/p")
    state.assign(pod("r", SHARE), on("c", "c-g0"))
    assert [c.memory_mib for c in held.cards_free("a")] == [16000, 16000]
    assert held_slice[:2].tolist() == [[16000, 16000], [16000, 16000]]
    del held
    reused = state._t
    state.snapshot()
    state.assign(pod("s", SHARE), on("a", "a-g1"))
    state.snapshot()
    state.assign(pod("t", SHARE), on("b", "b-g0"))
    assert state._t is reused or state._t in state._spares  # ping-pong, no fresh copies
    now = state.snapshot()
    free = {n: [c.memory_mib for c in now.cards_free(n)] for n in "abc"}
    assert free == {"a": [16000, 12000], "b": [12000, 12000], "c": [12000, 16000]}
    assert state.check_invariants() == []


def test_a_slice_of_one_table_keeps_every_table_of_its_snapshot_from_reuse() -> None:
    state = ClusterState([node("a"), node("b")])
    snap = state.snapshot()
    kept = snap.tables.free_mem[0]  # a's cards, as they were
    del snap
    state.assign(pod("p", SHARE), on("a", "a-g0"))  # the old tables become a spare
    state.snapshot()
    state.assign(pod("q", SHARE), on("a", "a-g1"))  # a spare is wanted: not that one
    assert kept.tolist() == [16000, 16000]
    assert [c.memory_mib for c in state.snapshot().cards_free("a")] == [12000, 12000]


def test_row_generation_changes_only_where_something_changed() -> None:
    state = ClusterState([node("a"), node("b")])
    s1 = state.snapshot()
    state.assign(pod("p", SHARE), on("b", "b-g0"))
    s2 = state.snapshot()
    ra, rb = s2.rows["a"], s2.rows["b"]
    assert s2.tables.generation[ra] == s1.tables.generation[ra]
    assert s2.tables.generation[rb] > s1.tables.generation[rb]


def test_node_events() -> None:
    state = ClusterState([node("a"), node("b")])
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    with pytest.raises(SpecError, match="node: already in the cluster state"):
        state.add_node(node("a"))
    with pytest.raises(SpecError, match="card uuid: already on node a"):
        state.add_node(NodeInventory("c", node("a").cards, 1, 1))
    # update keeps bookings on the cards still there
    state.update_node(node("a", cards=4))
    assert state.snapshot().cards_free("a")[0].memory_mib == 12000
    assert len(state.snapshot().cards_free("a")) == 4
    assert state.check_invariants() == []
    # remove takes the node's pods with it; the row is reused
    state.remove_node("a")
    assert "a" not in state.snapshot() and state.booking("ns/p") is None
    state.add_node(node("c", cards=8))
    snap = state.snapshot()
    assert snap.node_names() == ["c", "b"]
    assert [c.memory_mib for c in snap.cards_free("c")] == [16000] * 8
    assert state.check_invariants() == []
    with pytest.raises(SpecError, match="node: not in the cluster state"):
        state.remove_node("a")


def test_a_removed_node_is_gone_from_every_view_placement_reads() -> None:
    """Its row stays in the arrays for reuse; nothing may read it as a node."""
    state = ClusterState([node("a"), node("b")])
    assert "a" in state and len(state) == 2
    state.remove_node("a")
    assert "a" not in state and "b" in state and len(state) == 1
    whole = GpuRequest(count=1, memory_mib=20000, cores_percent=30)  # more than any card
    with pytest.raises(PlacementError) as err:
        place(state.snapshot(), pod("big", whole), make_policy("binpack"))
    assert set(err.value.reasons) == {"b"}
    assert place(state.snapshot(), pod("p", SHARE), make_policy("binpack")).node == "b"


def test_a_card_of_one_mib_is_a_card() -> None:
    tiny = NodeInventory("a", (Card("a-g0", 0, "T4", 1),), 8000, 64000)
    assert ClusterState([tiny]).snapshot().cards_free("a")[0].memory_mib == 1


def test_update_that_drops_a_booked_card_is_reported() -> None:
    state = ClusterState([node("a")])
    state.assign(pod("p", SHARE), on("a", "a-g1"))
    state.update_node(node("a", cards=1))
    assert any("a-g1, which is not on a" in p for p in state.check_invariants())
    # The pod can still go: what it held on the card that left is simply not given back.
    assert state.release("ns/p") is True
    assert state.check_invariants() == []
    assert state.snapshot().cards_free("a")[0].memory_mib == 16000


def test_a_card_without_memory_is_refused() -> None:
    empty = NodeInventory("a", (Card("a-g0", 0, "T4", 0),), 8000, 64000)
    with pytest.raises(SpecError, match="card a-g0 memory: must be > 0"):
        ClusterState([empty])


def test_node_without_keeps_pods_on_cards_taken_out_of_service() -> None:
    """A pod booked on a card that has since turned unhealthy still holds it: the node as
    it will be once other pods leave (preemption's question) keeps that booking."""
    state = ClusterState([node("a")])
    state.assign(pod("p", SHARE), on("a", "a-g1"))
    state.assign(pod("q", SHARE), on("a", "a-g0"))
    sick = node("a").cards[1]
    state.update_node(
        NodeInventory("a", (node("a").cards[0], Card(sick.uuid, 1, "T4", 16000, healthy=False)),
                      8000, 64000)
    )  # fmt: skip
    after = state.node_without("a", {"ns/q"})
    assert after.booking("ns/p") is not None and after.booking("ns/q") is None
    assert after.snapshot().cards_free("a")[1].memory_mib == 12000


def test_invariant_check_sees_drift_in_the_arrays() -> None:
    state = ClusterState([node("a")])
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    state._t.free_mem[state._rows["a"], 0] += 1  # simulate a bookkeeping bug
    problems = state.check_invariants()
    assert any("state says 12001 MiB" in p for p in problems)


def test_a_card_takes_at_most_its_slots_in_containers() -> None:
    """kubelet gives a card to at most ``slots`` containers (the agent's slot devices)."""
    inv = NodeInventory("a", (Card("a-g0", 0, "T4", 16000, slots=2),), 8000, 64000)
    state = ClusterState([inv])
    best_effort = GpuRequest(count=1, memory_mib=100)
    state.assign(pod("p0", best_effort), on("a", "a-g0", mem=100, cores=0))
    state.assign(pod("p1", best_effort), on("a", "a-g0", mem=100, cores=0))
    assert state.snapshot().cards_free("a")[0].slots == 0
    with pytest.raises(PlacementError, match="has 0 slot"):
        state.assign(pod("p2", best_effort), on("a", "a-g0", mem=100, cores=0))
    assert state.check_invariants() == []
    state.release("ns/p0")
    assert state.snapshot().cards_free("a")[0].slots == 1


def test_two_containers_of_one_pod_on_a_card_take_two_slots() -> None:
    inv = NodeInventory("a", (Card("a-g0", 0, "T4", 16000, slots=3),), 8000, 64000)
    state = ClusterState([inv])
    best_effort = GpuRequest(count=1, memory_mib=100)
    pair = PodRequest("ns", "pair", (ContainerRequest("a", best_effort),
                                     ContainerRequest("b", best_effort)), 1000, 1000)  # fmt: skip
    slice_ = (CardSlice("a-g0", 100, 0),)
    state.assign(pair, Assignment("a", (ContainerAssignment("a", slice_),
                                        ContainerAssignment("b", slice_))))  # fmt: skip
    assert state.snapshot().cards_free("a")[0].slots == 1
    state.release("ns/pair")
    assert state.snapshot().cards_free("a")[0].slots == 3


def test_a_pod_may_take_the_last_milli_cpu_and_mib_of_memory() -> None:
    state = ClusterState([node("a", cpu=8000)])
    exact = PodRequest("ns", "exact", (ContainerRequest("main", None),), 8000, 64000)
    state.assign(exact, Assignment("a", ()))
    more = PodRequest("ns", "more", (ContainerRequest("main", None),), 1, 0)
    with pytest.raises(PlacementError, match="insufficient cpu"):
        state.assign(more, Assignment("a", ()))


def test_a_slice_may_take_a_cards_last_mib_and_percent() -> None:
    state = ClusterState([node("a")])
    state.assign(pod("p0", SHARE), on("a", "a-g0", mem=6000, cores=30))
    rest = GpuRequest(count=1, memory_mib=10000, cores_percent=70)
    state.assign(pod("p1", rest), on("a", "a-g0", mem=10000, cores=70))
    free = state.snapshot().cards_free("a")[0]
    assert (free.memory_mib, free.cores_percent) == (0, 0)
    one = GpuRequest(count=1, memory_mib=1, cores_percent=0)
    with pytest.raises(PlacementError, match="has 0 MiB free, needs 1"):
        state.assign(pod("p2", one), on("a", "a-g0", mem=1, cores=0))


def test_invariant_check_reports_a_card_over_its_slots() -> None:
    """The agent restarted with a smaller --slots-per-card under running pods."""
    state = ClusterState(
        [NodeInventory("a", (Card("a-g0", 0, "T4", 16000, slots=2),), 8000, 64000)]
    )
    state.assign(pod("p", SHARE), on("a", "a-g0"))
    state.assign(pod("q", SHARE), on("a", "a-g0"))
    state.update_node(NodeInventory("a", (Card("a-g0", 0, "T4", 16000, slots=1),), 8000, 64000))
    assert state.check_invariants() == ["card a-g0 on a: 2 containers booked, only 1 slots exist"]


def test_invariant_check_reports_a_card_whose_model_the_request_refuses() -> None:
    """The inventory now names the card's model otherwise (a driver upgrade renaming it)
    under a pod that asked for the old name: the pod keeps the card, and the check says so."""
    state = ClusterState([node("a")])
    state.assign(pod("p", replace(SHARE, models=frozenset({"T4"}))), on("a", "a-g0"))
    assert state.check_invariants() == []
    state.update_node(node("a", model="A10"))
    assert state.check_invariants() == [
        "pod ns/p container main holds card a-g0 of model A10, which its request does not allow"
    ]


def test_invariant_check_reports_bookings_the_state_does_not_hold() -> None:
    """The check recomputes from the bookings it is given: one more pod at 41 % on a
    card the state has at 60 % is over 100 % by one, and out of step with the tables
    (its memory alone is enough to put the node's free figures out of step)."""
    state = ClusterState([node("a")])
    state.assign(pod("p", SHARE), on("a", "a-g0", cores=60))
    extra = pod("q", SHARE, cpu=0)
    assignment = on("a", "a-g0", cores=41)
    bookings = state.bookings()
    bookings[extra.key] = Booking(extra, assignment, assignment.footprint(), assignment.slots())
    assert check(state.snapshot(), bookings) == [
        "card a-g0 on a: 101% cores booked, over 100%",
        "card a-g0 on a: state says 12000 MiB / 40% free, bookings say 8000 MiB / -1%",
        "card a-g0 on a: state says 15 slots free, bookings say 14",
        "card a-g0 on a: tenant count or exclusivity flag out of step",
        "node a: free cpu/memory out of step with the bookings",
    ]


def test_invariant_check_reads_every_booking_and_card_and_names_each_problem() -> None:
    """Bookings made by hand, each breaking something, checked against a state that holds
    none of them: one problem does not stop the check of the next card or pod."""
    state = ClusterState([node("a"), node("b")])
    a10_only = GpuRequest(count=2, memory_mib=16000, cores_percent=100,
                          models=frozenset({"A10"}))  # fmt: skip
    x = PodRequest("ns", "x", (ContainerRequest("main", a10_only),), 8000, 64000)
    y = PodRequest("ns", "y", (ContainerRequest("main", SHARE),), 1, 1000)
    full = PodRequest("ns", "z", (ContainerRequest("main", None),), 8000, 64000)
    ghost = pod("ghost")
    # x: whole cards, one of them on another node; y shares x's card on a; z fills b's CPU
    # and memory to the last unit (full is not over).
    whole = (CardSlice("b-g0", 16000, 100), CardSlice("a-g0", 16000, 100))
    x_on = Assignment("a", (ContainerAssignment("main", whole, exclusive=True),))
    y_on = on("a", "a-g0", mem=8000, cores=30)
    made = [(ghost, on("zz", "zz-g0")), (x, x_on), (y, y_on), (full, Assignment("b", ()))]
    bookings = {p.key: Booking(p, a, a.footprint(), a.slots()) for p, a in made}
    # The card off the node first: the check must go on to the next one.
    off_first = {"b-g0": (16000, 100, True), "a-g0": (16000, 100, True)}
    bookings[x.key] = replace(bookings[x.key], footprint=off_first)
    assert check(state.snapshot(), bookings) == [
        "pod ns/ghost is booked on unknown node zz",
        "pod ns/x holds card b-g0, which is not on a",
        "pod ns/x container main holds card a-g0 of model T4, which its request does not allow",
        "card a-g0 on a: 24000 MiB booked, only 16000 MiB exist",
        "card a-g0 on a: 130% cores booked, over 100%",
        "card a-g0 on a: held whole by ns/x but shared with ['ns/x', 'ns/y']",
        "card a-g0 on a: state says 16000 MiB / 100% free, bookings say -8000 MiB / -30%",
        "card a-g0 on a: state says 16 slots free, bookings say 14",
        "card a-g0 on a: tenant count or exclusivity flag out of step",
        "node a: 8001 millicores booked, only 8000 exist",
        "node a: 65000 MiB memory booked, only 64000 exist",
        "node a: free cpu/memory out of step with the bookings",
        "node b: free cpu/memory out of step with the bookings",
    ]
