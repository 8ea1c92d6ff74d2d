"""Events are created off the caller's path and deduplicated."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.kube import EVENTS, ApiError, EventRecorder, FakeKube, events
from tests._logs import logged
from tests.unit._clock import Clock

POD = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}


def test_same_message_is_sent_once_per_interval() -> None:
    kube = FakeKube()
    rec = EventRecorder(kube, "tessera-scheduler", interval_s=60)
    rec.start()
    assert rec.record(POD, "FailedScheduling", "3 nodes: no card")
    assert not rec.record(POD, "FailedScheduling", "3 nodes: no card")
    assert rec.record(POD, "FailedScheduling", "4 nodes: no card")
    rec.flush()
    rec.stop()
    events = kube.list(EVENTS, "ns").items
    assert sorted(e["message"] for e in events) == ["3 nodes: no card", "4 nodes: no card"]
    assert {e["involvedObject"]["uid"] for e in events} == {"u1"}


def test_api_failure_is_swallowed(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    kube.fail_next("create", ApiError(403, "Forbidden", "no"))
    rec = EventRecorder(kube, "c")
    rec.start()
    rec.record(POD, "R", "m")
    rec.flush()
    rec.record(POD, "R", "m2")
    rec.flush()
    rec.stop()
    assert [e["message"] for e in kube.list(EVENTS, "ns").items] == ["m2"]
    assert logged(caplog, "tessera.kube.events") == ["event R on p not recorded: 403 Forbidden: no"]


def test_an_event_dropped_on_a_full_queue_is_not_taken_as_sent() -> None:
    kube = FakeKube()
    rec = EventRecorder(kube, "c", interval_s=60, max_queue=1)
    assert rec.record(POD, "R", "first")  # queued; nothing drains it yet
    assert not rec.record(POD, "R", "second")  # the queue is full: dropped
    assert rec.dropped == 1
    rec.start()
    rec.flush()
    assert rec.record(POD, "R", "second")  # not a duplicate of what never went out
    rec.flush()
    rec.stop()
    assert sorted(e["message"] for e in kube.list(EVENTS, "ns").items) == ["first", "second"]


def test_the_same_message_is_sent_again_once_its_interval_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(events.time, "monotonic", clock)
    rec = EventRecorder(FakeKube(), "c", interval_s=60)
    assert rec.record(POD, "R", "m")
    clock.now += 59.9
    assert not rec.record(POD, "R", "m")
    clock.now += 0.1  # the interval to the second since the last one sent
    assert rec.record(POD, "R", "m")


def test_objects_without_a_uid_are_told_apart_by_namespace_and_name() -> None:
    rec = EventRecorder(FakeKube(), "c")
    node_a = {"kind": "Node", "metadata": {"name": "a"}}
    assert rec.record(node_a, "R", "m")
    assert rec.record({"kind": "Node", "metadata": {"name": "b"}}, "R", "m")
    assert not rec.record(node_a, "R", "m")


def test_an_event_says_who_reports_it_and_keeps_the_first_1024_characters() -> None:
    kube = FakeKube()
    rec = EventRecorder(kube, "tessera-agent", instance="gpu-1", interval_s=60)
    rec.start()
    node = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "gpu-1", "uid": "n1"}}
    assert rec.record(node, "CardUnhealthy", "x" * 1500, type_="Normal")
    rec.flush()
    rec.stop()
    [e] = kube.list(EVENTS, "default").items  # a node's events go to default
    assert e["message"] == "x" * 1024
    assert (e["type"], e["count"], e["reason"]) == ("Normal", 1, "CardUnhealthy")
    assert e["source"] == {"component": "tessera-agent"}
    assert (e["reportingComponent"], e["reportingInstance"]) == ("tessera-agent", "gpu-1")
    assert e["involvedObject"]["kind"] == "Node" and e["involvedObject"]["uid"] == "n1"
    assert e["metadata"]["name"].startswith("gpu-1.")


def test_a_full_queue_drops_and_counts_instead_of_blocking_the_caller() -> None:
    rec = EventRecorder(FakeKube(), "c", max_queue=2)  # not started: nothing drains it
    assert [rec.record(POD, "R", f"m{i}") for i in range(4)] == [True, True, False, False]
    assert rec.dropped == 2


def test_pruning_the_memory_of_sent_messages_keeps_the_recent_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(events.time, "monotonic", clock)
    rec = EventRecorder(FakeKube(), "c", interval_s=60, max_queue=60_000)  # not drained
    assert rec.record(POD, "R", "recent")
    clock.now += 120
    for i in range(50_000):  # past 50,000 messages those older than the interval go
        rec.record(POD, "R", f"m{i}")
    assert not rec.record(POD, "R", "m49999")  # sent this second: still known
    assert not rec.record(POD, "R", "m0")


def test_a_burst_inside_the_interval_is_remembered_and_forgotten_once_it_is_old(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst of distinct messages that all stay inside the interval cannot be pruned;
    it is not looked over again at each record, yet is forgotten once it is old."""
    clock = Clock()
    monkeypatch.setattr(events.time, "monotonic", clock)
    monkeypatch.setattr(events, "_REMEMBER", 100)
    rec = EventRecorder(FakeKube(), "c", interval_s=60, max_queue=10_000)  # not drained
    prunes = 0  # each prune makes a new map (a copy of what it keeps)
    for i in range(1_000):
        before = rec._sent
        assert rec.record(POD, "R", f"burst-{i}")
        prunes += rec._sent is not before
    assert not any(rec.record(POD, "R", f"burst-{i}") for i in range(1_000))  # all known
    assert prunes == 4  # past 100, 202, 406 and 814 messages: not at each record
    clock.now += 120
    for i in range(1_100):
        rec.record(POD, "R", f"later-{i}")
    assert {k[2].split("-")[0] for k in rec._sent} == {"later"}  # the old burst went
    assert rec.record(POD, "R", "burst-0")  # and its messages may go again


class _Breaks(FakeKube):
    """An API whose next create raises what no client should (a bug, a library error)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = 1

    def create(self, kind: Any, obj: Any, namespace: str | None = None) -> Any:
        if kind is EVENTS and self.broken:
            self.broken -= 1
            raise RuntimeError("boom")
        return super().create(kind, obj, namespace)


def test_an_unexpected_error_is_logged_and_the_next_event_still_goes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = _Breaks()
    rec = EventRecorder(kube, "c")
    rec.start()
    rec.record(POD, "R", "m")
    rec.flush()
    rec.record(POD, "R", "m2")
    rec.flush()
    rec.stop()
    assert [e["message"] for e in kube.list(EVENTS, "ns").items] == ["m2"]
    assert logged(caplog, "tessera.kube.events") == ["event R on p not recorded"]


class _FixedNow:
    """datetime as events.py uses it: now(UTC) only (a local time would be wrong)."""

    @staticmethod
    def now(tz: Any) -> datetime:
        assert tz is UTC
        return datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def test_the_event_written_is_a_whole_core_v1_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "datetime", _FixedNow)
    kube = FakeKube()
    rec = EventRecorder(kube, "tessera-scheduler", instance="replica-1")
    rec.start()
    pod = {**POD, "metadata": {**POD["metadata"], "resourceVersion": "42"}}
    rec.record(pod, "TesseraUnschedulable", "no card")
    rec.record({"metadata": {"namespace": "ns"}}, "R", "an object that says little")
    rec.flush()
    rec.stop()
    written = sorted(kube.list(EVENTS, "ns").items, key=lambda e: e["reason"])
    for e in written:
        assert e["metadata"]["name"].startswith(e["metadata"]["generateName"])
        for generated in ("name", "uid", "resourceVersion", "creationTimestamp"):
            e["metadata"].pop(generated, None)
    stamp = "2026-03-04T05:06:07Z"
    common = {"apiVersion": "v1", "kind": "Event", "type": "Warning", "count": 1,
              "source": {"component": "tessera-scheduler"},
              "reportingComponent": "tessera-scheduler", "reportingInstance": "replica-1",
              "firstTimestamp": stamp, "lastTimestamp": stamp}  # fmt: skip
    assert written == [
        {**common, "reason": "R", "message": "an object that says little",
         "metadata": {"generateName": "object.", "namespace": "ns"},
         "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ns",
                            "name": None, "uid": "", "resourceVersion": None}},
        {**common, "reason": "TesseraUnschedulable", "message": "no card",
         "metadata": {"generateName": "p.", "namespace": "ns"},
         "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "ns",
                            "name": "p", "uid": "u1", "resourceVersion": "42"}},
    ]  # fmt: skip


def test_objects_without_a_uid_in_two_namespaces_are_two_objects() -> None:
    rec = EventRecorder(FakeKube(), "c")
    assert rec.record({"metadata": {"namespace": "a", "name": "p"}}, "R", "m")
    assert rec.record({"metadata": {"namespace": "b", "name": "p"}}, "R", "m")
    assert rec.record({}, "R", "m")  # not even metadata: recorded, not a crash
