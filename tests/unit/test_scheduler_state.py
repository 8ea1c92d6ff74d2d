"""The extender's state: rebuilt from annotations alone, current through watches."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tessera.kube import NODES, PODS
from tessera.model.annotations import INVENTORY
from tests.unit._scheduler_world import World, node_obj, pod_obj
from tests.unit._wait import eventually as _eventually


def test_restart_rebuilds_every_booking_from_annotations() -> None:
    w = World([node_obj(f"n{i}", 2) for i in range(3)])
    placed = {}
    for i in range(5):
        pod = w.create(pod_obj(f"p{i}", gpu=1, memory=20000))
        placed[pod["metadata"]["name"]] = w.schedule(pod)
    before = w.app.state.cluster.bookings()
    w.app.stop()
    # A new process over the same API: nothing but the annotations to go on.
    w2 = World.__new__(World)
    w2.kube = w.kube
    from tessera.scheduler.app import SchedulerApp
    from tessera.scheduler.config import SchedulerConfig

    w2.app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), w.kube)
    w2.app.start()
    try:
        assert w2.app.wait_synced(5)
        after = w2.app.state.cluster.bookings()
        assert {k: b.assignment for k, b in after.items()} == {
            k: b.assignment for k, b in before.items()
        }
        assert w2.app.state.cluster.check_invariants() == []
        # And it goes on without double booking: 6 cards of 40960 MiB, the 5 pods of
        # 20000 MiB packed onto 3 of them; 3 cards are left for 30000 MiB pods.
        extra = [w2.create(pod_obj(f"q{i}", gpu=1, memory=30000)) for i in range(4)]
        nodes = [w2.schedule(p) for p in extra]
        assert sum(n is not None for n in nodes) == 3
        assert w2.app.state.cluster.check_invariants() == []
    finally:
        w2.close()


def test_deleted_and_finished_pods_give_their_cards_back() -> None:
    w = World([node_obj("n1", 1)])
    try:
        a = w.create(pod_obj("a"))
        assert w.schedule(a) == "n1"
        w.kube.merge_patch(PODS, "a", {"status": {"phase": "Succeeded"}}, "default",
                           subresource="status")  # fmt: skip
        _eventually(lambda: w.app.state.held("default/a") is None)
        b = w.create(pod_obj("b"))
        assert w.schedule(b) == "n1"
        w.kube.delete(PODS, "b", "default")
        _eventually(lambda: w.app.state.held("default/b") is None)
    finally:
        w.close()


def test_node_inventory_changes_and_bad_inventories() -> None:
    w = World([node_obj("n1", 1)])
    try:
        w.kube.create(NODES, node_obj("n2", 4))
        _eventually(lambda: "n2" in w.app.state.cluster)
        w.kube.merge_patch(NODES, "n2", {"metadata": {"annotations": {INVENTORY: "{not json"}}})
        _eventually(lambda: "n2" in w.app.state.bad_nodes)
        assert "n2" not in w.app.state.cluster
        pod = w.create(pod_obj("p", gpu=4))
        out = w.filter(pod, ["n1", "n2"])
        assert "inventory refused" in out["FailedNodes"]["n2"]
        w.kube.delete(NODES, "n2")
        _eventually(lambda: "n2" not in w.app.state.bad_nodes)
    finally:
        w.close()


def test_relist_after_gone_drops_what_vanished_meanwhile() -> None:
    w = World([node_obj("n1", 2)])
    try:
        a = w.create(pod_obj("a"))
        assert w.schedule(a) == "n1"
        _eventually(lambda: "default/a" not in w.app.state.reservations)
        lists = w.app.pod_reflector.lists
        w.kube.expire_history()
        w.kube.delete(PODS, "a", "default")
        w.kube.expire_history()
        _eventually(lambda: w.app.pod_reflector.lists > lists)
        _eventually(lambda: w.app.state.held("default/a") is None)
        assert w.app.state.cluster.check_invariants() == []
    finally:
        w.close()


def test_annotation_without_binding_is_held_until_scheduled_again() -> None:
    w = World([node_obj("n1", 1)])
    try:
        a = w.create(pod_obj("a"))
        node = w.filter(a)["NodeNames"][0]
        # The process dies after the annotation, before the Binding: simulate by writing
        # the annotation of the reservation and forgetting the reservation.
        from tessera.model.annotations import ASSIGNMENT, encode_assignment

        res = w.app.state.reservations.get("default/a")
        assert res is not None
        text = encode_assignment(res.assignment)
        w.kube.merge_patch(PODS, "a", {"metadata": {"annotations": {ASSIGNMENT: text}}}, "default")
        _eventually(lambda: "default/a" not in w.app.state.reservations)
        assert w.app.state.held("default/a") is not None  # held, conservatively
        # The scheduler tries the pod again: filter releases the stale hold and decides.
        fresh = w.kube.get(PODS, "a", "default")
        assert w.filter(fresh)["NodeNames"] == [node]
        assert w.bind(fresh, node) == {"Error": ""}
        assert w.app.state.cluster.check_invariants() == []
    finally:
        w.close()


def test_a_watch_event_from_before_the_bind_does_not_free_the_cards() -> None:
    # No reflector runs here: the test plays the watch itself, late, as a loaded
    # watch connection does -- the pod's ADDED event arrives after its bind returned.
    from tessera.kube import FakeKube
    from tessera.scheduler.bind import begin_bind
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import BindingArgs, ExtenderArgs

    kube = FakeKube()
    state, placer = SchedulerState(), Placer()
    state.apply_node(kube.create(NODES, node_obj("n1", 1)))

    def schedule(name: str) -> str:
        pod = kube.create(PODS, pod_obj(name, gpu=1, memory=30000), "default")
        out = filter_pod(state, placer, ExtenderArgs(pod=pod, node_names=["n1"]))
        if not out.node_names:
            return ""
        uid = pod["metadata"]["uid"]
        pending = begin_bind(state, placer, kube, BindingArgs(name, "default", uid, "n1"))
        kube.bind("default", name, uid, "n1", pending.annotations)
        state.apply_pod(pod)  # the stale ADDED event: unbound, no annotation
        return "n1"

    assert schedule("a") == "n1"
    assert state.held("default/a") is not None
    # The only card (40960 MiB) still holds a's 30000 MiB: b must not fit.
    assert schedule("b") == ""
    # The bound event confirms the reservation; the booking stays.
    state.apply_pod(kube.get(PODS, "a", "default"))
    assert "default/a" not in state.reservations
    assert state.held("default/a") is not None
    assert state.cluster.check_invariants() == []


def test_a_relist_that_predates_a_reservation_keeps_it_until_it_expires() -> None:
    from tessera.kube import FakeKube
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import ExtenderArgs

    now = [0.0]
    kube = FakeKube()
    state = SchedulerState(reservation_ttl_s=30, clock=lambda: now[0])
    placer = Placer()
    state.apply_node(kube.create(NODES, node_obj("n1", 1)))
    listed = list(kube.list(PODS).items)  # the re-list is taken before the pod exists
    pod = kube.create(PODS, pod_obj("a", gpu=1, memory=30000), "default")
    assert filter_pod(state, placer, ExtenderArgs(pod=pod, node_names=["n1"])).node_names
    state.replace_pods(listed)
    assert state.held("default/a") is not None  # not dropped by the older list
    now[0] = 31.0
    assert state.expire_reservations() == 1  # a pod that never shows up frees its cards
    assert state.held("default/a") is None


@pytest.mark.parametrize("filtered", [True, False], ids=["after-filter", "bind-only"])
def test_a_reservation_whose_write_outlasts_its_ttl_keeps_its_cards(filtered: bool) -> None:
    """A Binding queued behind a saturated API server for longer than the reservation's
    TTL: the cards stay the pod's until the write's outcome, whether the reservation was
    made at filter or, with no filter before (a restarted replica), at bind."""
    from tessera.kube import FakeKube
    from tessera.scheduler.bind import begin_bind, release_pending
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import BindingArgs, ExtenderArgs

    now = [0.0]
    kube = FakeKube()
    state, placer = SchedulerState(reservation_ttl_s=30, clock=lambda: now[0]), Placer()
    state.apply_node(kube.create(NODES, node_obj("n1", 1)))
    pod = kube.create(PODS, pod_obj("a", gpu=1, memory=30000), "default")
    if filtered:
        assert filter_pod(state, placer, ExtenderArgs(pod=pod, node_names=["n1"])).node_names
    args = BindingArgs("a", "default", pod["metadata"]["uid"], "n1")
    pending = begin_bind(state, placer, kube, args)
    now[0] = 31.0
    assert state.expire_reservations() == 0
    assert state.held("default/a") == pending.assignment
    other = kube.create(PODS, pod_obj("b", gpu=1, memory=30000), "default")
    assert filter_pod(state, placer, ExtenderArgs(pod=other, node_names=["n1"])).node_names == []
    release_pending(state, pending)  # the write failed: now the cards are free
    assert state.held("default/a") is None


def test_a_retry_while_the_bind_is_still_writing_keeps_the_cards() -> None:
    """kube-scheduler gives up on a bind after its httpTimeout and schedules the pod again
    while the extender's first write is still queued. The retry must not place the pod a
    second time: its bind would win, the first write would then fail with Conflict and
    release the cards of a bound pod, and another pod would get them."""
    from tessera.kube import ApiError, FakeKube
    from tessera.scheduler.bind import begin_bind, write_failed
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import BindingArgs, ExtenderArgs

    kube = FakeKube()
    state, placer = SchedulerState(), Placer()
    state.apply_node(kube.create(NODES, node_obj("n1", 1)))

    def start(name: str) -> tuple[dict[str, Any], Any]:
        """filter, then a bind whose write has not happened yet."""
        pod = kube.create(PODS, pod_obj(name, gpu=1, memory=30000), "default")
        assert filter_pod(state, placer, ExtenderArgs(pod=pod, node_names=["n1"])).node_names
        args = BindingArgs(name, "default", pod["metadata"]["uid"], "n1")
        return pod, begin_bind(state, placer, kube, args)

    def write(pending: Any) -> None:
        a = pending.args
        try:
            kube.bind(a.pod_namespace, a.pod_name, a.pod_uid, a.node, pending.annotations)
        except ApiError as exc:
            write_failed(state, pending, exc)

    def offered(pod: dict[str, Any]) -> list[str]:
        return filter_pod(state, placer, ExtenderArgs(pod=pod, node_names=["n1"])).node_names

    a, first = start("a")
    retry = filter_pod(state, placer, ExtenderArgs(pod=a, node_names=["n1"]))
    if retry.node_names:  # what kube-scheduler does with an offered node: bind (it wins)
        write(begin_bind(state, placer, kube, first.args))
    write(first)  # lands late
    b = kube.create(PODS, pod_obj("b", gpu=1, memory=30000), "default")
    assert offered(b) == []  # the only card holds a's 30000 MiB
    assert retry.node_names == [] and "still in flight" in retry.failed["n1"]
    state.apply_pod(kube.get(PODS, "a", "default"))  # the watch confirms a
    assert offered(b) == []
    assert state.held("default/a") == first.assignment
    assert state.cluster.check_invariants() == []

    # A first write that fails for sure releases the cards, and the retry after it places
    # the pod (one whose outcome is unknown keeps them: test_scheduler_bind.py).
    kube.delete(PODS, "a", "default")
    state.apply_pod(a, deleted=True)
    c, failing = start("c")
    kube.fail_next("bind", ApiError(422, "Invalid", "binding refused"))
    write(failing)
    assert offered(c) == ["n1"]


def test_a_pod_already_bound_is_not_placed_again() -> None:
    """kube-scheduler's cache may not have seen a bind yet and schedule the pod again;
    the booking of a bound pod must not be released for it."""
    w = World([node_obj("n1", 1)])
    try:
        a = w.create(pod_obj("a", gpu=1, memory=30000))
        assert w.schedule(a) == "n1"
        _eventually(lambda: "default/a" not in w.app.state.reservations)  # the watch has it
        assert w.app.state.pods["default/a"].node_name == "n1"
        out = w.filter(a)
        if out["NodeNames"]:  # what kube-scheduler does with an offered node: bind
            assert "already assigned" in w.bind(a, out["NodeNames"][0])["Error"]
        assert w.filter(w.create(pod_obj("b", gpu=1, memory=30000)))["NodeNames"] == []
        assert out["NodeNames"] == [] and "already bound to n1" in out["FailedNodes"]["n1"]
        assert w.app.state.held("default/a") is not None
        assert w.app.state.cluster.check_invariants() == []
    finally:
        w.close()


@pytest.mark.slow
def test_a_relist_of_50000_pods_lets_the_verbs_in_between() -> None:
    """A re-list parses every pod it has not seen; done under the verbs' lock, it held
    every filter and bind for seconds. A filter asked while the re-list is booking must
    be answered before the re-list ends."""
    import threading

    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import ExtenderArgs

    state, placer = SchedulerState(), Placer()
    state.replace_nodes([node_obj(f"n{i}", 8) for i in range(50)])
    total = 50_000
    items = []
    for j in range(total):
        p = pod_obj(f"p{j}", gpu=1, memory=1000, cores=10)
        p["metadata"]["uid"] = f"uid-{j}"
        items.append(p)
    relist = threading.Thread(target=state.pods_handler.replace, args=(items,))
    relist.start()
    try:
        deadline = time.monotonic() + 120
        while not state.pods and time.monotonic() < deadline:  # booking has begun
            time.sleep(0.001)
        asked = pod_obj("newcomer", gpu=1, memory=2000, cores=20)
        asked["metadata"]["uid"] = "uid-newcomer"
        out = filter_pod(state, placer, ExtenderArgs(pod=asked, node_names=["n0", "n1"]))
        booked_when_answered = len(state.pods)
    finally:
        relist.join()
    assert out.node_names  # a real answer, not an error
    assert booked_when_answered < total, "the filter waited for the whole re-list"
    assert len(state.pods) == total


def test_a_paged_list_keeps_nothing_of_a_page_once_it_is_read() -> None:
    """Decoded, 200,000 pods as the API serves them are gigabytes; the state keeps only
    what it reads of them, so each page can go while the next is read: on a first list,
    and on a re-list where every pod is unchanged."""
    import weakref
    from collections.abc import Iterator

    from tessera.model.annotations import ASSIGNMENT, encode_assignment
    from tessera.model.clusterspec import make_cards
    from tessera.model.types import Assignment, CardSlice, ContainerAssignment
    from tessera.scheduler.state import SchedulerState

    class Listed(dict[str, Any]):  # a dict that a weak reference can follow
        pass

    cards = make_cards("n1", 2, "A100")
    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 2)])

    def pages(alive: list[int]) -> Iterator[list[Any]]:
        for p in range(3):
            page = []
            for i in (2 * p, 2 * p + 1):
                held = CardSlice(cards[i % 2].uuid, 1000, 10)
                a = Assignment("n1", (ContainerAssignment("main", (held,)),))
                pod = pod_obj(f"p{i}", gpu=1, memory=1000, cores=10,
                              annotations={ASSIGNMENT: encode_assignment(a)})  # fmt: skip
                pod["metadata"]["uid"] = f"u{i}"
                pod["spec"]["nodeName"] = "n1"
                page.append(Listed(pod))
            refs = [weakref.ref(o) for o in page]
            yield page
            page.clear()  # as the reflector empties a page once the next is asked for
            alive.append(sum(r() is not None for r in refs))

    for _ in range(2):  # a first list, then the same pods again
        alive: list[int] = []
        state.replace_pod_pages(pages(alive))
        assert alive == [0, 0, 0]
        assert sorted(state.pods) == [f"default/p{i}" for i in range(6)]
        assert len(state.cluster.bookings()) == 6 and state.cluster.check_invariants() == []


def test_a_relist_of_unchanged_pods_parses_none_of_them_again() -> None:
    """A re-list (after a watch expired) brings back mostly pods the state knows as they
    are: their request and assignment are taken from what it knows, not parsed again. A
    pod whose annotation changed is decoded; a pod reserved by a filter stays reserved."""
    from tessera.model.annotations import ASSIGNMENT, encode_assignment
    from tessera.model.clusterspec import make_cards
    from tessera.model.types import Assignment, CardSlice, ContainerAssignment
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import ExtenderArgs

    cards = make_cards("n1", 2, "A100")
    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 2)])

    def bound(i: int, card: int, memory: int = 1000) -> dict[str, Any]:
        a = Assignment(
            "n1", (ContainerAssignment("main", (CardSlice(cards[card].uuid, memory, 10),)),)
        )
        pod = pod_obj(f"p{i}", gpu=1, memory=memory, cores=10,
                      annotations={ASSIGNMENT: encode_assignment(a)})  # fmt: skip
        pod["metadata"]["uid"], pod["spec"]["nodeName"] = f"u{i}", "n1"
        return pod

    pending = pod_obj("waits", gpu=1, memory=2000, cores=10)
    pending["metadata"]["uid"] = "u-waits"
    listed = [bound(0, 0), bound(1, 1), pending]
    state.replace_pods(listed)
    assert filter_pod(state, Placer(), ExtenderArgs(pod=pending, node_names=["n1"])).node_names
    parsed: list[str] = []
    parse = state.parse
    state.parse = lambda pod: parsed.append(pod["metadata"]["name"]) or parse(pod)  # type: ignore[method-assign]
    booked_before = {k: b.assignment for k, b in state.cluster.bookings().items()}

    state.replace_pods([bound(0, 0), bound(1, 1), pending])
    assert parsed == []
    assert {k: b.assignment for k, b in state.cluster.bookings().items()} == booked_before
    assert "default/waits" in state.reservations  # the bind in flight keeps its cards
    assert state.pods["default/p0"].request is not None

    moved = bound(1, 0, memory=3000)  # written again elsewhere while the watch was down
    state.replace_pods([bound(0, 0), moved, pending])
    assert parsed == ["p1"]
    assert state.held("default/p1").containers[0].slices[0].uuid == cards[0].uuid  # type: ignore[union-attr]
    assert state.cluster.check_invariants() == []


def test_an_annotation_that_does_not_decode_is_reported_again_when_the_pod_is_weighed() -> None:
    """An unchanged pod takes what was decoded before, except an annotation that did not
    decode: that one is decoded again when the pod goes the full way (here: reserved by a
    filter), so its problem is counted and logged again."""
    from tessera.model.annotations import ASSIGNMENT
    from tessera.scheduler.filter import filter_pod
    from tessera.scheduler.placer import Placer
    from tessera.scheduler.state import SchedulerState
    from tessera.scheduler.wire import ExtenderArgs

    state = SchedulerState()
    state.replace_nodes([node_obj("n1", 1)])
    pod = pod_obj("odd", gpu=1, memory=1000, annotations={ASSIGNMENT: "not json"})
    pod["metadata"]["uid"] = "u-odd"
    state.apply_pod(pod)
    assert state.problems["bad-assignment"] == 1
    assert filter_pod(state, Placer(), ExtenderArgs(pod=pod, node_names=["n1"])).node_names
    state.apply_pod(pod)  # unchanged, but reserved: the full way
    assert state.problems["bad-assignment"] == 2
