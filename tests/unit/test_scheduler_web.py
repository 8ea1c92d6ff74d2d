"""The scheduler's GPU map as its state makes it: who holds a card, who waits, and what of
a node is held for a preempting pod."""

from __future__ import annotations

from typing import Any

from tessera.model.annotations import ASSIGNMENT
from tessera.model.types import Assignment, CardSlice, ContainerAssignment, PodRequest
from tessera.scheduler.holds import Hold
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.web import gpu_map
from tessera.view.gpumap import unassigned
from tests.unit._scheduler_world import node_obj, pod_obj
from tests.unit.test_scheduler_holds import pod


def _pod(name: str, uid: str, node: str | None = None) -> dict[str, Any]:
    obj = pod_obj(name, memory=1000, cores=10)
    obj["metadata"].update(uid=uid, resourceVersion="5")
    if node is not None:
        obj["spec"]["nodeName"] = node
    return obj


def test_a_pod_bound_without_an_assignment_is_a_problem_neither_waiting_nor_holding() -> None:
    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 2)])
    state.apply_pod(_pod("stray", "u1", node="n1"))  # bound by someone else, no assignment
    garbled = _pod("garbled", "u3", node="n1")
    garbled["metadata"]["annotations"] = {ASSIGNMENT: "{oops"}
    state.apply_pod(garbled)
    placed_cpu = pod_obj("placed-cpu", gpu=None)
    placed_cpu["spec"]["nodeName"] = "n1"  # asks nothing of Tessera: no problem
    state.apply_pod(placed_cpu)
    state.apply_pod(_pod("waits", "u2"))
    gmap = gpu_map(state)
    assert [p.pod for p in gmap.pending] == ["waits"]
    assert [h for n in gmap.nodes for c in n.cards for h in c.holders] == []
    assert dict(gmap.problems) == {
        "default/stray": unassigned("n1"),
        "default/garbled": unassigned("n1", undecoded=True),
    }
    assert "does not decode" in unassigned("n1", undecoded=True)


def _held(hold: Hold) -> str:
    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 3, "A100")])
    state.holds.put(hold)
    return gpu_map(state).nodes[0].held


def test_a_hold_is_the_whole_node_unless_both_its_pod_and_placement_are_known() -> None:
    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 3, "A100")])
    card = state.cluster.node("n1").cards[2]
    one = Assignment(
        "n1",
        (ContainerAssignment("main", (CardSlice(card.uuid, card.memory_mib, 100),), True),),
    )

    def hold(request: PodRequest | None, decision: Assignment | None, node: str = "n1") -> Hold:
        return Hold("team/p", "u", 1000, node, frozenset({"team/v"}), 60.0,
                    request=request, decision=decision)  # fmt: skip

    assert _held(hold(pod("p"), one)) == "held for team/p (priority 1000): card 2"
    cards = state.cluster.node("n1").cards
    two = Assignment(  # listed by index, whatever order the placement gives them in
        "n1",
        (ContainerAssignment("main", tuple(CardSlice(c.uuid, c.memory_mib, 100)
                                           for c in (cards[2], cards[0])), True),),
    )  # fmt: skip
    assert _held(hold(pod("p"), two)) == "held for team/p (priority 1000): cards 0, 2"
    whole = "held for team/p (priority 1000): the whole node"
    assert _held(hold(pod("p"), None)) == whole  # a record written without its placement
    assert _held(hold(None, one)) == whole  # the pod's spec does not parse
    assert _held(hold(pod("p"), one, node="gone")) == ""  # a node deleted while held: no crash
