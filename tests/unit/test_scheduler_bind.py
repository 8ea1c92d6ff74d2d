"""bind: the Binding carries the assignment (one write); on failure nothing stays."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from tessera.kube import PODS, ApiError, Unavailable
from tessera.kube.errors import NotSent
from tessera.model.annotations import ASSIGNMENT, decode_assignment, encode_assignment
from tessera.model.clusterspec import make_cards
from tests.unit._scheduler_world import World, add_quota, gpu_quota, node_obj, pod_obj, scraped
from tests.unit._wait import eventually as _eventually


@pytest.fixture
def world() -> Iterator[World]:
    w = World([node_obj("n1", 2)])
    yield w
    w.close()


def failures(world: World, reason: str) -> float:
    """tessera_scheduler_failures_total{verb="bind",reason}, as scraped (0 when absent)."""
    return scraped(world, "tessera_scheduler_failures_total", verb="bind", reason=reason)


def _node_seen(world: World, key: str) -> str | None:
    info = world.app.state.pods.get(key)
    return info.node_name if info else None


def test_bind_writes_the_reserved_assignment_with_the_binding(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=1, memory=1000, cores=30))
    node = world.filter(pod)["NodeNames"][0]
    reserved = world.app.state.reservations.get("default/p")
    assert reserved is not None
    before = len(world.kube.calls)
    assert world.bind(pod, node) == {"Error": ""}
    assert not [c for c in world.kube.calls[before:] if c[0] == "get"]  # a pod it knows
    stored = world.kube.get(PODS, "p", "default")
    assert stored["spec"]["nodeName"] == node
    assignment = decode_assignment("default/p", stored["metadata"]["annotations"][ASSIGNMENT])
    assert assignment == reserved.assignment
    writes = [op for op, _ in world.kube.calls if op in ("merge_patch", "bind", "replace")]
    assert writes == ["bind"]  # one write: node and assignment together
    _eventually(lambda: "default/p" not in world.app.state.reservations)
    assert world.app.state.held("default/p") == assignment


def test_binding_failure_releases_and_writes_nothing(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=2))
    node = world.filter(pod)["NodeNames"][0]
    world.kube.fail_next("bind", ApiError(403, "Forbidden", "binding not allowed"))
    out = world.bind(pod, node)
    assert "binding not allowed" in out["Error"]
    assert world.app.state.held("default/p") is None
    assert "default/p" not in world.app.state.reservations
    stored = world.kube.get(PODS, "p", "default")
    assert ASSIGNMENT not in stored["metadata"].get("annotations", {})
    assert not stored["spec"].get("nodeName")
    # The cards are free again: the retry succeeds.
    node = world.filter(pod)["NodeNames"][0]
    assert world.bind(pod, node) == {"Error": ""}


def test_pod_bound_meanwhile_is_a_conflict_and_frees_the_cards(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=2))
    node = world.filter(pod)["NodeNames"][0]
    with world.kube.hold_watches():  # the extender has not seen it yet
        world.kube.bind("default", "p", pod["metadata"]["uid"], node)  # someone else bound it
        out = world.bind(pod, node)
        assert "already assigned" in out["Error"]
        assert "default/p" not in world.app.state.reservations
    _eventually(lambda: _node_seen(world, "default/p") == node)
    assert world.app.state.held("default/p") is None


def test_bind_sent_again_after_its_write_landed_is_bound_and_keeps_the_cards(
    world: World,
) -> None:
    # A bind whose first try landed before the watch showed it (kube-scheduler gave up
    # waiting and a restarted replica got the retry): the API server says Conflict, but
    # the pod is bound exactly as decided -- answering an error would release its cards.
    pod = world.create(pod_obj("p", gpu=1))
    node = world.filter(pod)["NodeNames"][0]
    reserved = world.app.state.reservations.get("default/p")
    assert reserved is not None
    first_try = {ASSIGNMENT: encode_assignment(reserved.assignment)}
    with world.kube.hold_watches():
        world.kube.bind("default", "p", pod["metadata"]["uid"], node, first_try)
        assert world.bind(pod, node) == {"Error": ""}
        assert world.app.state.held("default/p") == reserved.assignment
    _eventually(lambda: "default/p" not in world.app.state.reservations)  # confirmed
    assert world.app.state.held("default/p") == reserved.assignment
    other = world.create(pod_obj("q", gpu=1))
    assert world.schedule(other) == node  # the node's other card, not this pod's
    q_held = world.app.state.held("default/q")
    assert q_held is not None
    assert not q_held.footprint().keys() & reserved.assignment.footprint().keys()


def test_bound_with_other_cards_is_a_conflict_and_the_watch_books_them(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=1))
    node = world.filter(pod)["NodeNames"][0]
    reserved = world.app.state.reservations.get("default/p")
    assert reserved is not None
    (chosen,) = reserved.assignment.containers[0].slices
    (other_card,) = [c.uuid for c in make_cards(node, 2, "A100") if c.uuid != chosen.uuid]
    container = dataclasses.replace(
        reserved.assignment.containers[0], slices=(dataclasses.replace(chosen, uuid=other_card),)
    )
    elsewhere = dataclasses.replace(reserved.assignment, containers=(container,))
    written = {ASSIGNMENT: encode_assignment(elsewhere)}
    with world.kube.hold_watches():  # another replica bound it, with the other card
        world.kube.bind("default", "p", pod["metadata"]["uid"], node, written)
        assert "already assigned" in world.bind(pod, node)["Error"]
        assert world.app.state.held("default/p") is None
    _eventually(lambda: world.app.state.held("default/p") == elsewhere)


def test_pod_seen_bound_is_not_bound_again(world: World) -> None:
    pod = world.create(pod_obj("p", gpu=1))
    node = world.schedule(pod)
    assert node is not None
    _eventually(lambda: _node_seen(world, "default/p") == node)
    held = world.app.state.held("default/p")
    binds = sum(op == "bind" for op, _ in world.kube.calls)
    out = world.bind(pod, node)
    assert out["Error"] == f"pod default/p is already bound to {node}"
    assert world.app.state.held("default/p") == held  # the booking stays
    assert sum(op == "bind" for op, _ in world.kube.calls) == binds  # nothing written
    assert failures(world, "already-bound") == 1


def test_bind_without_reservation_checks_the_live_state(world: World) -> None:
    a = world.create(pod_obj("a", gpu=2))
    b = world.create(pod_obj("b", gpu=1))
    _eventually(lambda: "default/a" in world.app.state.pods)
    before = len(world.kube.calls)
    assert world.bind(a, "n1") == {"Error": ""}  # no filter: cards picked at bind
    assert not [c for c in world.kube.calls[before:] if c[0] == "get"]  # it knew the pod
    out = world.bind(b, "n1")
    assert "no longer fits" in out["Error"]
    assert ASSIGNMENT not in world.kube.get(PODS, "b", "default")["metadata"].get("annotations", {})
    assert failures(world, "no-longer-fits") == 1


def test_bind_without_reservation_keeps_the_namespace_within_its_quota(world: World) -> None:
    add_quota(world, gpu_quota("default", {"name": "a100", "models": ["A100"], "cards": 1}))
    a = world.create(pod_obj("a", gpu=1))
    b = world.create(pod_obj("b", gpu=1))
    assert world.bind(a, "n1") == {"Error": ""}
    out = world.bind(b, "n1")  # a card is free, but not in the quota
    assert out["Error"].startswith("pod default/b: quota: default/gpus a100")
    assert ASSIGNMENT not in world.kube.get(PODS, "b", "default")["metadata"].get("annotations", {})
    assert failures(world, "quota") == 1 and failures(world, "no-longer-fits") == 0
    big = world.create(pod_obj("big", gpu=2))  # one card free: it would not fit anyway
    assert "no longer fits on n1" in world.bind(big, "n1")["Error"]
    assert failures(world, "quota") == 1 and failures(world, "no-longer-fits") == 1


def test_bind_of_a_pod_whose_spec_breaks_a_rule_names_the_field(world: World) -> None:
    bad = world.create(pod_obj("bad", gpu=1, cores=150))
    out = world.bind(bad, "n1")
    assert out["Error"].startswith("pod default/bad: ") and "tessera.io/gpu-cores" in out["Error"]
    assert world.kube.get(PODS, "bad", "default")["spec"].get("nodeName") is None
    assert failures(world, "bad-spec") == 1


def test_parallel_binds_never_share_a_card() -> None:
    w = World([node_obj(f"n{i}", 2) for i in range(4)], narrow=False)
    try:
        pods = [w.create(pod_obj(f"p{i}", gpu=1)) for i in range(12)]
        results: list[str] = []

        def go(pod: dict) -> None:  # type: ignore[type-arg]
            results.append(w.bind(pod, "n0")["Error"])

        threads = [threading.Thread(target=go, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(1 for r in results if r == "") == 2
        with w.app.state.lock:
            assert w.app.state.cluster.check_invariants() == []
    finally:
        w.close()


def test_a_pod_recreated_under_its_name_is_never_bound_with_the_old_ones_request(
    world: World,
) -> None:
    # The old pod (one card) was seen and reserved for; it was deleted and a new pod of
    # its name (two cards) came before the watch said so. A bind for the new UID must
    # not take the old pod's request and cards: refused, nothing written, retried later.
    old = world.create(pod_obj("p", gpu=1, memory=1000, cores=10))
    _eventually(lambda: "default/p" in world.app.state.pods)
    assert world.filter(old)["NodeNames"] == ["n1"]
    with world.kube.hold_watches():
        world.kube.delete(PODS, "p", "default")
        new = world.create(pod_obj("p", gpu=2))
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        out = world.bind(new, "n1")
        assert (
            f"pod default/p ({new['metadata']['uid']}) is not a Tessera pod I know" in out["Error"]
        )
        stored = world.kube.get(PODS, "p", "default")
        assert not stored["spec"].get("nodeName")
        assert ASSIGNMENT not in stored["metadata"].get("annotations", {})


def test_unknown_pod_is_an_error_not_a_crash(world: World) -> None:
    status, out = world.post(
        "bind", {"PodName": "ghost", "PodNamespace": "default", "PodUID": "x", "Node": "n1"}
    )
    assert status == 200
    assert out["Error"] == "pod default/ghost no longer exists"
    assert failures(world, "gone") == 1 and failures(world, "api") == 0  # not API trouble


def test_a_bind_for_a_pod_that_asks_for_no_gpu_is_refused(world: World) -> None:
    plain = world.create(pod_obj("plain", gpu=None))
    _eventually(lambda: "default/plain" in world.app.state.pods)
    out = world.bind(plain, "n1")
    uid = plain["metadata"]["uid"]
    assert out["Error"] == f"pod default/plain ({uid}) is not a Tessera pod I know"
    assert failures(world, "unknown-pod") == 1


def test_a_pod_the_api_server_cannot_read_is_an_api_failure_and_one_replaced_is_gone(
    world: World,
) -> None:
    pod = world.create(pod_obj("p", gpu=1))
    world.kube.fail_next("get", ApiError(500, "InternalError", "etcdserver: leader changed"))
    with world.kube.hold_watches():  # the extender has not seen it: it must read it
        stranger = {**pod, "metadata": {**pod["metadata"], "uid": "other"}}
        out = world.bind(stranger, "n1")
    assert out["Error"].startswith("pod default/p: cannot read it: ")
    assert failures(world, "api") == 1
    # Read this time: the pod under that name is another one (replaced since).
    assert world.bind(stranger, "n1")["Error"] == "pod default/p (other) no longer exists"
    assert failures(world, "gone") == 1 and failures(world, "api") == 1


# --- writes whose outcome is unknown --------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        Unavailable(0, "Unavailable", "read timed out"),
        ApiError(504, "Timeout", "request did not complete within the allowed duration"),
        ApiError(500, "InternalError", "etcdserver: request timed out"),
    ],
    ids=["no-answer", "504", "500"],
)
def test_a_binding_that_landed_without_an_answer_keeps_its_cards(error: ApiError) -> None:
    # The write landed; its answer was lost. Releasing the cards would let the next pod
    # take the cards of a pod that is bound to them.
    world = World([node_obj("n1", 2)])
    try:
        a = world.create(pod_obj("a", gpu=2))
        b = world.create(pod_obj("b", gpu=2))
        with world.kube.hold_watches():  # the extender has not seen the landing yet
            node = world.filter(a)["NodeNames"][0]
            world.kube.lose_answer_of_next("bind", error)
            out = world.bind(a, node)
            assert "may have landed" in out["Error"]
            assert failures(world, "outcome-unknown") == 1
            assert world.kube.get(PODS, "a", "default")["spec"]["nodeName"] == node
            assert world.filter(b)["NodeNames"] == []  # a's cards are still taken
            refused = world.filter(a)
            assert refused["NodeNames"] == [] and "may have landed" in refused["FailedNodes"][node]
        # The watch shows a bound with its assignment: confirmed, cards stay a's.
        _eventually(lambda: "default/a" not in world.app.state.reservations)
        assert world.app.state.held("default/a") is not None
        assert world.filter(b)["NodeNames"] == []
    finally:
        world.close()


def test_a_binding_never_sent_frees_its_cards_at_once() -> None:
    """The service-account token could not be read (it rotates): no request went out,
    so nothing can have landed and the cards are not held in doubt."""
    world = World([node_obj("n1", 2)])
    try:
        a = world.create(pod_obj("a", gpu=2))
        b = world.create(pod_obj("b", gpu=2))
        node = world.filter(a)["NodeNames"][0]
        world.kube.fail_next("bind", NotSent(0, "Unavailable", "credentials: no token"))
        out = world.bind(a, node)["Error"]
        assert out == f"pod default/a on {node}: 0 Unavailable: credentials: no token"
        assert failures(world, "api") == 1 and failures(world, "outcome-unknown") == 0
        assert world.schedule(b) == node  # free at once
    finally:
        world.close()


def test_a_binding_of_unknown_outcome_that_never_landed_frees_the_cards_after_the_doubt() -> None:
    world = World([node_obj("n1", 2)], bind_doubt_s=0.3)
    try:
        a = world.create(pod_obj("a", gpu=2))
        b = world.create(pod_obj("b", gpu=2))
        node = world.filter(a)["NodeNames"][0]
        world.kube.fail_next("bind", Unavailable(0, "Unavailable", "connection reset"))
        assert "may have landed" in world.bind(a, node)["Error"]
        assert world.filter(b)["NodeNames"] == []  # in doubt: held
        time.sleep(0.4)
        assert world.schedule(b) == node  # past the doubt, with nothing seen: free again
        assert not world.kube.get(PODS, "a", "default")["spec"].get("nodeName")
    finally:
        world.close()
