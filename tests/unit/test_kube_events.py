"""Events are created off the caller's path and deduplicated."""

from __future__ import annotations

from tessera.kube import EVENTS, ApiError, EventRecorder, FakeKube

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


def test_api_failure_is_swallowed() -> None:
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
