"""Cordoned cards: taken out of service by an operator, the node stays in.

What placement, the extender's state, the claims path's slice, the agent's watch and
``kubectl tessera cordon`` each do with ``tessera.io/cordoned-cards``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from tessera.claims.devices import (
    CORDONED_TAINT,
    DRIVER,
    UNHEALTHY_TAINT,
    resource_slice,
    slice_cards,
)
from tessera.kube import NODES, PODS, FakeKube
from tessera.kube.errors import ApiError, NotFound
from tessera.kube.kinds import RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.model import annotations as keys
from tessera.model.clusterspec import card_uuid, make_cards
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.node.cards.cordons import NodeCordons
from tessera.scheduler.quota_writer import CARDS_BACK_EVERY_S, QuotaWriter
from tessera.scheduler.state import SchedulerState
from tessera.view.cordon import CordonError, change_cordons, drain, resolve_cards, tenants
from tests._logs import logged
from tests.unit._scheduler_world import World, node_obj, pod_obj
from tests.unit._wait import eventually


def _cordon(w: World, node: str, *indices: int) -> None:
    value = keys.format_cordoned(card_uuid(node, i) for i in indices) or None
    w.kube.merge_patch(NODES, node, {"metadata": {"annotations": {keys.CORDONED_CARDS: value}}})


def _pod_annotations(kube: FakeKube, name: str) -> dict[str, str]:
    return dict(kube.get(PODS, name, "default")["metadata"].get("annotations") or {})


def _in_service(w: World, node: str) -> int:
    return sum(c.in_service for c in w.app.state.cluster.node(node).cards)


def test_the_annotation_reads_as_operators_write_it() -> None:
    assert keys.parse_cordoned(None) == frozenset()
    assert keys.parse_cordoned("") == frozenset()
    assert keys.parse_cordoned(" GPU-b, GPU-a,,") == {"GPU-a", "GPU-b"}
    assert keys.format_cordoned(["GPU-b", "GPU-a", "GPU-b"]) == "GPU-a,GPU-b"
    inv = keys.decode_inventory("n1", keys.encode_inventory(make_cards("n1", 2, "A100")), 1, 1)
    marked = keys.with_cordons(inv, frozenset({card_uuid("n1", 1), "GPU-not-here"}))
    assert [c.cordoned for c in marked.cards] == [False, True]
    assert [c.in_service for c in marked.cards] == [True, False]
    assert keys.with_cordons(marked, frozenset()).cards == inv.cards
    # The agent's inventory never carries a cordon: it is the operator's annotation.
    assert "cordon" not in keys.encode_inventory(marked.cards)


def test_no_new_tenant_on_a_cordoned_card_and_the_reason_says_so() -> None:
    w = World([node_obj("n1", 2), node_obj("n2", 1)])
    try:
        _cordon(w, "n1", 0)
        _cordon(w, "n2", 0)
        eventually(lambda: _in_service(w, "n1") == 1)
        eventually(lambda: w.app.state.cordoned_cards == {"n1": 1, "n2": 1})
        assert b"tessera_scheduler_cards_cordoned 2.0" in w.app.metrics.exposition()
        # Whole cards: n1 has one left in service, n2 none.
        out = w.filter(w.create(pod_obj("two", gpu=2)))
        assert out["NodeNames"] == []
        assert out["FailedNodes"]["n1"] == "fewer than 2 cards in service (1 cordoned)"
        assert out["FailedNodes"]["n2"] == "no card in service (1 cordoned)"
        one = w.create(pod_obj("one", gpu=1))
        assert w.schedule(one) == "n1"
        held = w.app.state.held("default/one")
        assert held is not None
        assert [s.uuid for c in held.containers for s in c.slices] == [card_uuid("n1", 1)]
        # A pod pinned to the cordoned card is told which card and why.
        pinned = pod_obj("pinned", gpu=1, memory=1000,
                         annotations={keys.GPU_UUID: card_uuid("n1", 0)})  # fmt: skip
        out = w.filter(w.create(pinned), ["n1"])
        assert out["FailedNodes"]["n1"] == f"card {card_uuid('n1', 0)} cordoned"
        # Uncordoned: the card takes tenants again, and the pods that wait are nudged,
        # since kube-scheduler moves none on a change of a Node's annotations.
        assert keys.QUOTA_RETRY not in _pod_annotations(w.kube, "pinned")
        eventually(lambda: "default/pinned" in w.app.state.pods)  # its watch event is in
        _cordon(w, "n1")
        eventually(lambda: keys.QUOTA_RETRY in _pod_annotations(w.kube, "pinned"))
        assert keys.QUOTA_RETRY in _pod_annotations(w.kube, "two")  # every waiting pod
        nudged = b'tessera_scheduler_quota_nudges_total{reason="cards-in-service"} 2.0'
        assert nudged in w.app.metrics.exposition()
        assert _in_service(w, "n1") == 2
        assert w.filter(pinned, ["n1"])["NodeNames"] == ["n1"]
        assert w.app.state.cordoned_cards == {"n2": 1}
        w.kube.delete(NODES, "n2")  # its cordon goes with it
        eventually(lambda: w.app.state.cordoned_cards == {})
        assert b"tessera_scheduler_cards_cordoned 0.0" in w.app.metrics.exposition()
    finally:
        w.close()


def _sicken(w: World, node: str, healthy: bool) -> None:
    cards = tuple(replace(c, healthy=healthy) for c in make_cards(node, 1, "A100"))
    text = keys.encode_inventory(cards)
    w.kube.merge_patch(NODES, node, {"metadata": {"annotations": {keys.INVENTORY: text}}})


@pytest.mark.parametrize("out_by", ["cordon", "health"])
def test_pods_on_a_card_taken_out_under_them_stay_booked_through_a_restart(out_by: str) -> None:
    w = World([node_obj("n1", 1)])
    try:
        a = w.create(pod_obj("a", gpu=1, memory=30000))
        assert w.schedule(a) == "n1"
        if out_by == "cordon":
            _cordon(w, "n1", 0)
        else:
            _sicken(w, "n1", healthy=False)
        eventually(lambda: _in_service(w, "n1") == 0)
        assert w.app.state.cluster.booking("default/a") is not None
        w.app.stop()
        # A new extender lists the pod bound to a card that is out of service: it still
        # holds the card (its memory must count when the card comes back), and that is
        # no problem to report.
        from tessera.scheduler.app import SchedulerApp
        from tessera.scheduler.config import SchedulerConfig

        w.app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), w.kube)
        w.app.start()
        assert w.app.wait_synced(5)
        assert w.app.state.cluster.booking("default/a") is not None
        assert w.app.state.problems["conflicting-assignment"] == 0
        if out_by == "cordon":
            _cordon(w, "n1")
        else:
            _sicken(w, "n1", healthy=True)
        eventually(lambda: _in_service(w, "n1") == 1)
        big = w.create(pod_obj("big", gpu=1, memory=20000))  # 30000 + 20000 > 40960
        assert w.filter(big)["NodeNames"] == []
        assert w.app.state.cluster.check_invariants() == []
    finally:
        w.close()


def test_the_slice_taints_a_cordoned_card_and_reads_it_back() -> None:
    cards = list(make_cards("n1", 3, "A100"))
    cards[1] = replace(cards[1], cordoned=True)
    cards[2] = replace(cards[2], cordoned=True, healthy=False)
    obj = resource_slice("n1", cards, 1, "", "uid")
    taints = [sorted(t["key"] for t in d.get("taints", [])) for d in obj["spec"]["devices"]]
    assert taints == [[], [CORDONED_TAINT], sorted([CORDONED_TAINT, UNHEALTHY_TAINT])]
    _, back = slice_cards(obj)
    assert [(c.healthy, c.cordoned) for c in back] == [(True, False), (True, True), (False, True)]


def test_the_agent_follows_its_node_and_says_when_the_set_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tessera.node.cards.cordons")
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 2))
    kube.create(NODES, node_obj("n2", 2))
    calls: list[frozenset[str]] = []
    cordons = NodeCordons(kube, "n1", on_change=lambda: calls.append(cordons.current()))
    reflector = cordons.watch()
    try:
        assert reflector.synced.wait(5)
        assert calls == []  # nothing cordoned, nothing changed
        other = {"metadata": {"annotations": {keys.CORDONED_CARDS: "GPU-y"}}}
        kube.merge_patch(NODES, "n2", other)  # another node's cordon: not ours
        cordon = {"metadata": {"annotations": {keys.CORDONED_CARDS: "GPU-x"}}}
        kube.merge_patch(NODES, "n1", cordon)
        eventually(lambda: calls == [frozenset({"GPU-x"})])
        kube.merge_patch(NODES, "n1", {"metadata": {"labels": {"beat": "1"}}})  # no change
        kube.delete(NODES, "n1")
        eventually(lambda: calls == [frozenset({"GPU-x"}), frozenset()])
    finally:
        reflector.stop()
    assert logged(caplog, "tessera.node.cards.cordons") == [
        "node n1: cordoned cards now ['GPU-x']",
        "node n1: cordoned cards now none",
    ]


class _Racing(FakeKube):
    """A FakeKube whose first patch loses a race with another writer."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def merge_patch(self, kind: Any, name: str, patch: Any, *args: Any, **kw: Any) -> Any:
        if self.lost == 0:
            self.lost += 1
            other = {"metadata": {"annotations": {keys.CORDONED_CARDS: card_uuid("n1", 3)}}}
            super().merge_patch(kind, name, other)
        return super().merge_patch(kind, name, patch, *args, **kw)


def test_cordon_by_index_or_uuid_keeps_a_concurrent_change() -> None:
    kube = _Racing()
    kube.create(NODES, node_obj("n1", 4))
    done = change_cordons(kube, "n1", ["0", card_uuid("n1", 1)], cordon=True)
    # The first write carried a stale resourceVersion and was refused; the retry read
    # the other operator's card 3 and kept it.
    assert kube.lost == 1
    want = {card_uuid("n1", i) for i in (0, 1, 3)}
    assert done.cordoned == want
    node = kube.get(NODES, "n1")
    assert keys.parse_cordoned(node["metadata"]["annotations"][keys.CORDONED_CARDS]) == want
    assert [c.index for c in done.changed] == [0, 1]
    again = change_cordons(kube, "n1", ["1"], cordon=True)
    assert (again.changed, [c.index for c in again.unchanged]) == ((), [1])
    change_cordons(kube, "n1", ["3"], cordon=False)
    left = kube.get(NODES, "n1")["metadata"]["annotations"][keys.CORDONED_CARDS]
    assert keys.parse_cordoned(left) == {card_uuid("n1", 0), card_uuid("n1", 1)}
    change_cordons(kube, "n1", [], cordon=False)  # every card
    assert keys.CORDONED_CARDS not in kube.get(NODES, "n1")["metadata"]["annotations"]


def test_a_card_that_is_not_on_the_node_is_refused_with_the_ones_that_are() -> None:
    node = node_obj("n1", 2)
    with pytest.raises(CordonError, match=r"node n1 has no card 7, GPU-nope: give a UUID or an "
                       r"index of its cards: 0 \(GPU-.*\), 1 \(GPU-.*\)"):  # fmt: skip
        resolve_cards(node, ["0", "7", "GPU-nope"])
    plain = {"metadata": {"name": "cpu-node", "annotations": {}}}
    with pytest.raises(CordonError, match=r"^node cpu-node has no tessera\.io/inventory .*node$"):
        resolve_cards(plain, ["0"])
    garbled = node_obj("n2", 1)
    garbled["metadata"]["annotations"][keys.INVENTORY] = "{not json"
    with pytest.raises(CordonError, match=r"^node n2: annotation tessera\.io/inventory: not valid"):
        resolve_cards(garbled, ["0"])
    bad_slice = resource_slice("n1", make_cards("n1", 4, "A100")[2:], 1)
    del bad_slice["spec"]["devices"][0]["attributes"]["uuid"]
    with pytest.raises(CordonError) as refused:
        resolve_cards(node, ["0"], bad_slice)
    assert str(refused.value) == (
        "node n1: ResourceSlice n1-gpu.tessera.io: spec.devices[0].attributes.uuid: is missing"
    )
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 2))
    with pytest.raises(CordonError, match="name at least one card"):
        change_cordons(kube, "n1", [], cordon=True)
    assert keys.CORDONED_CARDS not in kube.get(NODES, "n1")["metadata"]["annotations"]


def test_a_claims_card_is_named_from_the_nodes_resource_slice() -> None:
    """On a node that offers cards 2-3 to claims, those are in its ResourceSlice, not in
    the inventory annotation; both are the node's cards to cordon."""
    cards = make_cards("n1", 4, "A100")
    node = node_obj("n1", 2)
    kube = FakeKube()
    kube.create(NODES, node)
    kube.create(RESOURCE_SLICES, resource_slice("n1", cards[2:], 1, "", "uid"))
    done = change_cordons(kube, "n1", ["3", cards[0].uuid], cordon=True)
    assert done.cordoned == {cards[0].uuid, cards[3].uuid}
    assert (done.node, [c.index for c in done.changed]) == ("n1", [3, 0])
    again = change_cordons(kube, "n1", ["3"], cordon=True)  # nothing to write
    assert (again.node, again.changed, again.cordoned) == ("n1", (), done.cordoned)
    slice_obj = kube.get(RESOURCE_SLICES, "n1-gpu.tessera.io")
    assert [c.uuid for c in resolve_cards(node, ["3"], slice_obj)] == [cards[3].uuid]
    with pytest.raises(CordonError, match=r"has no card 4: .*3 \(GPU-"):
        change_cordons(kube, "n1", ["4"], cordon=True)


def _bound(kube: FakeKube, name: str, node: str, card: int) -> None:
    """A pod bound to ``node`` holding 1000 MiB of its card ``card``, as bind leaves it."""
    assignment = Assignment(node, (ContainerAssignment(
        "main", (CardSlice(card_uuid(node, card), 1000, 10),)),))  # fmt: skip
    pod = pod_obj(name, gpu=1, memory=1000)
    pod["metadata"]["annotations"][keys.ASSIGNMENT] = keys.encode_assignment(assignment)
    pod["spec"]["nodeName"] = node
    kube.create(PODS, pod, "default")


def test_drain_evicts_the_cards_pods_retries_a_refusal_and_leaves_the_others() -> None:
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 2))
    for name, card in (("a", 0), ("b", 0), ("other", 1)):
        _bound(kube, name, "n1", card)
    uuids = frozenset({card_uuid("n1", 0)})
    assert [t.pod for t in tenants(kube, "n1", uuids)] == ["a", "b"]
    kube.fail_next("evict", ApiError(429, "TooManyRequests", "Cannot evict pod as it would "
                                     "violate the pod's disruption budget."))  # fmt: skip
    said: list[str] = []
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    left = drain(kube, "n1", uuids, 60, said.append, clock=lambda: now[0], sleep=sleep)
    assert left == []
    assert said[0].startswith("default/a: eviction refused (429 TooManyRequests")
    assert "default/b evicted" in said and "default/a evicted" in said
    assert [c[1] for c in kube.calls if c[0] == "evict"] == ["default/a", "default/b", "default/a"]
    assert now[0] >= 5  # the refused one was asked again only after retry_s
    assert [p["metadata"]["name"] for p in kube.list(PODS, "default").items] == ["other"]


def _claim_on(kube: FakeKube, name: str, device: str, *users: str) -> None:
    """A claim allocated on ``device`` of n1's slice, reserved for the pods ``users``."""
    result = {"request": "gpu", "driver": DRIVER, "pool": "n1", "device": device,
              "consumedCapacity": {"memory": "1Gi", "compute": "10", "slots": "1"}}  # fmt: skip
    kube.seed(RESOURCE_CLAIMS, {
        "metadata": {"name": name, "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [result]}},
                   "reservedFor": [{"resource": "pods", "name": u, "uid": f"u-{u}"}
                                   for u in users]},
    }, "default")  # fmt: skip


def test_the_tenants_of_a_claims_card_are_the_pods_its_claims_are_reserved_for() -> None:
    """A claim named in the pod's spec, or made from a template and named in its status:
    both are read, and their pods are the card's tenants."""
    cards = make_cards("n1", 4, "A100")
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 2))
    kube.create(RESOURCE_SLICES, resource_slice("n1", cards[2:], 1, "", "uid"))
    _claim_on(kube, "named", "gpu-2", "user")
    _claim_on(kube, "user-2-gpu-x7", "gpu-3", "templated")
    user = pod_obj("user", gpu=None)
    user["spec"]["nodeName"] = "n1"
    user["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "named"}]
    kube.create(PODS, user, "default")
    templated = pod_obj("templated", gpu=None)
    templated["spec"]["nodeName"] = "n1"
    templated["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    made = [{"name": "gpu", "resourceClaimName": "user-2-gpu-x7"}]
    templated["status"] = {"resourceClaimStatuses": made}
    kube.seed(PODS, templated, "default")
    assert [t.pod for t in tenants(kube, "n1", frozenset({cards[2].uuid}))] == ["user"]
    assert [t.pod for t in tenants(kube, "n1", frozenset({cards[3].uuid}))] == ["templated"]
    assert tenants(kube, "n1", frozenset({cards[0].uuid})) == []


def test_one_drain_pass_goes_past_a_terminating_a_gone_and_a_refused_tenant() -> None:
    """Sorted by name, each of the first three would end the pass early if it stopped
    it: the last is evicted in the same pass. A pod that ended holds nothing."""
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 1))
    for name in ("a-gone", "b-budget", "c-terminating", "d-fine", "e-done"):
        _bound(kube, name, "n1", 0)
    kube.merge_patch(PODS, "c-terminating", {"metadata": {
        "deletionTimestamp": "2026-11-29T21:00:00Z"}}, "default")  # fmt: skip
    kube.merge_patch(PODS, "e-done", {"status": {"phase": "Succeeded"}}, "default",
                     subresource="status")  # fmt: skip
    uuids = frozenset({card_uuid("n1", 0)})
    assert [(t.pod, t.terminating) for t in tenants(kube, "n1", uuids)] == [
        ("a-gone", False),
        ("b-budget", False),
        ("c-terminating", True),
        ("d-fine", False),
    ]
    kube.fail_next("evict", NotFound(404, "NotFound", 'pods "a-gone" not found'))
    kube.fail_next("evict", ApiError(429, "TooManyRequests", "disruption budget"))
    said: list[str] = []
    left = drain(kube, "n1", uuids, 0, said.append, clock=lambda: 0.0, sleep=lambda s: None)
    assert [c[1] for c in kube.calls if c[0] == "evict"] == [
        "default/a-gone", "default/b-budget", "default/d-fine"]  # fmt: skip
    assert said == [
        "default/b-budget: eviction refused (429 TooManyRequests: disruption budget); "
        "trying again every 5 s",
        "default/d-fine evicted",
    ]
    assert [t.pod for t in left] == ["a-gone", "b-budget", "c-terminating", "d-fine"]


def test_a_claim_shared_by_pods_makes_the_running_ones_tenants_and_a_gone_claim_is_passed() -> None:
    cards = make_cards("n1", 4, "A100")
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 2))
    kube.create(RESOURCE_SLICES, resource_slice("n1", cards[2:], 1, "", "uid"))
    _claim_on(kube, "shared", "gpu-2", "one", "two", "three")
    for name in ("one", "two", "three"):
        user = pod_obj(name, gpu=None)
        user["spec"]["nodeName"] = "n1"
        user["spec"]["resourceClaims"] = [
            {"name": "old", "resourceClaimName": "a-deleted"},  # read first, and gone
            {"name": "gpu", "resourceClaimName": "shared"},
        ]
        kube.create(PODS, user, "default")
    kube.merge_patch(PODS, "three", {"status": {"phase": "Succeeded"}}, "default",
                     subresource="status")  # fmt: skip
    # "three" ended: the claim still names it, but it holds nothing any more.
    assert [t.pod for t in tenants(kube, "n1", frozenset({cards[2].uuid}))] == ["one", "two"]


def test_drain_gives_up_at_the_deadline_naming_who_is_left() -> None:
    kube = FakeKube()
    kube.create(NODES, node_obj("n1", 1))
    _bound(kube, "stuck", "n1", 0)
    for _ in range(20):  # a budget that never allows it
        kube.fail_next("evict", ApiError(429, "TooManyRequests", "disruption budget"))
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    said: list[str] = []
    left = drain(kube, "n1", frozenset({card_uuid("n1", 0)}), 12, said.append,
                 clock=lambda: now[0], sleep=sleep)  # fmt: skip
    assert [t.pod for t in left] == ["stuck"]
    assert len([s for s in said if "refused" in s]) == 1  # said once, tried every 5 s
    assert len([c for c in kube.calls if c[0] == "evict"]) == 3  # at 0, 6 and 12 s


def test_a_nodes_first_inventory_nudges_the_waiting_pods_but_a_restart_does_not() -> None:
    """The agent patches the inventory after kubelet registered the Node, and
    kube-scheduler moves no pod on that annotation: waiting pods are nudged. An extender
    that starts and lists nodes it never saw nudges no one."""
    bare = node_obj("n2", 1)
    inventory = bare["metadata"]["annotations"].pop(keys.INVENTORY)
    w = World([node_obj("n1", 1), bare])
    try:
        eventually(lambda: "n1" in w.app.state.cluster)
        waiting = w.create(pod_obj("wait", gpu=2))  # fits nowhere yet
        assert w.filter(waiting)["NodeNames"] == []
        eventually(lambda: "default/wait" in w.app.state.pods)
        assert w.app.quota_writer.nudged == 0
        w.kube.merge_patch(NODES, "n2", {"metadata": {"annotations": {keys.INVENTORY: inventory}}})
        eventually(lambda: keys.QUOTA_RETRY in _pod_annotations(w.kube, "wait"))
        nudged = w.app.quota_writer.nudged
        w.app.stop()
        from tessera.scheduler.app import SchedulerApp
        from tessera.scheduler.config import SchedulerConfig

        w.app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), w.kube)
        w.app.start()
        assert w.app.wait_synced(5)
        eventually(lambda: "default/wait" in w.app.state.pods)
        w.app.quota_writer.step()  # a round now: nothing to nudge after a first list
        assert w.app.quota_writer.nudged == 0 and nudged == 1
    finally:
        w.close()


def test_a_node_deleted_and_created_again_nudges_no_one() -> None:
    """kube-scheduler sees a Node's creation itself and tries its waiting pods again;
    only a node's cards coming into service under the same Node need a nudge."""
    w = World([node_obj("n1", 1), node_obj("n2", 1)])
    try:
        waiting = w.create(pod_obj("wait", gpu=2))
        assert w.filter(waiting)["NodeNames"] == []
        eventually(lambda: "default/wait" in w.app.state.pods)
        w.kube.delete(NODES, "n2")
        eventually(lambda: "n2" not in w.app.state.cluster)
        w.kube.create(NODES, node_obj("n2", 2))
        eventually(lambda: "n2" in w.app.state.cluster)
        w.app.quota_writer.step()
        assert w.app.quota_writer.nudged == 0
        assert keys.QUOTA_RETRY not in _pod_annotations(w.kube, "wait")
    finally:
        w.close()


def test_cards_coming_back_in_a_burst_nudge_each_waiting_pod_once_a_round() -> None:
    """Fifty nodes joining at once must not patch every pending pod fifty times: the
    rounds that nudge for cards back in service are CARDS_BACK_EVERY_S apart."""
    kube = FakeKube()
    state = SchedulerState()
    for name in ("a", "b"):
        pod = kube.create(PODS, pod_obj(name), "default")
        state.apply_pod(pod)
    now = [1000.0]
    writer = QuotaWriter(state, kube, lambda: True, clock=lambda: now[0])
    for i in range(50):
        writer.cards_back(make_cards(f"n{i}", 8, "A100"))
    writer.step()
    assert writer.nudged == 2
    writer.cards_back(make_cards("n50", 1, "A100"))
    now[0] += CARDS_BACK_EVERY_S - 1
    writer.step()
    assert writer.nudged == 2  # too soon: kept for a later round
    now[0] += 1
    writer.step()
    assert writer.nudged == 4
    writer.step()
    assert writer.nudged == 4  # nothing new came into service


def test_cards_back_nudge_the_pods_one_of_their_kinds_can_take() -> None:
    """Cards of two kinds come back: a pod that only the larger can hold is nudged, one
    that neither can is not, and one pinned to a card that came back is."""
    kube = FakeKube()
    state = SchedulerState()
    back = make_cards("n1", 1, "T4", memory_mib=16384) + make_cards("n2", 1, "A100")
    waiting = {
        "large": pod_obj("large", gpu=1, memory=30000),
        "huge": pod_obj("huge", gpu=1, memory=200000),
        "pinned": pod_obj("pinned", gpu=1, annotations={"tessera.io/gpu-uuid": back[0].uuid}),
    }
    for pod in waiting.values():
        state.apply_pod(kube.create(PODS, pod, "default"))
    writer = QuotaWriter(state, kube, lambda: True, clock=lambda: 1000.0)
    writer.cards_back(back)
    writer.step()
    nudged = {n for n in waiting if keys.QUOTA_RETRY in _pod_annotations(kube, n)}
    assert nudged == {"large", "pinned"}


def test_uncordon_drops_a_uuid_no_card_shows_any_more() -> None:
    """A card replaced (a new UUID after a repair), or left out of the slice by an API
    server without device taints: its UUID stays in the list until uncordoned by name
    or with the whole node. A UUID neither listed nor on the node is still refused."""
    kube = FakeKube()
    node = node_obj("n1", 2)
    node["metadata"]["annotations"][keys.CORDONED_CARDS] = f"GPU-gone,{card_uuid('n1', 0)}"
    kube.create(NODES, node)
    done = change_cordons(kube, "n1", ["GPU-gone"], cordon=False)
    assert (done.dropped, done.changed, done.cordoned) == (("GPU-gone",), (), {card_uuid("n1", 0)})
    with pytest.raises(CordonError, match="has no card GPU-never"):
        change_cordons(kube, "n1", ["GPU-never"], cordon=False)
    patch = {"metadata": {"annotations": {keys.CORDONED_CARDS: f"GPU-old,{card_uuid('n1', 0)}"}}}
    kube.merge_patch(NODES, "n1", patch)
    every = change_cordons(kube, "n1", [], cordon=False)
    assert every.dropped == ("GPU-old",) and [c.index for c in every.changed] == [0]
    assert keys.CORDONED_CARDS not in kube.get(NODES, "n1")["metadata"]["annotations"]


def test_cards_coming_back_nudge_only_the_waiting_pods_that_could_use_them() -> None:
    """A T4 coming back is no news to a pod that wants A100s, nor a 16 GiB card to one
    that asks 30,000 MiB, nor a card to a pod pinned to another; each of those is
    nudged when a card it could use comes back."""
    kube, state = FakeKube(), SchedulerState()
    t4 = card_uuid("t", 0)
    pods = {
        "any": pod_obj("any", gpu=1),
        "a100": pod_obj("a100", gpu=1, annotations={keys.GPU_MODEL: "A100"}),
        "big": pod_obj("big", gpu=1, memory=30_000),
        "pinned": pod_obj("pinned", gpu=1, memory=1000, annotations={keys.GPU_UUID: t4}),
        "pinned-elsewhere": pod_obj("pinned-elsewhere", gpu=1, memory=1000,
                                    annotations={keys.GPU_UUID: card_uuid("x", 0)}),
    }  # fmt: skip
    for pod in pods.values():
        state.apply_pod(kube.create(PODS, pod, "default"))
    assert all(state.pods[f"default/{n}"].request is not None for n in pods)
    now = [1000.0]
    writer = QuotaWriter(state, kube, lambda: True, clock=lambda: now[0])

    def nudged() -> set[str]:
        return {n for n in pods if keys.QUOTA_RETRY in _annotations(kube, n)}

    writer.cards_back(make_cards("t", 1, "T4"))  # 15,360 MiB
    writer.step()
    assert nudged() == {"any", "pinned"}
    now[0] += CARDS_BACK_EVERY_S
    writer.cards_back(make_cards("a", 1, "A100"))  # 40,960 MiB
    writer.step()
    assert nudged() == {"any", "pinned", "a100", "big"}  # never the pod pinned elsewhere


def _annotations(kube: FakeKube, name: str) -> dict[str, str]:
    return dict(kube.get(PODS, name, "default")["metadata"].get("annotations") or {})


def test_a_pod_both_a_raised_quota_and_cards_back_would_nudge_is_nudged_once() -> None:
    kube, state = FakeKube(), SchedulerState()
    state.apply_pod(kube.create(PODS, pod_obj("p"), "default"))
    writer = QuotaWriter(state, kube, lambda: True, clock=lambda: 1000.0)
    writer.raised({"default"})
    writer.cards_back(make_cards("n1", 1, "A100"))
    writer.step()
    assert writer.nudged == 1
    assert [c for c in kube.calls if c[0] == "merge_patch"] == [("merge_patch", "pods/p")]
