"""GPU preemption through the app: a higher-priority pod that finds no cards has the least
important lower-priority pod evicted (Eviction API), then takes its card."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tessera.kube import PODS, FakeKube
from tessera.kube.errors import (
    MANY_BUDGETS,
    ApiError,
    NotFound,
    NotSent,
    Unavailable,
    error_from_status,
)
from tessera.kube.events import EventRecorder
from tessera.kube.kinds import EVENTS, POD_DISRUPTION_BUDGETS
from tessera.model.annotations import (
    PLACEMENT,
    PREEMPTING,
    QUOTA_RETRY,
    decode_preempting,
    encode_preempting,
)
from tessera.scheduler.app import SchedulerApp
from tessera.scheduler.budgets import Disruptee
from tessera.scheduler.config import SchedulerConfig
from tessera.scheduler.holds import Hold
from tessera.scheduler.preemptor import Preemptor, adopt_holds
from tessera.scheduler.state import PodInfo, SchedulerState
from tests.unit._scheduler_world import (
    World,
    add_quota,
    node_obj,
    pdb,
    prio_pod,
    running_pod,
    scraped,
)
from tests.unit._scheduler_world import gpu_quota as quota_of
from tests.unit._wait import eventually


def place_on(w: World, pod: dict[str, Any], node: str) -> None:
    """Filter ``pod`` on ``node`` alone and bind it there, as kube-scheduler would."""
    assert w.filter(w.create(pod), [node])["NodeNames"] == [node]
    meta = pod["metadata"]
    assert w.bind(w.kube.get(PODS, meta["name"], meta["namespace"]), node)["Error"] == ""


@pytest.fixture
def world() -> Any:
    w = World([node_obj("a1", 2, "A100")])
    for i in range(2):
        assert w.schedule(w.create(prio_pod(f"low-{i}", 10))) == "a1"
    confirmed(w)
    yield w
    w.close()


def confirmed(w: World) -> None:
    """Wait until the watch has shown every bind: a pod being bound is never a victim."""
    eventually(lambda: len(w.app.state.reservations) == 0)


def evictions(w: World) -> list[str]:
    return [what for op, what in w.kube.calls if op == "evict"]


def events(w: World, reason: str, ns: str = "default", about: str | None = None) -> list[str]:
    """The messages of ``ns``'s events of ``reason`` (about pod ``about``, if given)."""
    return [str(e.get("message")) for e in w.kube.list(EVENTS, ns).items
            if e.get("reason") == reason
            and about in (None, e["involvedObject"]["name"])]  # fmt: skip


def blocked(w: World, reason: str) -> float:
    """tessera_scheduler_preemption_blocked_total{reason}, as scraped."""
    return scraped(w, "tessera_scheduler_preemption_blocked_total", reason=reason)


def budget_refusal() -> ApiError:
    """The Eviction API's answer when a PodDisruptionBudget keeps the pod."""
    return ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                    "disruption budget.")  # fmt: skip


class Died(BaseException):
    """The extender's process ending where it stands (no handler runs)."""


def stepped_by_hand(app: SchedulerApp) -> Preemptor:
    """The app's preemptor with its thread stopped: only the test's ``step`` acts."""
    app.preemptor.stop()
    for t in threading.enumerate():
        if t.name == "tessera-preempt":
            t.join(5)
    return app.preemptor


def next_leader(w: World) -> SchedulerApp:
    """Stop the world's extender and start another on the same API server; the world's
    verbs then reach it."""
    w.app.stop()
    new = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), w.kube)
    new.start()
    assert new.wait_synced(5)
    w.app = new
    return new


def test_the_least_important_pod_is_evicted_and_the_urgent_pod_takes_its_card(
    world: World,
) -> None:
    w = world
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent)["NodeNames"] == []  # no card now: preemption is handed over
    eventually(lambda: evictions(w) == ["default/low-1"])  # equal priority: the later key
    eventually(lambda: "default/low-1" not in w.app.state.pods)
    # Its victim gone, the pod is nudged so kube-scheduler tries it again at once.
    eventually(lambda: QUOTA_RETRY in (w.kube.get(PODS, "urgent", "default")["metadata"]
                                       .get("annotations") or {}))  # fmt: skip
    assert w.schedule(urgent) == "a1"
    eventually(lambda: events(w, "TesseraPreempting"))
    assert events(w, "TesseraPreempting") == [
        "evicting on a1 for cards: default/low-1 (priority 10)"
    ]
    eventually(lambda: events(w, "TesseraPreempted"))
    assert "evicted for default/urgent (priority 1000)" in events(w, "TesseraPreempted")[0]
    assert w.app.metrics.preemptions._value.get() == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "urgent",
    [
        prio_pod("peer", 10),  # equal priority: no victim
        {
            **prio_pod("polite", 1000),
            "spec": {**prio_pod("polite", 1000)["spec"], "preemptionPolicy": "Never"},
        },
    ],
)
def test_no_eviction_for_an_equal_priority_or_a_never_preempting_pod(
    world: World, urgent: dict[str, Any]
) -> None:
    w = world
    assert w.filter(w.create(urgent))["NodeNames"] == []
    w.app.preemptor.step()
    assert evictions(w) == []


def test_a_budget_that_refuses_stops_the_preemption_and_says_so(world: World) -> None:
    w = world
    w.kube.fail_next("evict", budget_refusal())
    w.app.preemptor.retry_s = 1.0
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent)["NodeNames"] == []
    eventually(lambda: events(w, "TesseraPreemptionBlocked"))
    assert (
        "evicting default/low-1 on a1 was refused: a PodDisruptionBudget"
        in events(w, "TesseraPreemptionBlocked")[0]
    )
    assert len(w.app.state.pods) == 3  # nobody went
    assert blocked(w, "refused") >= 1 and blocked(w, "budget") == 0
    # kube-scheduler would not try the pod again for a budget's change: the preemptor
    # tries again by itself while the pod waits (the budget allows it now).
    eventually(lambda: evictions(w) == ["default/low-1"], timeout=5)


def test_a_standby_evicts_nothing(world: World) -> None:
    w = world
    w.app.preemptor.leading = lambda: False
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent)["NodeNames"] == []
    assert w.app.preemptor.step() == []
    assert evictions(w) == []


def gpu_quota(ns: str, cards: int) -> dict[str, Any]:
    return quota_of(ns, {"name": "a100", "models": ["A100"], "cards": cards})


A100_QUOTA = {"name": "a100", "models": ["A100"], "cards": 2}


def quota_world(nodes: list[dict[str, Any]], placed: dict[str, str],
                *limits: dict[str, Any]) -> World:  # fmt: skip
    """Pods of priority 10 placed by name -> node, then the namespace's quota."""
    w = World(nodes)
    for name, node in placed.items():
        place_on(w, prio_pod(name, 10), node)
    confirmed(w)
    add_quota(w, quota_of("default", *limits))
    return w


def test_no_eviction_for_cards_the_quota_would_not_give_the_pod(world: World) -> None:
    """team's quota allows it one A100 and team holds none: the cards default's pods
    hold are what it lacks, but its quota would let it take only one of the two it asks."""
    w = world
    add_quota(w, gpu_quota("team", 1))
    out = w.filter(w.create(prio_pod("urgent", 1000, gpu=2, ns="team")))
    assert "quota: team/gpus a100" in out["FailedNodes"]["a1"]
    w.app.preemptor.step()
    assert evictions(w) == []
    assert len(w.kube.list(PODS, "default").items) == 2


def test_a_pod_its_quota_keeps_out_has_less_important_pods_of_its_namespace_evicted(
    world: World,
) -> None:
    """default may hold two A100s and its two priority-10 pods hold them: its urgent pod
    has the least important evicted for quota room (and a card), and takes its place."""
    w = world
    add_quota(w, gpu_quota("default", 2))
    urgent = w.create(prio_pod("urgent", 1000))
    out = w.filter(urgent)
    assert "quota: default/gpus a100" in out["FailedNodes"]["a1"]
    eventually(lambda: evictions(w) == ["default/low-1"])
    eventually(lambda: events(w, "TesseraPreempting"))
    assert events(w, "TesseraPreempting") == [
        "evicting for quota room: default/low-1 (priority 10)"
    ]
    eventually(lambda: "default/low-1" not in w.app.state.pods)
    assert w.schedule(urgent) == "a1"


def test_a_pod_evicting_for_quota_room_goes_where_cards_are_free_as_things_are() -> None:
    """Its quota, not the cards, keeps it out: the quota victim goes, and the pod is to
    go on a2's free cards rather than wait for the victim's card on a1."""
    w = quota_world([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")],
                    {"low-0": "a1", "low-1": "a1"}, A100_QUOTA)  # fmt: skip
    try:
        p = stepped_by_hand(w.app)
        out = w.filter(w.create(prio_pod("urgent", 1000)))
        assert out["NodeNames"] == [] and "quota: default/gpus a100" in out["FailedNodes"]["a2"]
        p.step()
        assert evictions(w) == ["default/low-1"]
        hold = w.app.state.holds.get("default/urgent")
        assert hold is not None and hold.node == "a2"
        assert hold.decision is not None and hold.decision.node == "a2"
    finally:
        w.close()


def test_the_least_important_node_wins_among_the_first_max_nodes() -> None:
    w = World([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")])
    try:
        placed = [w.schedule(w.create(prio_pod(f"p{i}", 10 if i < 2 else 5))) for i in range(4)]
        assert placed == ["a1", "a1", "a2", "a2"]
        confirmed(w)
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        eventually(lambda: evictions(w) == ["default/p3"])  # a2's victims matter least
        w.app.preemptor.planner.max_nodes = 1  # only the first offered node is weighed
        eventually(lambda: "default/p3" not in w.app.state.pods)
        assert w.schedule(w.kube.get(PODS, "urgent", "default")) == "a2"
        confirmed(w)
        assert w.filter(w.create(prio_pod("urgent-2", 1000)))["NodeNames"] == []
        eventually(lambda: evictions(w) == ["default/p3", "default/p1"])
    finally:
        w.close()


def test_a_victim_in_a_long_grace_period_keeps_the_preemption_waiting() -> None:
    state, kube, now = SchedulerState(), FakeKube(), [100.0]
    p = Preemptor(state, kube, EventRecorder(kube, "t", "t"), lambda: True, hold_s=60,
                  clock=lambda: now[0])  # fmt: skip
    state.pods["default/low"] = PodInfo("default/low", "u-low", "a1", None, None)
    victims = frozenset({"default/low"})
    state.holds.put(Hold("default/urgent", "u-urgent", 1000, "a1", victims, until=160.0))
    assert p._waiting("default/urgent", "u-urgent")  # evicted just now
    now[0] = 200.0
    state.pods["default/low"].terminating = True
    assert p._waiting("default/urgent", "u-urgent")  # past hold_s, but still terminating
    state.pods["default/low"].terminating = False
    assert not p._waiting("default/urgent", "u-urgent")  # never went: weigh again
    assert state.holds.get("default/urgent") is None


def held_for_urgent(w: World) -> dict[str, Any]:
    """Have ``urgent`` evict low-1 on a1 and wait until its victim is gone; the pod."""
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent)["NodeNames"] == []
    eventually(lambda: "default/low-1" not in w.app.state.pods)
    eventually(lambda: (h := w.app.state.holds.get("default/urgent")) and h.freed_at)
    return urgent


def test_the_freed_card_is_held_for_the_preemptor_against_pods_as_or_less_important(
    world: World,
) -> None:
    w = world
    urgent = held_for_urgent(w)
    # kube-scheduler may try other pods first (the urgent pod sits out its backoff): one
    # of the victims' priority, and one as important as the preemptor, find a1 held. (The
    # latter never preempts: once the hold is over it could evict low-0, rightly, and
    # this test counts evictions.)
    for name, prio in (("late", 10), ("peer", 1000)):
        pod = prio_pod(name, prio)
        pod["spec"]["preemptionPolicy"] = "Never"
        out = w.filter(w.create(pod))
        assert out["NodeNames"] == []
        assert out["FailedNodes"]["a1"].startswith("held for default/urgent (priority 1000)")
    assert b"tessera_scheduler_preemption_holds 1.0" in w.app.metrics.exposition()
    # A more important pod is not held off; the urgent pod still gets the card after it
    # gives it back (here: its filter's reservation is dropped).
    vip = w.create(prio_pod("vip", 2000))
    assert w.filter(vip)["NodeNames"] == ["a1"]
    w.app.state.release("default/vip")
    assert w.schedule(urgent) == "a1"
    confirmed(w)
    eventually(lambda: w.app.state.holds.get("default/urgent") is None)  # placed: over
    assert b"tessera_scheduler_preemption_holds 0.0" in w.app.metrics.exposition()
    assert evictions(w) == ["default/low-1"]  # no churn: nobody evicted a second time


def test_a_less_important_preemptor_weighs_no_victims_on_a_held_node(world: World) -> None:
    w = world
    held_for_urgent(w)
    assert w.filter(w.create(prio_pod("mid", 500)))["NodeNames"] == []
    w.app.preemptor.step()
    assert evictions(w) == ["default/low-1"]  # low-0 stays: a1 is the urgent pod's


@pytest.mark.parametrize("ending", ["deleted", "never-came-back"])
def test_a_hold_ends_when_its_pod_is_deleted_or_does_not_come_back(
    world: World, ending: str
) -> None:
    w = world
    w.app.preemptor.keep_s = 0.3
    held_for_urgent(w)
    if ending == "deleted":
        w.kube.delete(PODS, "urgent", "default")
    eventually(lambda: w.app.state.holds.get("default/urgent") is None)
    assert w.schedule(w.create(prio_pod("late", 10))) == "a1"


def test_a_new_leader_keeps_holding_the_node_while_the_victims_terminate(world: World) -> None:
    """A takeover (or a restart) while the victims sit out their grace period: the new
    leader reads the preemption from the pod and neither evicts a second pod for it nor
    lets a less important pod take the freed card."""
    w = world
    w.kube.graceful_evictions = True
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent)["NodeNames"] == []
    eventually(lambda: evictions(w) == ["default/low-1"])
    eventually(lambda: w.app.state.pods["default/low-1"].terminating)
    record = decode_preempting("default/urgent", w.kube.get(PODS, "urgent", "default")
                               ["metadata"]["annotations"][PREEMPTING])  # fmt: skip
    assert (record.node, record.victims) == ("a1", frozenset({"default/low-1"}))
    low_1_card = w.app.state.pods["default/low-1"].assignment
    assert record.placement is not None and low_1_card is not None
    assert record.placement.footprint().keys() == low_1_card.footprint().keys()
    new = next_leader(w)
    try:
        urgent = w.kube.get(PODS, "urgent", "default")
        assert w.filter(urgent)["NodeNames"] == []  # low-1 still terminating
        new.preemptor.step()
        assert evictions(w) == ["default/low-1"]  # not low-0 as well
        hold = new.state.holds.get("default/urgent")
        assert hold is not None  # what it holds is the pod's placement, as recorded
        assert hold.decision == record.placement and hold.request is not None
        w.kube.delete(PODS, "low-1", "default")  # its grace period is over
        eventually(lambda: "default/low-1" not in new.state.pods)
        late = prio_pod("late", 10)
        late["spec"]["preemptionPolicy"] = "Never"
        out = w.filter(w.create(late))
        assert out["FailedNodes"]["a1"].startswith("held for default/urgent (priority 1000)")
        assert w.schedule(urgent) == "a1"
    finally:
        new.stop()


def test_a_leader_that_dies_once_it_evicted_leaves_the_next_its_record(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is written before the eviction: an extender that dies right after the
    Eviction call leaves the next leader what to hold, and no second pod goes."""
    w = world
    w.kube.graceful_evictions = True
    p = stepped_by_hand(w.app)
    evict = w.kube.evict

    def evict_then_die(ns: str, name: str, uid: str) -> None:
        evict(ns, name, uid)
        raise Died

    monkeypatch.setattr(w.kube, "evict", evict_then_die)
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    with pytest.raises(Died):
        p.step()
    monkeypatch.setattr(w.kube, "evict", evict)
    eventually(lambda: w.app.state.pods["default/low-1"].terminating)
    new = next_leader(w)
    try:
        p = stepped_by_hand(new)
        assert w.filter(w.kube.get(PODS, "urgent", "default"))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/low-1"]  # not low-0 as well
        hold = new.state.holds.get("default/urgent")
        assert hold is not None and hold.victims == {"default/low-1"}
    finally:
        new.stop()


def test_an_eviction_with_no_answer_is_held_as_made_and_no_second_pod_goes(
    world: World,
) -> None:
    """A timed-out eviction may have been made: its victim is held as if it were (and
    stays in the record), not passed over for another pod that would then go too."""
    w = world
    w.kube.graceful_evictions = True
    p = stepped_by_hand(w.app)
    p.retry_s = 0.0
    w.kube.lose_answer_of_next("evict", Unavailable(0, "Timeout", "no answer in 30s"))
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    p.step()
    eventually(lambda: w.app.state.pods["default/low-1"].terminating)
    assert w.filter(w.kube.get(PODS, "urgent", "default"))["NodeNames"] == []
    p.step()
    p.step()  # and its retry, due at once
    assert evictions(w) == ["default/low-1"]
    hold = w.app.state.holds.get("default/urgent")
    assert hold is not None and hold.victims == {"default/low-1"}
    annotations = w.kube.get(PODS, "urgent", "default")["metadata"]["annotations"]
    assert decode_preempting("default/urgent", annotations[PREEMPTING]).victims == hold.victims
    assert events(w, "TesseraPreempting") == []  # not known to have been made: not said
    assert blocked(w, "unanswered") == 1 and blocked(w, "refused") == 0


def test_no_pod_is_evicted_before_its_preemption_is_recorded(world: World) -> None:
    w = world
    p = stepped_by_hand(w.app)
    p.retry_s = 0.0
    w.kube.fail_next("merge_patch", ApiError(500, "InternalError", "etcdserver: leader changed"))
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    eventually(lambda: "default/urgent" in w.app.state.pods)  # a retry is for a pod seen
    p.step()
    assert evictions(w) == []  # the record did not take: nothing goes
    assert blocked(w, "unanswered") == 1
    p.step()  # tried again
    assert evictions(w) == ["default/low-1"]
    record = w.kube.get(PODS, "urgent", "default")["metadata"]["annotations"][PREEMPTING]
    assert decode_preempting("default/urgent", record).victims == {"default/low-1"}


def test_the_record_keeps_only_the_victims_that_went(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal midway: the record is written again with the pods that went, and taken
    off when none did, so a new leader holds nothing for evictions never made."""
    w = world
    w.kube.graceful_evictions = True  # the one that goes keeps its card meanwhile
    p = stepped_by_hand(w.app)
    p.retry_s = 30.0
    real = w.kube.evict
    calls = []

    def second_refused(ns: str, name: str, uid: str) -> None:
        calls.append(name)
        if len(calls) == 2:
            raise budget_refusal()
        real(ns, name, uid)

    monkeypatch.setattr(w.kube, "evict", second_refused)
    both = w.create(prio_pod("both", 1000, gpu=2))
    assert w.filter(both)["NodeNames"] == []
    p.step()
    assert len(calls) == 2
    record = w.kube.get(PODS, "both", "default")["metadata"]["annotations"][PREEMPTING]
    assert decode_preempting("default/both", record).victims == {f"default/{calls[0]}"}
    hold = w.app.state.holds.get("default/both")
    assert hold is not None and hold.victims == {f"default/{calls[0]}"}
    went = f"evicting on a1 for cards: default/{calls[0]} (priority 10)"
    eventually(lambda: events(w, "TesseraPreempting") == [went])  # the one that went

    w.kube.fail_next("evict", budget_refusal())  # the first refused: nothing went
    alone = w.create(prio_pod("alone", 2000, gpu=1))
    assert w.filter(alone)["NodeNames"] == []
    p.step()
    meta = w.kube.get(PODS, "alone", "default")["metadata"]
    assert PREEMPTING not in (meta.get("annotations") or {})
    assert w.app.state.holds.get("default/alone") is None


def test_an_eviction_with_no_answer_that_was_not_made_is_weighed_again_after_hold_s(
    world: World,
) -> None:
    w = world
    p = stepped_by_hand(w.app)
    now = [1000.0]
    p.clock = lambda: now[0]
    w.kube.fail_next("evict", Unavailable(0, "Timeout", "no answer in 30s"))
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    p.step()
    assert evictions(w) == ["default/low-1"] and "default/low-1" in w.app.state.pods
    now[0] += p.retry_s  # its retry is due, but low-1 may still be on its way out
    p.step()
    assert evictions(w) == ["default/low-1"]
    now[0] += p.hold_s  # never seen going: the eviction did not take, the hold ends
    p.step()
    assert w.app.state.holds.get("default/urgent") is None
    assert w.filter(w.kube.get(PODS, "urgent", "default"))["NodeNames"] == []
    p.step()  # kube-scheduler's next try: weighed again
    assert evictions(w) == ["default/low-1", "default/low-1"]  # not passed over: no refusal
    eventually(lambda: "default/low-1" not in w.app.state.pods)


def test_a_pod_replaced_since_its_filter_has_nothing_evicted_for_it(world: World) -> None:
    """The record's UID precondition: a pod deleted and created again under its name is
    another pod, which asked for nothing yet."""
    w = world
    p = stepped_by_hand(w.app)
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    w.kube.delete(PODS, "urgent", "default")
    again = w.create(prio_pod("urgent", 1000))
    p.step()
    assert evictions(w) == []
    assert PREEMPTING not in (w.kube.get(PODS, "urgent", "default")["metadata"]
                              .get("annotations") or {})  # fmt: skip
    assert again["metadata"]["uid"] == w.kube.get(PODS, "urgent", "default")["metadata"]["uid"]
    # The API server refuses the record as a change of the immutable metadata.uid (422,
    # not a 409): that too is "another pod", not an answer to wait for and retry.
    assert blocked(w, "unanswered") == 0


def test_a_pod_placed_since_its_filter_has_nothing_evicted_for_it(world: World) -> None:
    w = world
    p = stepped_by_hand(w.app)
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent)["NodeNames"] == []
    w.kube.delete(PODS, "low-1", "default")  # it ended by itself
    eventually(lambda: "default/low-1" not in w.app.state.pods)
    assert w.filter(urgent)["NodeNames"] == ["a1"]  # being bound: its reservation
    p.step()
    assert evictions(w) == []
    assert w.bind(w.kube.get(PODS, "urgent", "default"), "a1")["Error"] == ""
    confirmed(w)
    p.consider(urgent, w.app.state.pods["default/urgent"].request, ["a1"])  # a late call
    p.step()
    assert evictions(w) == []


def test_a_retry_of_a_pod_whose_bind_may_have_landed_is_placed_not_unschedulable(
    world: World,
) -> None:
    """kube-scheduler tries a pod again when its bind had no answer: the pod holds its
    cards, so it is counted as placed, told nothing, and nobody is weighed for it."""
    w = world
    p = stepped_by_hand(w.app)
    w.kube.delete(PODS, "low-1", "default")
    eventually(lambda: "default/low-1" not in w.app.state.pods)
    urgent = w.create(prio_pod("urgent", 1000))
    with w.kube.hold_watches():  # the extender has not seen the landing
        assert w.filter(urgent)["NodeNames"] == ["a1"]
        w.kube.lose_answer_of_next("bind", Unavailable(0, "Unavailable", "read timed out"))
        assert "may have landed" in w.bind(urgent, "a1")["Error"]
        retry = w.filter(urgent)
        assert retry["NodeNames"] == [] and "may have landed" in retry["FailedNodes"]["a1"]
        assert p._queue == {}  # nothing handed to the preemptor
        p.step()
    assert evictions(w) == []
    w.app.events.flush()
    assert events(w, "TesseraUnschedulable", about="urgent") == []
    failed = "tessera_scheduler_failures_total"
    assert scraped(w, failed, verb="filter", reason="already-placed") == 1
    assert scraped(w, failed, verb="filter", reason="unschedulable") == 0


def test_the_evictions_events_say_who_went_for_whom(world: World) -> None:
    """A victim gone already counts as gone and the next one is still evicted; each
    victim's TesseraPreempted names it; the pod's TesseraPreempting is Normal."""
    w = world
    p = stepped_by_hand(w.app)
    low_1_uid = w.app.state.pods["default/low-1"].uid
    w.kube.fail_next("evict", NotFound(404, "NotFound", 'pods "low-0" not found'))
    assert w.filter(w.create(prio_pod("both", 1000, gpu=2)))["NodeNames"] == []
    p.step()
    assert evictions(w) == ["default/low-0", "default/low-1"]
    hold = w.app.state.holds.get("default/both")
    assert hold is not None and hold.victims == {"default/low-0", "default/low-1"}
    eventually(lambda: events(w, "TesseraPreempting") and events(w, "TesseraPreempted"))
    listed = w.kube.list(EVENTS, "default").items
    [preempting] = [e for e in listed if e.get("reason") == "TesseraPreempting"]
    assert preempting["type"] == "Normal"
    assert preempting["involvedObject"]["name"] == "both"
    preempted = [e["involvedObject"] for e in listed if e.get("reason") == "TesseraPreempted"]
    assert [(o["namespace"], o["name"], o["uid"]) for o in preempted] == [
        ("default", "low-1", low_1_uid)
    ]  # low-0 was gone already: nothing told it


def test_a_refusal_other_than_a_budgets_says_what_the_api_server_said(world: World) -> None:
    w = world
    p = stepped_by_hand(w.app)
    w.kube.fail_next("evict", ApiError(403, "Forbidden", "pods/eviction is forbidden"))
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    p.step()
    said = "evicting default/low-1 on a1 was refused: 403 Forbidden: pods/eviction is forbidden"
    eventually(lambda: events(w, "TesseraPreemptionBlocked") == [said])


def test_a_victim_two_budgets_cover_is_refused_not_unanswered(world: World) -> None:
    """A second budget made after the preemptor read them: the Eviction API's refusal is
    a 500, but a definite one -- counted and said as a refusal, the victim not held as
    if it might have gone."""
    w = world
    p = stepped_by_hand(w.app)
    w.kube.fail_next("evict", error_from_status(500, {"code": 500, "message": MANY_BUDGETS}))
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    p.step()
    said = ("evicting default/low-1 on a1 was refused: more than one PodDisruptionBudget "
            "covers it")  # fmt: skip
    eventually(lambda: events(w, "TesseraPreemptionBlocked") == [said])
    assert blocked(w, "refused") == 1 and blocked(w, "unanswered") == 0
    assert "default/low-1" in w.app.state.pods


def test_a_replica_that_stops_leading_midway_evicts_no_more(world: World) -> None:
    """Each eviction is fenced, as a bind's write is: the lease lapsing after the first
    of two leaves the second to the new leader, and the record names the first only."""
    w = world
    p = stepped_by_hand(w.app)
    p.leading = lambda: len(evictions(w)) < 1
    assert w.filter(w.create(prio_pod("both", 1000, gpu=2)))["NodeNames"] == []
    p.step()
    [first] = evictions(w)
    record = w.kube.get(PODS, "both", "default")["metadata"]["annotations"][PREEMPTING]
    assert decode_preempting("default/both", record).victims == {first}


def test_a_new_leader_holds_and_nudges_a_preemption_whose_victims_are_gone() -> None:
    """The victims went in the moment before the takeover: the new leader holds their
    cards for keep_s, as the leader before would have, so no less important pod takes
    them first, and nudges the pod, which the leader before may not have done."""
    state, kube, now = SchedulerState(), FakeKube(), [100.0]
    kube.create(PODS, prio_pod("urgent", 1000), "default")
    p = Preemptor(state, kube, EventRecorder(kube, "t", "t"), lambda: True,
                  clock=lambda: now[0])  # fmt: skip
    done = encode_preempting("a1", ["default/low"])  # low is not among the pods any more
    state.pods["default/urgent"] = PodInfo("default/urgent", "u", "", None, None,
                                           priority=1000, preempting=done)  # fmt: skip
    state.pods["default/bad"] = PodInfo("default/bad", "u2", "", None, None,
                                        preempting='{"v":1,"node":"a1"}')  # fmt: skip
    p.step()
    hold = state.holds.get("default/urgent")
    assert hold is not None and hold.freed_at == 100.0 and hold.node == "a1"
    assert state.holds.against("default/late", 10).keys() == {"a1"}
    annotations = kube.get(PODS, "urgent", "default")["metadata"]["annotations"]
    assert QUOTA_RETRY in annotations
    now[0] += p.keep_s  # kept as long as any freed hold, then let go
    p.step()
    assert len(state.holds) == 0
    state.pods["default/low"] = PodInfo("default/low", "u3", "a1", None, None)
    p._adopted = False  # as at the next takeover, with the victim still there
    p.step()
    hold = state.holds.get("default/urgent")
    assert hold is not None and hold.freed_at is None
    assert state.holds.get("default/bad") is None  # malformed: warned about, skipped


def test_why_holds_only_the_preemptions_whose_victims_still_go() -> None:
    """kubectl tessera why has no clock to end a freed hold by: it leaves those out."""
    state = SchedulerState()
    for key, victims in (("default/going", ["default/low"]), ("default/done", ["default/x"])):
        state.pods[key] = PodInfo(key, f"u-{key}", "", None, None, priority=1000,
                                  preempting=encode_preempting("a1", victims))  # fmt: skip
    state.pods["default/low"] = PodInfo("default/low", "u3", "a1", None, None)
    assert adopt_holds(state, until=float("inf")) == ["default/done"]
    assert [h.key for h in state.holds] == ["default/going"]


def test_a_takeover_holds_only_pending_pods_not_held_yet_and_reads_past_a_bad_record() -> None:
    state = SchedulerState()
    going = encode_preempting("a1", ["default/low"])
    state.pods["default/bad"] = PodInfo("default/bad", "u0", "", None, None,
                                        preempting='{"v":1}')  # fmt: skip
    state.pods["default/bound"] = PodInfo("default/bound", "u1", "a2", None, None,
                                          priority=1000, preempting=going)  # fmt: skip
    state.pods["default/held"] = PodInfo("default/held", "u2", "", None, None, priority=1000,
                                         preempting=going)  # fmt: skip
    state.pods["default/new"] = PodInfo("default/new", "u3", "", None, None, priority=500,
                                        preempting=going)  # fmt: skip
    state.pods["default/low"] = PodInfo("default/low", "u4", "a1", None, None)
    earlier = Hold("default/held", "u2", 1000, "a1", frozenset({"default/low"}), until=5.0)
    state.holds.put(earlier)
    assert adopt_holds(state, until=100.0) == []
    assert {h.key for h in state.holds} == {"default/held", "default/new"}
    assert state.holds.get("default/held") is earlier  # its own hold, not taken again
    new = state.holds.get("default/new")
    assert new is not None
    assert (new.uid, new.priority, new.node, new.victims, new.until, new.freed_at) == (
        "u3", 500, "a1", frozenset({"default/low"}), 100.0, None)  # fmt: skip


def test_the_preemptor_acts_only_once_the_pods_are_listed() -> None:
    # A takeover reads the holds from the pods: a partial list would lose some for good.
    kube = FakeKube()
    app = SchedulerApp(SchedulerConfig(leader_elect=False, watch_timeout_s=1), kube)
    assert app.leading() and not app.preemptor.leading()
    app.start()
    try:
        assert app.wait_synced(5)
        assert app.preemptor.leading()
    finally:
        app.stop()


def _p3_least_important() -> World:
    """Two full nodes -- a1: p0, p1; a2: p2 (all priority 10), p3 (priority 5) -- and
    preemption retried every 0.2 s."""
    w = World([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")])
    for i in range(4):
        assert w.schedule(w.create(prio_pod(f"p{i}", 10 if i < 3 else 5)))
    confirmed(w)
    w.app.preemptor.retry_s = 0.2
    return w


def test_a_pod_whose_eviction_is_refused_is_passed_over_for_another() -> None:
    """A budget guards p3, the least important victim: the next try evicts p1 on the
    other node instead of asking for p3 again and again."""
    w = _p3_least_important()
    try:
        budget = budget_refusal()
        w.kube.fail_next("evict", budget)
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        eventually(lambda: evictions(w) == ["default/p3", "default/p1"], timeout=5)
        assert "default/p3" in w.app.state.pods  # still there: its budget said no
        eventually(lambda: "default/p1" not in w.app.state.pods)
    finally:
        w.close()


def test_an_eviction_never_sent_neither_refuses_nor_holds_its_victim() -> None:
    """No connection to the API server: nothing was asked, so p3 is not passed over as
    if its budget had refused (nor held as if it might have gone); the next try asks for
    p3 again and it goes. Nothing tells the pod it was refused."""
    w = _p3_least_important()
    try:
        w.kube.fail_next("evict", NotSent(0, "Unavailable", "POST ...: connection refused"))
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        eventually(lambda: evictions(w) == ["default/p3", "default/p3"], timeout=5)
        eventually(lambda: "default/p3" not in w.app.state.pods)
        assert blocked(w, "unanswered") == 1 and blocked(w, "refused") == 0
        assert events(w, "TesseraPreemptionBlocked") == []
    finally:
        w.close()


def test_a_refused_pod_is_tried_again_when_nothing_else_would_make_room(world: World) -> None:
    w = world  # one node, low-0 and low-1: a budget refuses both in turn
    w.app.preemptor.retry_s = 0.2
    budget = budget_refusal()
    for _ in range(3):
        w.kube.fail_next("evict", budget)
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    # low-1 (the later key), then low-0 passed over to, then low-1 again, then it goes.
    eventually(lambda: len(evictions(w)) == 4, timeout=5)
    assert evictions(w) == ["default/low-1", "default/low-0", "default/low-1", "default/low-1"]
    eventually(lambda: "default/low-1" not in w.app.state.pods)


def test_a_refused_preemption_waits_its_retry_and_is_dropped_once_its_pod_is_gone(
    world: World,
) -> None:
    w = world
    w.app.preemptor.retry_s = 30.0
    budget = budget_refusal()
    w.kube.fail_next("evict", budget)
    assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
    eventually(lambda: evictions(w) == ["default/low-1"])
    # The thread tried; from here only the test steps (two steps at once could each
    # find the retry due, a thing the one thread never does).
    p = stepped_by_hand(w.app)
    p.step()
    assert evictions(w) == ["default/low-1"]  # not before its retry is due
    w.kube.delete(PODS, "urgent", "default")
    eventually(lambda: "default/urgent" not in w.app.state.pods)
    later = p.clock() + 60
    p.clock = lambda: later
    p.step()
    assert evictions(w) == ["default/low-1"]  # due, but nobody waits for it any more
    # Not seen, it may be a pod the watch has not shown yet: put off for unseen_s, then
    # let go (nothing is kept for a pod deleted).
    assert "default/urgent" in p._later
    for at in (later + p.retry_s, later + p.unseen_s):
        p.clock = lambda at=at: at  # type: ignore[misc]
        p.step()
    assert evictions(w) == ["default/low-1"]
    assert p._later == {} and p._unseen_since == {}


def test_a_retry_for_a_pod_the_watch_has_not_shown_yet_waits_for_it(world: World) -> None:
    w = world
    p = stepped_by_hand(w.app)
    p.retry_s = 0.0
    with w.kube.hold_watches():  # kube-scheduler's watch is ahead of the extender's
        w.kube.fail_next("merge_patch", ApiError(500, "InternalError", "etcdserver: timeout"))
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        p.step()  # the record did not take: tried again
        p.step()  # due, and the pod not seen yet: put off, nothing evicted for it
        assert evictions(w) == []
    eventually(lambda: "default/urgent" in w.app.state.pods)
    p.step()
    assert evictions(w) == ["default/low-1"]


def test_a_leader_that_stands_by_drops_its_holds_and_takes_them_back_when_it_leads(
    world: World,
) -> None:
    # Holds live in the leader's memory; a standby's would be stale when it leads again,
    # so it drops them and takes them over from tessera.io/preempting, as a new leader.
    w = world
    held_for_urgent(w)
    p = stepped_by_hand(w.app)
    leads = True
    p.leading = lambda: leads
    leads = False
    p.step()
    assert w.app.state.holds.get("default/urgent") is None
    leads = True
    p.step()
    assert w.app.state.holds.get("default/urgent") is not None


def budgeted_world(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                   budgets: list[dict[str, Any]]) -> World:  # fmt: skip
    w = World(nodes)
    for p in pods:
        assert w.schedule(w.create(p))
    confirmed(w)
    for b in budgets:
        w.kube.seed(POD_DISRUPTION_BUDGETS, b, "default")
    selected = [Disruptee("default", b["spec"]["selector"]["matchLabels"], True, False)
                for b in budgets]  # fmt: skip
    eventually(lambda: all(w.app.budgets.covering(d) for d in selected))
    return w


def test_a_pod_its_budget_protects_is_left_and_another_goes_without_a_refusal() -> None:
    w = budgeted_world([node_obj("a1", 2, "A100")],
                       [running_pod("low-0", 10, "free"), running_pod("low-1", 10, "kept")],
                       [pdb("keep", "kept", 0)])  # fmt: skip
    try:
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        # low-1 (the later key) would go first; its budget allows no disruption, read
        # ahead: low-0 goes, and low-1 is never asked for.
        eventually(lambda: "default/low-0" not in w.app.state.pods)
        assert evictions(w) == ["default/low-0"]
        assert events(w, "TesseraPreemptionBlocked") == []
    finally:
        w.close()


def test_when_only_budgets_stand_in_the_way_the_pod_is_told_and_tried_again() -> None:
    """Tried again the moment the budget loosens (its watch event), not on a timer: the
    timer (budget_retry_s, a minute) is only for what no event says."""
    w = budgeted_world([node_obj("a1", 2, "A100")],
                       [running_pod("low-0", 10, "kept"), running_pod("low-1", 10, "kept")],
                       [pdb("keep", "kept", 0), pdb("other", "elsewhere", 0)])  # fmt: skip
    try:
        assert w.app.preemptor.budget_retry_s == 60.0
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        eventually(lambda: events(w, "TesseraPreemptionBlocked"))
        assert events(w, "TesseraPreemptionBlocked")[0] == (
            "evicting on a1 would make room, but the Eviction API would refuse default/low-1: "
            "PodDisruptionBudget keep needs 2 healthy pods and has 2"
        )
        assert evictions(w) == []  # nothing asked of the API while the budget says no
        assert blocked(w, "budget") == 1 and blocked(w, "refused") == 0
        # Another budget loosening does not wake it: it is not in the way.
        counted = {"status": {"disruptionsAllowed": 1, "currentHealthy": 3}}
        w.kube.merge_patch(POD_DISRUPTION_BUDGETS, "other", counted, "default",
                           subresource="status")  # fmt: skip
        eventually(lambda: w.app.budgets.covering(Disruptee("default", {"app": "elsewhere"},
                   True, False))[0].allowed == 1)  # fmt: skip
        time.sleep(0.5)
        w.app.preemptor.step()  # nor does a step before budget_retry_s
        assert blocked(w, "budget") == 1
        # The budget's controller counts a third healthy pod: one disruption allowed.
        w.kube.merge_patch(POD_DISRUPTION_BUDGETS, "keep", counted, "default",
                           subresource="status")  # fmt: skip
        eventually(lambda: evictions(w) == ["default/low-1"], timeout=5)
        eventually(lambda: "default/low-1" not in w.app.state.pods)
    finally:
        w.close()


def test_no_victim_goes_for_a_preemption_a_budget_would_stop_halfway() -> None:
    """Two cards are needed. On a1 the least important pods share a budget that allows
    one disruption: evicting low-0 would free one card and the API would refuse low-1.
    Read ahead, the preemption goes to a2 and its more important pods, whole."""
    pods = [running_pod("low-0", 10, "pair"), running_pod("low-1", 10, "pair"),
            running_pod("mid-0", 20, "free"), running_pod("mid-1", 20, "free")]  # fmt: skip
    w = budgeted_world([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")], pods,
                       [pdb("pair", "pair", 1)])  # fmt: skip
    try:
        on = {k: i.node_name for k, i in w.app.state.pods.items()}
        assert on["default/low-0"] == on["default/low-1"] != on["default/mid-0"]
        urgent = w.create(prio_pod("urgent", 1000, gpu=2))
        assert w.filter(urgent)["NodeNames"] == []
        eventually(lambda: len(evictions(w)) == 2)
        assert sorted(evictions(w)) == ["default/mid-0", "default/mid-1"]
        # Both gone from the extender's view (the watch may tell one before the other).
        eventually(lambda: not {"default/mid-0", "default/mid-1"} & w.app.state.pods.keys())
        assert w.schedule(urgent) == on["default/mid-0"]
        assert {"default/low-0", "default/low-1"} <= w.app.state.pods.keys()
    finally:
        w.close()


def test_a_held_node_takes_pods_on_what_its_preemptor_does_not_need() -> None:
    """The hold is the preemptor's placement, not the node: while its victims sit out
    their grace period, a less important pod may still use a card it does not need,
    and never one it does, nor, once they are gone, the cards they freed."""
    w = World([node_obj("a1", 3, "A100")])
    try:
        w.kube.graceful_evictions = True  # the victims stay, terminating, on their cards
        for name, prio, memory in (("low-0", 10, None), ("low-1", 10, None), ("vip", 2000, 20000)):
            assert w.schedule(w.create(prio_pod(name, prio, memory=memory))) == "a1"
        confirmed(w)
        urgent = w.create(prio_pod("urgent", 1000, gpu=2))
        assert w.filter(urgent)["NodeNames"] == []
        eventually(lambda: sorted(evictions(w)) == ["default/low-0", "default/low-1"])
        eventually(lambda: all(w.app.state.pods[f"default/low-{i}"].terminating for i in (0, 1)))

        def late(name: str, **kw: Any) -> dict[str, Any]:
            pod = prio_pod(name, 10, **kw)
            pod["spec"]["preemptionPolicy"] = "Never"
            return w.create(pod)

        # 20,000 MiB are left beside vip, on a card the urgent pod does not need.
        assert w.schedule(late("small", memory=10000)) == "a1"
        whole = late("whole")
        out = w.filter(whole)
        assert out["NodeNames"] == []
        assert out["FailedNodes"]["a1"].startswith("held for default/urgent (priority 1000)")
        for i in (0, 1):  # their grace period is over
            w.kube.delete(PODS, f"low-{i}", "default")
        eventually(lambda: "default/low-0" not in w.app.state.pods)
        eventually(lambda: "default/low-1" not in w.app.state.pods)
        out = w.filter(whole)  # two cards free now: both are the urgent pod's
        assert out["FailedNodes"]["a1"].startswith("held for default/urgent (priority 1000)")
        # The urgent pod reserved, not yet bound: its hold stands, and the pod's own
        # booking is counted once, not beside the placement the hold keeps for it.
        assert w.filter(urgent)["NodeNames"] == ["a1"]
        assert w.schedule(late("small-2", memory=10000)) == "a1"  # beside vip again
        assert w.bind(w.kube.get(PODS, "urgent", "default"), "a1")["Error"] == ""
        assert sorted(evictions(w)) == ["default/low-0", "default/low-1"]  # no one else
    finally:
        w.close()


def test_a_pod_its_policy_would_put_on_a_held_node_is_placed_on_another() -> None:
    # spread prefers a1, the emptier node, but a1's two free cards are the urgent pod's:
    # the filter places the pod again without the held node, rather than refusing it.
    w = World([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")])
    try:
        for name, prio, node in (("low-0", 10, "a1"), ("low-1", 10, "a1"), ("vip", 2000, "a2")):
            place_on(w, prio_pod(name, prio), node)
        confirmed(w)
        assert w.filter(w.create(prio_pod("urgent", 1000, gpu=2)))["NodeNames"] == []
        eventually(lambda: not {"default/low-0", "default/low-1"} & w.app.state.pods.keys())
        eventually(lambda: (h := w.app.state.holds.get("default/urgent")) and h.freed_at)
        late = prio_pod("late", 10, annotations={PLACEMENT: "spread"})
        late["spec"]["preemptionPolicy"] = "Never"
        assert w.filter(w.create(late))["NodeNames"] == ["a2"]
    finally:
        w.close()


def test_a_pod_that_would_take_the_preemptors_cpu_is_kept_off_the_held_node() -> None:
    """The node's CPU is shared by all its cards: a pod on a card the preemptor does not
    need is still refused there if it would leave the preemptor short of CPU."""

    def pod(name: str, prio: int, cpu: str, **kw: Any) -> dict[str, Any]:
        p = prio_pod(name, prio, **kw)
        p["spec"]["containers"][0]["resources"]["requests"] = {"cpu": cpu}
        if prio < 1000:
            p["spec"]["preemptionPolicy"] = "Never"
        return w.create(p)

    w = World([node_obj("a1", 3, "A100", cpu="8")])
    try:
        w.kube.graceful_evictions = True
        assert w.schedule(pod("low", 10, "6")) == "a1"
        assert w.schedule(pod("vip", 2000, "0", memory=20000)) == "a1"
        confirmed(w)
        urgent = pod("urgent", 1000, "6", gpu=2)  # the free card and low's, and its CPU
        assert w.filter(urgent)["NodeNames"] == []
        eventually(lambda: evictions(w) == ["default/low"])
        eventually(lambda: w.app.state.pods["default/low"].terminating)
        # Beside vip, 2 CPUs: the urgent pod keeps its 6 of the 8.
        assert w.schedule(pod("modest", 10, "2", memory=1000)) == "a1"
        w.kube.delete(PODS, "low", "default")
        eventually(lambda: "default/low" not in w.app.state.pods)
        out = w.filter(pod("greedy", 10, "1", memory=1000))  # 6 + 2 + 1 > 8
        assert out["NodeNames"] == []
        assert out["FailedNodes"]["a1"].startswith("held for default/urgent (priority 1000)")
        assert w.schedule(urgent) == "a1"
    finally:
        w.close()


def team_quota_held_for_urgent() -> tuple[World, str]:
    """team may hold 2 A100s and holds 1 (t-0 on a2). Its urgent pod evicts a pod of
    another namespace on a1 for a card; while the victim terminates, a3's card frees.
    team's quota is now 1 used and 1 held for the urgent pod. Returns the victim's key."""
    w = World([node_obj("a1", 2, "A100"), node_obj("a2", 1, "A100"), node_obj("a3", 1, "A100")])
    w.kube.graceful_evictions = True
    for name, node, ns, prio in (
        ("o-0", "a1", "other", 10),
        ("o-1", "a1", "other", 10),
        ("o-3", "a3", "other", 10_000),
        ("t-0", "a2", "team", 10),
    ):
        place_on(w, prio_pod(name, prio, ns=ns), node)  # fmt: skip
    confirmed(w)
    add_quota(w, gpu_quota("team", 2))
    urgent = w.create(prio_pod("urgent", 1000, ns="team"))
    assert w.filter(urgent)["NodeNames"] == []
    eventually(lambda: len(evictions(w)) == 1)
    [victim] = evictions(w)
    assert victim.startswith("other/o-")
    eventually(lambda: w.app.state.pods[victim].terminating)
    w.kube.delete(PODS, "o-3", "other")  # a3's card frees
    eventually(lambda: "other/o-3" not in w.app.state.pods)
    return w, victim


def test_a_preemptions_quota_room_is_held_against_less_important_pods_of_its_namespace() -> None:
    """A less important pod of team must not take the quota the urgent pod is to use, or
    the eviction was for nothing (team at 2 of 2, the urgent pod refused by its own
    quota)."""
    w, victim = team_quota_held_for_urgent()
    try:
        late = prio_pod("t-1", 10, ns="team")
        late["spec"]["preemptionPolicy"] = "Never"
        out = w.filter(w.create(late))
        assert out["NodeNames"] == []
        assert out["FailedNodes"]["a3"] == (
            "quota: team/gpus a100 (A100) whole cards 2 of 2 used (1 of it held for a "
            "preempting pod), the pod asks 1"
        )
        ns, _, name = victim.partition("/")
        w.kube.delete(PODS, name, ns)  # its grace period is over
        eventually(lambda: victim not in w.app.state.pods)
        assert w.schedule(w.kube.get(PODS, "urgent", "team")) == "a1"
    finally:
        w.close()


def test_a_less_important_preemptor_makes_its_quota_room_beside_a_held_one() -> None:
    """A pod of team less important than the urgent one, but more than t-0, may preempt.
    The quota held for the urgent pod counts as used (team at 2 of 2), so t-0 goes for
    quota room and the pod is to take a3's free card, not t-0's."""
    w, victim = team_quota_held_for_urgent()
    try:
        mid = w.create(prio_pod("t-1", 500, ns="team"))
        assert w.filter(mid)["NodeNames"] == []
        eventually(lambda: "team/t-0" in evictions(w))
        assert evictions(w) == [victim, "team/t-0"]
        assert eventually(lambda: events(w, "TesseraPreempting", "team", about="t-1")) == [
            "evicting for quota room: team/t-0 (priority 10)"
        ]
        hold = w.app.state.holds.get("team/t-1")
        assert hold is not None and hold.decision is not None and hold.decision.node == "a3"
    finally:
        w.close()


def test_quota_room_and_cards_together_and_only_from_its_own_namespace() -> None:
    """team may hold two A100s and holds them (t-0 on a1, t-1 on a3). Its urgent pod asks
    for two on one node: both team pods go for quota room, and other's pod beside t-0
    for the second card on a1. other's pods on a2 and team's more important pod stay."""
    w = World([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100"), node_obj("a3", 1, "A100")])
    try:
        for name, node, ns, prio in (
            ("t-0", "a1", "team", 10),
            ("o-0", "a1", "other", 10),
            ("o-1", "a2", "other", 10),
            ("o-2", "a2", "other", 10),
            ("t-1", "a3", "team", 10),
        ):
            place_on(w, prio_pod(name, prio, ns=ns), node)  # fmt: skip
        confirmed(w)
        add_quota(w, gpu_quota("team", 2))
        urgent = w.create(prio_pod("urgent", 1000, gpu=2, ns="team"))
        assert w.filter(urgent)["NodeNames"] == []
        eventually(lambda: len(evictions(w)) == 3)
        assert sorted(evictions(w)) == ["other/o-0", "team/t-0", "team/t-1"]
        expected = ("evicting on a1 for cards: other/o-0 (priority 10); for quota room: "
                    "team/t-0 (priority 10), team/t-1 (priority 10)")  # fmt: skip
        assert eventually(lambda: events(w, "TesseraPreempting", "team")) == [expected]
        eventually(lambda: not {"other/o-0", "team/t-0", "team/t-1"} & w.app.state.pods.keys())
        assert w.schedule(w.kube.get(PODS, "urgent", "team")) == "a1"
    finally:
        w.close()


def test_a_bind_with_no_reservation_keeps_off_what_a_hold_keeps(world: World) -> None:
    """kube-scheduler may bind a pod whose filter reservation expired (or, scored, on a
    node it chose): that bind must not take the card freed for the preempting pod."""
    w = world
    urgent = held_for_urgent(w)  # low-1 evicted and gone; a1's freed card held
    late = prio_pod("late", 10)
    late["spec"]["preemptionPolicy"] = "Never"
    out = w.bind(w.create(late), "a1")  # no filter before it: no reservation
    assert out["Error"] == (
        "pod default/late: a1 is held for default/urgent (priority 1000), which preempted "
        "pods here and has not been placed yet"
    )
    assert w.schedule(urgent) == "a1"


def test_quota_victims_are_given_back_the_most_important_first() -> None:
    """team may hold four A100s and holds them all on n1: p-1 one card, p-2 one, p-3 two
    (priorities 1, 2, 3). Its urgent pod asks three. Taken least important first, all
    three are needed; given back the most important first, p-3 stays needed and p-2 is
    not: p-1 and p-3 go, less important together than p-2 and p-3."""
    w = World([node_obj("n1", 4, "A100")])
    try:
        for name, gpu, prio in (("p-1", 1, 1), ("p-2", 1, 2), ("p-3", 2, 3)):
            place_on(w, prio_pod(name, prio, gpu=gpu, ns="team"), "n1")
        confirmed(w)
        add_quota(w, gpu_quota("team", 4))
        urgent = w.create(prio_pod("urgent", 1000, gpu=3, ns="team"))
        assert w.filter(urgent)["NodeNames"] == []
        eventually(lambda: len(evictions(w)) == 2)
        assert sorted(evictions(w)) == ["team/p-1", "team/p-3"]
    finally:
        w.close()


def test_quota_victims_are_the_fewest_after_the_least_important_are_given_back() -> None:
    """team may hold four A100s and holds them: p-2 (priority 2) both cards of a1, p-1 and
    p-3 (priorities 1 and 3) one each on a2. Its urgent pod asks two cards. Taken least
    important first, p-1 alone is not room enough and p-1 with p-2 is; given back most
    important first, p-2 alone is room enough, and its node takes the urgent pod."""
    w = World([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")])
    try:
        for name, node, gpu, prio in (("p-2", "a1", 2, 2), ("p-1", "a2", 1, 1),
                                      ("p-3", "a2", 1, 3)):  # fmt: skip
            place_on(w, prio_pod(name, prio, gpu=gpu, ns="team"), node)
        confirmed(w)
        add_quota(w, gpu_quota("team", 4))
        urgent = w.create(prio_pod("urgent", 1000, gpu=2, ns="team"))
        assert w.filter(urgent)["NodeNames"] == []
        eventually(lambda: evictions(w) == ["team/p-2"])
        eventually(lambda: "team/p-2" not in w.app.state.pods)
        assert w.schedule(w.kube.get(PODS, "urgent", "team")) == "a1"
        assert evictions(w) == ["team/p-2"]
    finally:
        w.close()


def test_a_pod_its_budget_protects_is_left_for_quota_room_and_another_goes() -> None:
    """The quota path reads the budgets ahead as the cards path does: low-1, the least
    important, is kept by its budget, so low-0 goes for the quota's room."""
    w = budgeted_world([node_obj("a1", 2, "A100")],
                       [running_pod("low-0", 10, "free"), running_pod("low-1", 10, "kept")],
                       [pdb("keep", "kept", 0)])  # fmt: skip
    try:
        add_quota(w, gpu_quota("default", 2))
        p = stepped_by_hand(w.app)
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/low-0"]
        assert blocked(w, "budget") == 0
    finally:
        w.close()


def test_a_pod_whose_eviction_was_refused_is_passed_over_for_quota_room() -> None:
    w = quota_world([node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100")],
                    {"low-0": "a1", "low-1": "a1"}, A100_QUOTA)  # fmt: skip
    try:
        p = stepped_by_hand(w.app)
        p.retry_s = 0.0
        w.kube.fail_next("evict", budget_refusal())
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/low-1"]  # refused
        eventually(lambda: "default/urgent" in w.app.state.pods)  # a retry is for a pod seen
        p.step()
        assert evictions(w) == ["default/low-1", "default/low-0"]
    finally:
        w.close()


def test_a_pod_being_placed_that_the_watch_has_not_shown_is_no_victim() -> None:
    """Its booking is there (filter reserved its card) but not what the watch says of
    it: it is weighed as holding its card, never as a victim."""
    w = World([node_obj("a1", 2, "A100")])
    try:
        assert w.schedule(w.create(prio_pod("low", 10))) == "a1"
        confirmed(w)
        p = stepped_by_hand(w.app)
        with w.kube.hold_watches():
            assert w.filter(w.create(prio_pod("new", 5)))["NodeNames"] == ["a1"]
            assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
            p.step()
            assert evictions(w) == ["default/low"]
    finally:
        w.close()


def test_a_node_offered_but_gone_does_not_end_the_search(world: World) -> None:
    w = world
    p = stepped_by_hand(w.app)
    urgent = w.create(prio_pod("urgent", 1000))
    assert w.filter(urgent, ["gone", "a1"])["NodeNames"] == []
    p.step()
    assert evictions(w) == ["default/low-1"]


def test_a_victim_past_the_first_nodes_scanned_is_found() -> None:
    """The nodes are scanned 200 at a time under the lock: the one victim, on the 401st
    node, is found all the same."""
    w = World([node_obj(f"n{i:03}", 1, "A100") for i in range(401)])
    try:
        for i in range(401):
            place_on(w, prio_pod(f"p{i:03}", 5 if i == 400 else 10), f"n{i:03}")
        confirmed(w)
        p = stepped_by_hand(w.app)
        assert w.filter(w.create(prio_pod("urgent", 7)))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/p400"]
    finally:
        w.close()


def test_no_pod_goes_for_quota_room_when_cards_on_another_model_make_room() -> None:
    """Its quota rules out the A100s, but evicting a T4 pod makes room as the quota
    stands: that is the preemption, with no pod evicted for quota room."""
    w = quota_world([node_obj("a1", 2, "A100"), node_obj("t1", 1, "T4")],
                    {"low-0": "a1", "low-1": "a1", "low-t": "t1"}, A100_QUOTA)  # fmt: skip
    try:
        p = stepped_by_hand(w.app)
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/low-t"]
    finally:
        w.close()


def test_quota_room_on_two_models_at_one_cost_is_made_on_the_first_by_name() -> None:
    """Either model's pod would make room at the same cost (one victim of priority 10):
    the choice is the same on every replica and every run, the first model by name."""
    w = quota_world([node_obj("t1", 1, "T4"), node_obj("a1", 1, "A100")],
                    {"low-t": "t1", "low-a": "a1"},
                    {"name": "a100", "models": ["A100"], "cards": 1},
                    {"name": "t4", "models": ["T4"], "cards": 1})  # fmt: skip
    try:
        p = stepped_by_hand(w.app)
        assert w.filter(w.create(prio_pod("urgent", 1000)))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/low-a"]
    finally:
        w.close()


def test_quota_room_is_made_on_a_model_the_pod_takes_past_one_it_does_not() -> None:
    """Both models are at the quota; the pod takes only T4s: the A100s are passed
    over, and a T4 pod goes for room."""
    w = quota_world([node_obj("a1", 2, "A100"), node_obj("t1", 1, "T4")],
                    {"low-0": "a1", "low-1": "a1", "low-t": "t1"},
                    A100_QUOTA, {"name": "t4", "models": ["T4"], "cards": 1})  # fmt: skip
    try:
        p = stepped_by_hand(w.app)
        urgent = prio_pod("urgent", 1000, annotations={"tessera.io/gpu-model": "T4"})
        assert w.filter(w.create(urgent))["NodeNames"] == []
        p.step()
        assert evictions(w) == ["default/low-t"]
    finally:
        w.close()
