"""SchedulerState's bookkeeping verbs on their own: reservations replaced, released and
in doubt; annotations whose pod spec no longer matches; what a pod update reads."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.errors import PlacementError
from tessera.model.annotations import ASSIGNMENT, INVENTORY, decode_inventory, encode_assignment
from tessera.model.names import ResourceNames
from tessera.model.podspec import Compat
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.scheduler.state import SchedulerState, pod_priority, request_from_assignment
from tests.unit._scheduler_world import gpu_quota, node_obj, pod_obj


def state_with(*nodes: dict[str, Any]) -> SchedulerState:
    state = SchedulerState()
    state.replace_nodes(list(nodes))
    return state


def uuids(state: SchedulerState, node: str) -> list[str]:
    return [c.card.uuid for c in state.cluster.snapshot().cards_free(node)]


def on(node: str, uuid: str, mem: int = 10000, cores: int = 20, name: str = "main") -> Assignment:
    return Assignment(node, (ContainerAssignment(name, (CardSlice(uuid, mem, cores),)),))


def free_mem(state: SchedulerState, node: str) -> list[int]:
    return [c.memory_mib for c in state.cluster.snapshot().cards_free(node)]


def test_unreserve_drops_only_the_reservation_it_names() -> None:
    """A failed bind releases its own decision, never a newer one taken since."""
    state = state_with(node_obj("n1"))
    g0, g1 = uuids(state, "n1")
    request = state.parse(pod_obj("p", memory=10000))
    assert request is not None
    old, new = on("n1", g0), on("n1", g1)
    state.reserve(request, "u1", old)
    state.reserve(request, "u1", new)  # filtered again: the newer decision replaces it
    assert state.unreserve(request.key, old) is False
    assert state.held(request.key) == new
    assert free_mem(state, "n1") == [40960, 30960]
    assert state.unreserve(request.key, new) is True
    assert state.held(request.key) is None
    assert free_mem(state, "n1") == [40960, 40960]
    assert state.unreserve(request.key) is False  # nothing left to drop


def test_a_reservation_that_does_not_fit_keeps_the_one_before() -> None:
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    big = state.parse(pod_obj("big", memory=40000))
    p = state.parse(pod_obj("p", memory=10000))
    assert big is not None and p is not None
    state.reserve(big, "u0", on("n1", g0, mem=40000))
    first = on("n1", uuids(state, "n1")[1])
    state.reserve(p, "u1", first)
    with pytest.raises(PlacementError, match="has 960 MiB free, needs 10000") as refused:
        state.reserve(p, "u1", on("n1", g0))  # 10,000 MiB more on a card with 960 free
    assert refused.value.reasons == {"n1": str(refused.value)}
    assert state.held(p.key) == first
    assert free_mem(state, "n1") == [960, 30960]
    q = state.parse(pod_obj("q", memory=10000))
    assert q is not None
    with pytest.raises(PlacementError, match="has 960 MiB free"):
        state.reserve(q, "u2", on("n1", g0))  # its first decision: nothing is left of it
    assert state.held(q.key) is None and q.key not in state.reservations


def test_doubt_keeps_only_the_reservation_it_names() -> None:
    state = state_with(node_obj("n1"))
    g0, g1 = uuids(state, "n1")
    request = state.parse(pod_obj("p", memory=10000))
    assert request is not None
    state.reserve(request, "u1", on("n1", g0))
    assert state.doubt(request.key, on("n1", g1)) is False
    res = state.reservations.get(request.key)
    assert res is not None and not res.binding
    assert state.doubt("default/nobody", on("n1", g0)) is False
    assert state.doubt(request.key, on("n1", g0)) is True
    assert res.binding and res.doubt_until is not None


def test_release_says_whether_anything_was_held() -> None:
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    assert state.release("default/p") is False
    request = state.parse(pod_obj("p", memory=10000))
    assert request is not None
    state.reserve(request, "u1", on("n1", g0))
    assert state.release("default/p", uid="someone-else") is False
    assert state.release("default/p") is True
    assert free_mem(state, "n1") == [40960, 40960]


def bound(name: str, assignment: Assignment, **kw: Any) -> dict[str, Any]:
    obj = pod_obj(name, **kw)
    obj["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    obj["metadata"]["annotations"][ASSIGNMENT] = encode_assignment(assignment)
    obj["spec"]["nodeName"] = assignment.node
    return obj


def test_a_bound_pod_whose_spec_no_longer_matches_keeps_its_cards_out_of_service() -> None:
    """The annotation is what holds the cards, even when the spec parses to other
    containers and the card has since been taken out of service."""
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    state.apply_node(node_obj("n1", sick=(0,)))
    # The annotation names container "old"; the spec has only "main".
    state.apply_pod(bound("p", on("n1", g0, name="old"), memory=10000))
    assert state.cluster.booking("default/p") is not None
    assert free_mem(state, "n1")[0] == 30960
    assert state.problems["conflicting-assignment"] == 0


def test_a_whole_card_or_an_init_container_booked_from_its_annotation_keeps_its_flags() -> None:
    """The spec parses to other containers: the annotation's whole card stays whole and
    its init container stays an init container (the booking refuses flags that differ)."""
    state = state_with(node_obj("n1"))
    g0, g1 = uuids(state, "n1")
    whole = Assignment("n1", (ContainerAssignment("old", (CardSlice(g0, 40960, 100),),
                                                  exclusive=True),))  # fmt: skip
    state.apply_pod(bound("w", whole, gpu=1))
    with_init = Assignment("n1", (
        ContainerAssignment("setup", (CardSlice(g1, 8000, 10),), init=True),
        ContainerAssignment("old", (CardSlice(g1, 6000, 10),)),
    ))  # fmt: skip
    state.apply_pod(bound("i", with_init, memory=6000))
    assert state.problems["conflicting-assignment"] == 0
    booked = {k: state.cluster.booking(k) for k in ("default/w", "default/i")}
    assert all(b is not None and b.assignment.node == "n1" for b in booked.values())
    assert free_mem(state, "n1") == [0, 40960 - 8000]  # init and app containers: the larger
    assert state.cluster.check_invariants() == []


def test_a_pod_booked_from_its_annotation_keeps_its_uid_cpu_and_memory() -> None:
    state = state_with(node_obj("n1", cpu="64"))
    g0, _ = uuids(state, "n1")
    obj = bound("p", on("n1", g0, name="old"), memory=10000)
    obj["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "8", "memory": "16Gi"}
    state.apply_pod(obj)
    booking = state.cluster.booking("default/p")
    assert booking is not None and booking.pod.uid == "uid-p"
    snap = state.cluster.snapshot()
    assert (snap.cpu_free("n1"), snap.memory_free("n1")) == (56000, 256 * 1024 - 16 * 1024)
    state.apply_pod(obj)  # the same pod again: booked once
    assert state.cluster.snapshot().cpu_free("n1") == 56000


def test_an_annotation_that_cannot_be_booked_is_counted() -> None:
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    state.apply_pod(bound("a", on("n1", g0, mem=30000), memory=30000))
    state.apply_pod(bound("b", on("n1", g0, mem=30000), memory=30000))  # the same card
    assert state.cluster.booking("default/b") is None
    assert state.problems["conflicting-assignment"] == 1
    state.apply_pod(bound("c", on("n1", g0, mem=30000), memory=30000))
    assert state.problems["conflicting-assignment"] == 2


def test_a_reservation_on_a_card_out_of_service_is_refused() -> None:
    """A pod already bound there keeps such a card (booked from its annotation); a new
    decision may not take it."""
    state = state_with(node_obj("n1", sick=(0,)))
    g0, _ = uuids(state, "n1")
    p = state.parse(pod_obj("p", memory=10000))
    assert p is not None
    with pytest.raises(PlacementError, match="unhealthy"):
        state.reserve(p, "u1", on("n1", g0))
    state.apply_pod(bound("q", on("n1", g0), memory=10000))
    assert state.cluster.booking("default/q") is not None


def test_a_deletion_seen_late_leaves_the_new_pod_of_its_name_alone() -> None:
    """The pod was deleted and created again under its name, and kube-scheduler placed
    the new one before the watch told of the old one's deletion."""
    state = state_with(node_obj("n1"))
    g0, g1 = uuids(state, "n1")
    old = bound("p", on("n1", g0), memory=10000)
    state.apply_pod(old)
    new = state.parse(pod_obj("p", memory=10000))
    assert new is not None
    state.reserve(new, "uid-new", on("n1", g1))
    state.apply_pod(old, deleted=True)
    assert state.held("default/p") == on("n1", g1)
    assert free_mem(state, "n1") == [40960, 30960]


def test_a_pod_first_seen_terminating_is_known_to_be_going() -> None:
    """An extender that starts while a pod terminates: the pod is no victim to pick."""
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    obj = bound("p", on("n1", g0), memory=10000)
    obj["metadata"]["deletionTimestamp"] = "2026-11-29T20:00:00Z"
    state.apply_pod(obj)
    assert state.pods["default/p"].terminating is True
    assert state.cluster.booking("default/p") is not None  # its containers may still run


def test_the_state_reads_pods_with_its_resource_names_and_compatibility() -> None:
    names = ResourceNames(gpu="example.com/gpu", memory="example.com/gpu-mem")
    state = SchedulerState(names=names, compat=Compat(hami=True))
    ours = pod_obj("p", gpu=None)
    ours["spec"]["containers"][0]["resources"]["limits"] = {
        "example.com/gpu": "1", "example.com/gpu-mem": "3000"}  # fmt: skip
    hami = pod_obj("h", gpu=None)
    hami["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}  # fmt: skip
    asked = [state.parse(p) for p in (ours, hami)]
    gpus = [r.containers[0].gpu for r in asked if r is not None]
    assert [(g.count, g.memory_mib) for g in gpus if g is not None] == [(1, 3000), (1, 2000)]
    assert SchedulerState().parse(ours) is None  # not resources the default names know


def test_a_node_whose_allocatable_cpu_or_memory_alone_changes_is_read_again() -> None:
    state = state_with(node_obj("n1", cpu="64"))
    state.apply_node(node_obj("n1", cpu="32"))
    assert state.cluster.snapshot().cpu_free("n1") == 32000
    smaller = node_obj("n1", cpu="32")
    smaller["status"]["allocatable"]["memory"] = "128Gi"
    state.apply_node(smaller)
    assert state.cluster.snapshot().memory_free("n1") == 128 * 1024


def test_quotas_loosened_while_the_watch_was_away_are_told_at_the_re_list() -> None:
    state = SchedulerState()
    told: list[set[str]] = []
    state.quotas_handler.on_raise = told.append
    tight = gpu_quota("team-a", {"name": "all", "models": ["*"], "memoryMiB": 1000})
    loose = gpu_quota("team-a", {"name": "all", "models": ["*"], "memoryMiB": 9000})
    state.quotas_handler.replace([tight])
    state.quotas_handler.replace([tight])  # unchanged: no one to tell
    assert told == []
    state.quotas_handler.replace([loose])
    assert told == [{"team-a"}]


def test_a_pod_without_a_priority_has_priority_zero() -> None:
    """The API server sets spec.priority from the PriorityClass; a pod read before that,
    or with a value that is not a number, weighs as 0 -- the default class's."""
    assert [pod_priority(p) for p in (None, {}, {"spec": {}})] == [0, 0, 0]
    assert [pod_priority({"spec": {"priority": v}}) for v in (7, -3, True, "9")] == [7, -3, 0, 0]


def test_a_pod_is_ready_only_when_its_ready_condition_is_true() -> None:
    state = SchedulerState()

    def ready(conditions: list[dict[str, str]]) -> bool:
        obj = pod_obj("p", memory=1000)
        obj["status"] = {"phase": "Running", "conditions": conditions}
        disruptee = state.prepare_pod(obj).disruptee
        assert disruptee is not None
        return disruptee.ready

    scheduled = {"type": "PodScheduled", "status": "True"}
    assert ready([scheduled, {"type": "Ready", "status": "True"}]) is True
    assert ready([scheduled, {"type": "Ready", "status": "False"}]) is False
    assert ready([scheduled]) is False


def test_a_status_or_label_update_is_what_budgets_read_next() -> None:
    """Nothing Tessera books changes, but readiness and labels are what a disruption
    budget weighs: the pod's record follows them."""
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    obj = bound("p", on("n1", g0), memory=10000)
    obj["status"] = {"phase": "Pending"}  # the Eviction API lets a Pending pod go
    state.apply_pod(obj)
    before = state.pods["default/p"].disruptee
    assert before is not None and (before.ready, before.pending, before.labels) == (False, True, {})
    obj["metadata"]["labels"] = {"app": "train"}
    obj["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    state.apply_pod(obj)
    after = state.pods["default/p"].disruptee
    assert after is not None and after.namespace == "default"
    assert (after.ready, after.pending, after.labels) == (True, False, {"app": "train"})


def test_a_request_made_from_an_assignment_asks_for_its_largest_slice() -> None:
    """Any card the assignment gives then meets the request."""
    assignment = Assignment(
        "n1", (ContainerAssignment("main", (CardSlice("a", 4000, 30), CardSlice("b", 6000, 50))),)
    )
    gpu = request_from_assignment("ns/p", assignment, None).containers[0].gpu
    assert gpu is not None
    assert (gpu.count, gpu.memory_mib, gpu.cores_percent) == (2, 6000, 50)


def test_a_bound_pod_whose_spec_asks_for_no_gpu_is_booked_from_its_annotation() -> None:
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    state.apply_pod(bound("p", on("n1", g0), gpu=None))  # the spec names no GPU at all
    booking = state.cluster.booking("default/p")
    assert booking is not None and booking.pod.uid == "uid-p"
    assert free_mem(state, "n1")[0] == 30960


def test_a_bound_pod_that_loses_its_annotation_keeps_its_cards_a_new_pod_of_its_name_not() -> None:
    state = state_with(node_obj("n1"))
    g0, _ = uuids(state, "n1")
    obj = bound("p", on("n1", g0), memory=10000)
    state.apply_pod(obj)
    del obj["metadata"]["annotations"][ASSIGNMENT]
    obj["metadata"]["resourceVersion"] = "2"
    state.apply_pod(obj)  # its containers still run on the card
    assert state.held("default/p") == on("n1", g0)
    again = pod_obj("p", memory=10000)  # deleted and created again, its delete unseen
    again["metadata"] |= {"uid": "uid-p-2", "resourceVersion": "3"}
    state.apply_pod(again)
    assert state.held("default/p") is None
    assert free_mem(state, "n1") == [40960, 40960]


def test_refused_inventories_are_counted() -> None:
    state = state_with(node_obj("n1"))
    bad = node_obj("n2")
    bad["metadata"]["annotations"][INVENTORY] = "{not json"
    state.apply_node(bad)
    assert state.problems["bad-inventory"] == 1
    twin = node_obj("n1")  # the same cards, under another name
    twin["metadata"]["name"] = "n3"
    state.apply_node(twin)
    assert state.problems["bad-inventory"] == 2
    assert set(state.bad_nodes) == {"n2", "n3"}
    state.apply_node(bad)  # its heartbeat: refused once, not once a heartbeat
    state.apply_node(twin)
    assert state.problems["bad-inventory"] == 2


def test_a_node_whose_inventory_is_taken_off_offers_no_card() -> None:
    """The node agent was uninstalled: the node's cards leave the extender's view; the
    pods bound there stay booked, to come back with the inventory."""
    state = state_with(node_obj("n1"), node_obj("n2"))
    g0, _ = uuids(state, "n1")
    state.apply_pod(bound("p", on("n1", g0), memory=10000))
    bare = node_obj("n1")
    del bare["metadata"]["annotations"][INVENTORY]
    state.apply_node(bare)
    assert state.cluster.node_names() == ["n2"]
    assert state.held("default/p") == on("n1", g0)
    state.apply_node(node_obj("n1"))
    assert state.cluster.booking("default/p") is not None


def test_only_cards_that_come_back_into_service_are_announced() -> None:
    state = state_with(node_obj("n1"))
    told: list[list[str]] = []
    state.on_cards_back = lambda cards: told.append([c.uuid for c in cards])
    g0, _ = uuids(state, "n1")
    state.apply_node(node_obj("n1", sick=(0,)))  # a card goes: nothing comes back
    assert told == []
    state.apply_node(node_obj("n1"))
    assert told == [[g0]]


def test_pods_seen_before_their_node_are_booked_when_it_comes() -> None:
    """The pod watch may run ahead of the node watch (or a node's inventory may come back
    after it was refused): the pods bound there wait in the observed state, and are booked
    the moment the node arrives, so that their cards are not offered again."""
    state = SchedulerState()
    state.replace_nodes([node_obj("n2")])
    n1 = node_obj("n1")
    g0 = decode_inventory("n1", n1["metadata"]["annotations"][INVENTORY], 0, 0).cards[0].uuid
    early = pod_obj("early", memory=30000)
    early["metadata"].update(uid="u-early")
    early["metadata"]["annotations"][ASSIGNMENT] = encode_assignment(on("n1", g0, mem=30000))
    early["spec"]["nodeName"] = "n1"
    state.apply_pod(early)
    assert state.cluster.booking("default/early") is None  # no node n1 yet
    on_n2 = pod_obj("other", memory=1000)
    on_n2["spec"]["nodeName"] = "n2"
    g2 = uuids(state, "n2")[0]
    on_n2["metadata"]["annotations"][ASSIGNMENT] = encode_assignment(on("n2", g2, mem=1000))
    state.apply_pod(on_n2)
    state.apply_node(n1)
    assert state.cluster.booking("default/early") is not None
    assert free_mem(state, "n1") == [10960, 40960]
    assert state.cluster.check_invariants() == []


def test_a_reservation_on_a_node_that_goes_and_comes_back_is_booked_again() -> None:
    """A node whose inventory is refused for a moment (or that is deleted and made again)
    loses its bookings; a pod reserved there, its bind still in flight, must hold its
    cards again when the node comes back."""
    state = state_with(node_obj("n1"), node_obj("n2"))
    g0, _ = uuids(state, "n1")
    request = state.parse(pod_obj("p", memory=10000))
    assert request is not None
    state.reserve(request, "u1", on("n1", g0))
    bad = node_obj("n1")
    bad["metadata"]["annotations"][INVENTORY] = "not json"
    state.apply_node(bad)
    assert "n1" not in state.cluster
    state.apply_node(node_obj("n1"))
    assert state.cluster.booking(request.key) is not None
    assert free_mem(state, "n1") == [30960, 40960]
    assert state.cluster.check_invariants() == []
