"""The matcher on its own: which container a kubelet call is for, from the pods bound
to the node and kubelet's pod-resources (docs/node-agent.md)."""

from __future__ import annotations

import dataclasses

import pytest

from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.node.allocation.errors import FAILED_PRECONDITION, AllocationError
from tessera.node.allocation.matching import Matcher
from tessera.node.formats.layout import AllocRecord
from tessera.node.pods import GpuContainer, PodInfo
from tests.unit._node_doubles import Kubelet, Pods

NODE = "gpu-1"


def pod(
    uid: str,
    cards: dict[str, tuple[str, ...]],
    created: str = "2026-11-28T00:00:01Z",
    node: str = NODE,
    problem: str = "",
    terminal: bool = False,
    counts: dict[str, int] | None = None,
) -> PodInfo:
    """Pod ``pod-UID`` whose containers (in order) were assigned ``cards``; ``counts``
    overrides how many cards a container asks kubelet for."""
    containers = tuple(
        GpuContainer(name, False, (counts or {}).get(name, len(uuids)))
        for name, uuids in cards.items()
    )
    assignment = Assignment(node, tuple(
        ContainerAssignment(name, tuple(CardSlice(u, 1000, 10) for u in uuids))
        for name, uuids in cards.items()
    ))  # fmt: skip
    return PodInfo(uid, "ns", f"pod-{uid}", node, created, containers, assignment,
                   problem=problem, terminal=terminal)  # fmt: skip


def record(uid: str, container: str = "main", slots: tuple[str, ...] = ("s0",)) -> AllocRecord:
    return AllocRecord("a1", slots, uid, "ns", f"pod-{uid}", container, ("GPU-a",), True,
                       "v1", 0.0)  # fmt: skip


def test_a_call_goes_to_the_container_that_asks_for_as_many_cards() -> None:
    two = pod("two", {"main": ("GPU-a", "GPU-b")}, created="2026-11-28T00:00:00Z")
    one = pod("one", {"main": ("GPU-c",)})
    m = Matcher(NODE, Pods([two, one]), None)
    assert m.choose(1, None, "Allocate", set()).pod.uid == "one"
    assert m.choose(2, None, "Allocate", set()).pod.uid == "two"
    assert m.choose(1, frozenset({"GPU-c"}), "Allocate", set()).pod.uid == "one"


def test_the_cards_kubelet_names_pick_among_containers_of_one_size() -> None:
    first = pod("first", {"main": ("GPU-a",)}, created="2026-11-28T00:00:00Z")
    second = pod("second", {"main": ("GPU-b",)})
    m = Matcher(NODE, Pods([first, second]), None)
    assert m.choose(1, frozenset({"GPU-b"}), "Allocate", set()).pod.uid == "second"
    assert m.choose(1, None, "Allocate", set()).pod.uid == "first"  # the oldest


def test_a_pod_the_watch_has_not_shown_is_found_by_reading_the_pods_again() -> None:
    late = pod("late", {"main": ("GPU-b",)})
    pods = Pods([], fresh=[late])
    assert Matcher(NODE, pods, None).choose(1, None, "Allocate", set()).pod.uid == "late"
    assert pods.refreshes == 1
    # The second read is weighed as the first: kubelet's list and the cards still count.
    unlisted = pod("unlisted", {"main": ("GPU-a",)}, created="2026-11-28T00:00:00Z")
    other = pod("other", {"main": ("GPU-c",)})
    kubelet = Kubelet(pods={("ns", "pod-late"), ("ns", "pod-other")})
    m = Matcher(NODE, Pods([], fresh=[unlisted, late, other]), kubelet)
    assert m.choose(1, None, "Allocate", set()).pod.uid == "late"
    assert m.choose(1, frozenset({"GPU-c"}), "Allocate", set()).pod.uid == "other"


def test_a_container_already_claimed_or_holding_slots_is_passed_over() -> None:
    both = pod("both", {"init": ("GPU-a",), "main": ("GPU-b",)}, created="2026-11-28T00:00:00Z")
    later = pod("later", {"main": ("GPU-c",)})
    m = Matcher(NODE, Pods([both, later]), None)
    t = m.choose(1, None, "Allocate", {("both", "init")})
    assert (t.pod.uid, t.container.name) == ("both", "main")  # the pod's next container
    # After an agent restart the ledger is empty, but kubelet says who holds slots.
    listed = {("ns", "pod-both"), ("ns", "pod-later")}
    held_init = Kubelet(pods=listed, held={("ns", "pod-both", "init"): frozenset({"s0"})})
    t = Matcher(NODE, Pods([both, later]), held_init).choose(1, None, "Allocate", set())
    assert (t.pod.uid, t.container.name) == ("both", "main")
    held_all = Kubelet(pods=listed, held={
        ("ns", "pod-both", "init"): frozenset({"s0"}),
        ("ns", "pod-both", "main"): frozenset({"s1"}),
    })  # fmt: skip
    t = Matcher(NODE, Pods([both, later]), held_all).choose(1, None, "Allocate", set())
    assert t.pod.uid == "later"


def test_without_pod_resources_a_pod_with_a_problem_is_passed_over_then_reported() -> None:
    bad = pod("bad", {"main": ("GPU-a",)}, created="2026-11-28T00:00:00Z",
              problem="assignment names node gpu-9")  # fmt: skip
    ok = pod("ok", {"main": ("GPU-b",)})
    assert Matcher(NODE, Pods([bad, ok]), None).choose(1, None, "x", set()).pod.uid == "ok"
    with pytest.raises(AllocationError, match="assignment names node gpu-9") as err:
        Matcher(NODE, Pods([bad]), None).choose(1, None, "x", set())
    assert (err.value.code, err.value.pod) == (FAILED_PRECONDITION, bad)
    # pod-resources lists the pod: kubelet is admitting exactly it, so it is reported now.
    listed = Kubelet(pods={("ns", "pod-bad")})
    with pytest.raises(AllocationError, match=r"^assignment names node gpu-9$") as err:
        Matcher(NODE, Pods([bad, ok]), listed).choose(1, None, "x", set())
    assert (err.value.code, err.value.pod) == (FAILED_PRECONDITION, bad)


def test_no_match_names_the_node_the_size_and_the_cards() -> None:
    m = Matcher(NODE, Pods([]), None)
    with pytest.raises(
        AllocationError,
        match=r"Allocate: no pod bound to node gpu-1 has a "
        r"container waiting for 2 card\(s\) on cards \['GPU-a', 'GPU-b'\]",
    ) as err:
        m.choose(2, frozenset({"GPU-b", "GPU-a"}), "Allocate", set())
    assert (err.value.code, err.value.pod) == (FAILED_PRECONDITION, None)
    with pytest.raises(AllocationError, match=r"waiting for 1 card\(s\) in its"):
        m.choose(1, None, "Allocate", set())


def test_find_and_find_by_name_pick_the_container_named_and_pass_over_problems() -> None:
    a = pod("a", {"init": ("GPU-a",), "main": ("GPU-b",)})
    b = pod("b", {"main": ("GPU-c",)})
    bad = pod("bad", {"main": ("GPU-d",)}, problem="assignment names node gpu-9")
    elsewhere = pod("x", {"main": ("GPU-e",)}, node="gpu-2")
    m = Matcher(NODE, Pods([a, bad, elsewhere, b]), None)
    for claim in (("a", "main"), ("a", "init"), ("b", "main")):
        t = m.find(claim)
        assert t is not None and (t.pod.uid, t.container.name) == claim
    assert m.find(("a", "side")) is None and m.find(("bad", "main")) is None
    t = m.find_by_name("ns", "pod-a", "main")
    assert t is not None and t.cards == ("GPU-b",)
    assert m.find_by_name("ns", "pod-a", "side") is None
    assert m.find_by_name("ns", "pod-x", "main") is None  # bound to another node
    assert m.find_by_name("other", "pod-b", "main") is None
    with pytest.raises(AllocationError, match=r"^assignment names node gpu-9$") as err:
        m.find_by_name("ns", "pod-bad", "main")
    assert (err.value.code, err.value.pod) == (FAILED_PRECONDITION, bad)


def test_next_in_pod_is_the_next_container_of_the_same_live_pod() -> None:
    mine = pod("mine", {"init": ("GPU-a",), "main": ("GPU-a",)})
    other = pod("other", {"main": ("GPU-a",)}, created="2026-11-28T00:00:00Z")
    m = Matcher(NODE, Pods([other, mine]), None)
    rec = record("mine", "init")
    t = m.next_in_pod(rec, frozenset({"GPU-a"}), 1, {("mine", "init")})
    assert t is not None and (t.pod.uid, t.container.name) == ("mine", "main")
    ended = pod("mine", {"init": ("GPU-a",), "main": ("GPU-a",)}, terminal=True)
    m = Matcher(NODE, Pods([other, ended]), None)
    assert m.next_in_pod(rec, frozenset({"GPU-a"}), 1, {("mine", "init")}) is None


def test_next_in_pod_on_other_cards_is_refused_naming_both() -> None:
    mine = pod("mine", {"init": ("GPU-a",), "main": ("GPU-b",)})
    m = Matcher(NODE, Pods([mine]), None)
    with pytest.raises(
        AllocationError,
        match=r"was given the slots of container 'init' on "
        r"cards \['GPU-a'\].*but it is assigned \['GPU-b'\]",
    ) as err:
        m.next_in_pod(record("mine", "init"), frozenset({"GPU-a"}), 1, {("mine", "init")})
    assert (err.value.code, err.value.pod) == (FAILED_PRECONDITION, mine)


def test_next_in_pod_refuses_a_container_asking_another_count_or_not_assigned() -> None:
    rec = record("mine", "init")
    wants_two = pod("mine", {"init": ("GPU-a",), "main": ("GPU-a",)}, counts={"main": 2})
    with pytest.raises(AllocationError, match=r"container 'main' .* assigned \['GPU-a'\]"):
        Matcher(NODE, Pods([wants_two]), None).next_in_pod(
            rec, frozenset({"GPU-a"}), 1, {("mine", "init")})  # fmt: skip
    both = pod("mine", {"init": ("GPU-a",), "main": ("GPU-a",)})
    assert both.assignment is not None
    init_only = dataclasses.replace(both, assignment=dataclasses.replace(
        both.assignment, containers=both.assignment.containers[:1]))  # fmt: skip
    m = Matcher(NODE, Pods([init_only]), None)
    with pytest.raises(AllocationError, match=r"container 'main' .* but it is assigned \[\]"):
        m.next_in_pod(rec, frozenset({"GPU-a"}), 1, {("mine", "init")})
    assert m.find(("mine", "main")) is None  # no assignment: nothing to hand it


def test_a_container_is_alive_only_while_kubelet_lists_its_pod_and_the_pod_runs_here() -> None:
    """The slot-reuse question: kubelet offers known slots again; is their holder alive?"""
    live = pod("p", {"main": ("GPU-a",)})
    rec = record("p")
    listed = Kubelet(pods={("ns", "pod-p")})
    assert Matcher(NODE, Pods([live]), listed).alive(rec) is True
    # kubelet no longer lists the pod: gone, whatever the (lagging) watch says.
    assert Matcher(NODE, Pods([live]), Kubelet()).alive(rec) is False
    moved = pod("p", {"main": ("GPU-a",)}, node="gpu-2")
    assert Matcher(NODE, Pods([moved]), listed).alive(rec) is False
    ended = pod("p", {"main": ("GPU-a",)}, terminal=True)
    assert Matcher(NODE, Pods([ended]), listed).alive(rec) is False
    assert Matcher(NODE, Pods([]), listed).alive(rec) is False  # the pod is gone
    # The pod list is read fresh: the watch may not show the old pod's end yet.
    assert Matcher(NODE, Pods([live], fresh=[ended]), listed).alive(rec) is False


def test_the_pods_are_read_again_only_when_kubelet_admits_more_than_one() -> None:
    one = pod("one", {"main": ("GPU-c",)})
    rejected = pod("rejected", {"main": ("GPU-a",)}, created="2026-11-28T00:00:00Z")
    pods = Pods([one, rejected])
    m = Matcher(NODE, pods, Kubelet(pods={("ns", "pod-one")}))
    assert m.choose(1, None, "x", set()).pod.uid == "one"
    assert pods.refreshes == 0  # kubelet admits one pod: the cache is enough
    # kubelet still lists a pod it rejected; a fresh read shows it Failed.
    failed = pod("rejected", {"main": ("GPU-a",)}, created="2026-11-28T00:00:00Z", terminal=True)
    pods = Pods([one, rejected], fresh=[one, failed])
    m = Matcher(NODE, pods, Kubelet(pods={("ns", "pod-one"), ("ns", "pod-rejected")}))
    assert m.choose(1, None, "x", set()).pod.uid == "one"
    assert pods.refreshes == 1
