"""Quotas enforced by the extender: filter, bind, webhook, restart, raise and status,
against the in-memory API (the real API server and kube-scheduler: tests/e2e)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from tessera.kube import GPUQUOTAS, PODS, ApiError, FakeKube
from tessera.model.annotations import ASSIGNMENT, QUOTA_RETRY
from tessera.scheduler.app import SchedulerApp
from tessera.scheduler.config import SchedulerConfig
from tessera.scheduler.nudge import nudge
from tessera.scheduler.quota_writer import QuotaWriter
from tests.unit._scheduler_world import World, add_quota, gpu_quota, node_obj, pod_obj
from tests.unit._wait import eventually as _eventually


def world() -> World:
    # Two A100 nodes and one T4 node, two cards each.
    return World(
        [node_obj("a1", 2, "A100"), node_obj("a2", 2, "A100"), node_obj("t1", 2, "T4")],
        quota_status_s=0.05,
    )


def test_filter_keeps_a_namespace_inside_its_model_quota_and_says_why() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 25000}))
        placed = [
            w.schedule(w.create(pod_obj(f"p{i}", memory=10000, cores=10, ns="team-a")))
            for i in range(4)
        ]
        # 2 x 10000 MiB on A100 (25000 allowed); the rest go to the T4 node, which the
        # quota does not cover.
        assert sorted(n[0] for n in placed if n) == ["a", "a", "t", "t"]
        out = w.filter(w.create(pod_obj("p4", memory=10000, cores=10, ns="team-a")), ["a1", "a2"])
        assert out["NodeNames"] == []
        why = out["FailedNodes"]["a1"]
        assert why == (
            "quota: team-a/gpus a100 (A100) memory 20000 of 25000 MiB used, the pod asks 10000"
        )
        # Another namespace is not limited.
        assert w.schedule(w.create(pod_obj("q0", memory=30000, ns="team-b"))) in ("a1", "a2")
    finally:
        w.close()


def test_whole_cards_and_cores_are_capped_too() -> None:
    w = world()
    try:
        add_quota(
            w,
            gpu_quota("team-a", {"name": "any", "models": ["*"], "cards": 1, "coresPercent": 250}),
        )
        assert w.schedule(w.create(pod_obj("w0", gpu=1, ns="team-a")))  # 1 card, 100 cores
        out = w.filter(w.create(pod_obj("w1", gpu=1, ns="team-a")))
        assert out["NodeNames"] == [] and "whole cards 1 of 1 used" in out["FailedNodes"]["a1"]
        assert w.schedule(w.create(pod_obj("s0", memory=1000, cores=50, ns="team-a")))
        out = w.filter(w.create(pod_obj("s1", gpu=2, memory=1000, cores=51, ns="team-a")))
        assert "cores 150 of 250% used, the pod asks 102" in out["FailedNodes"]["t1"]
    finally:
        w.close()


def test_concurrent_cycles_never_both_pass_the_last_of_a_quota() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 30000}))
        pods = [w.create(pod_obj(f"c{i}", memory=10000, ns="team-a")) for i in range(12)]
        results: list[list[str]] = []
        lock = threading.Lock()

        def cycle(pod: dict[str, Any]) -> None:
            out = w.filter(pod, ["a1", "a2"])
            with lock:
                results.append(out["NodeNames"])

        threads = [threading.Thread(target=cycle, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(1 for r in results if r) == 3  # exactly the quota, reserved
        with w.app.state.lock:
            lim = w.app.state.quotas.book.of("team-a")[0].limits[0]
            assert w.app.state.quotas.usage.of("team-a", lim).memory_mib == 30000
    finally:
        w.close()


def test_a_restarted_extender_rebuilds_usage_from_annotations() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 20000}))
        for i in range(2):
            assert w.schedule(w.create(pod_obj(f"r{i}", memory=10000, ns="team-a"))) in ("a1", "a2")
        assert all(ASSIGNMENT in w.kube.get(PODS, f"r{i}", "team-a")["metadata"]["annotations"]
                   for i in range(2))  # fmt: skip
        w.app.stop()
        w.app = SchedulerApp(
            SchedulerConfig(leader_elect=False, watch_timeout_s=1, quota_status_s=0.05), w.kube
        )
        w.app.start()
        assert w.app.wait_synced(5)
        out = w.filter(w.create(pod_obj("r2", memory=10000, ns="team-a")), ["a1", "a2"])
        assert out["NodeNames"] == [] and "20000 of 20000 MiB used" in out["FailedNodes"]["a1"]
    finally:
        w.close()


def test_bind_without_a_reservation_checks_the_quota() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 15000}))
        assert w.schedule(w.create(pod_obj("b0", memory=10000, ns="team-a"))) in ("a1", "a2")
        late = w.create(pod_obj("b1", memory=10000, ns="team-a"))
        out = w.bind(late, "a2")  # a bind no filter reserved for (a restarted extender)
        assert "quota: team-a/gpus a100 (A100) memory 10000 of 15000 MiB used" in out["Error"]
        assert w.app.state.held("team-a/b1") is None
    finally:
        w.close()


def test_raising_a_quota_nudges_waiting_pods_and_lowering_evicts_nothing() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "all", "models": ["*"], "memoryMiB": 10000}))
        assert w.schedule(w.create(pod_obj("u0", memory=10000, ns="team-a")))
        waiting = w.create(pod_obj("u1", memory=10000, ns="team-a"))
        assert w.filter(waiting)["NodeNames"] == []
        add_quota(w, gpu_quota("team-b", {"name": "all", "models": ["*"], "memoryMiB": 1000}))
        assert w.filter(w.create(pod_obj("v1", memory=10000, ns="team-b")))["NodeNames"] == []
        _eventually(lambda: "team-b/v1" in w.app.state.pods)  # a pod it could nudge
        # Lowered: nothing bound is touched.
        w.kube.merge_patch(GPUQUOTAS, "gpus", {"spec": {"limits": [
            {"name": "all", "models": ["*"], "memoryMiB": 5000}]}}, "team-a")  # fmt: skip
        time.sleep(0.3)
        assert w.app.state.held("team-a/u0") is not None
        assert QUOTA_RETRY not in w.kube.get(PODS, "u1", "team-a")["metadata"]["annotations"]
        # Raised: the waiting pod is nudged (kube-scheduler tries it again) and fits.
        w.kube.merge_patch(GPUQUOTAS, "gpus", {"spec": {"limits": [
            {"name": "all", "models": ["*"], "memoryMiB": 20000}]}}, "team-a")  # fmt: skip
        _eventually(
            lambda: QUOTA_RETRY in w.kube.get(PODS, "u1", "team-a")["metadata"]["annotations"]
        )
        assert w.app.quota_writer.nudged == 1  # not the bound pod, nor team-b's
        assert QUOTA_RETRY not in w.kube.get(PODS, "v1", "team-b")["metadata"]["annotations"]
        exposed = w.app.metrics.exposition()
        assert b'tessera_scheduler_quota_nudges_total{reason="quota-raised"} 1.0' in exposed
        assert w.schedule(w.kube.get(PODS, "u1", "team-a"))
    finally:
        w.close()


def test_a_deleted_quota_limits_its_namespace_no_more_and_nudges_its_waiting_pods() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "all", "models": ["*"], "memoryMiB": 1000}))
        waiting = w.create(pod_obj("u1", memory=10000, ns="team-a"))
        assert "quota: team-a/gpus" in w.filter(waiting)["FailedNodes"]["a1"]
        _eventually(lambda: "team-a/u1" in w.app.state.pods)  # its watch event is in
        w.kube.delete(GPUQUOTAS, "gpus", "team-a")
        _eventually(
            lambda: QUOTA_RETRY in w.kube.get(PODS, "u1", "team-a")["metadata"]["annotations"]
        )
        assert w.schedule(w.kube.get(PODS, "u1", "team-a"))
    finally:
        w.close()


def test_quotas_raised_between_two_rounds_all_have_their_pods_nudged_at_the_rounds_time() -> None:
    w = world()
    try:
        for name, ns in (("u1", "team-a"), ("v1", "team-b")):
            w.create(pod_obj(name, memory=10000, ns=ns))
            _eventually(lambda key=f"{ns}/{name}": key in w.app.state.pods)
        writer = QuotaWriter(w.app.state, w.kube, leading=lambda: True, clock=lambda: 1234.5)
        writer.raised({"team-a"})
        writer.raised({"team-b"})  # before the round: both are kept
        writer.step()
        stamps = [w.kube.get(PODS, name, ns)["metadata"]["annotations"].get(QUOTA_RETRY)
                  for name, ns in (("u1", "team-a"), ("v1", "team-b"))]  # fmt: skip
        assert stamps == ["1234.500", "1234.500"] and writer.nudged == 2
    finally:
        w.close()


def test_a_nudge_says_whether_it_landed(caplog: pytest.LogCaptureFixture) -> None:
    kube = FakeKube()
    kube.create(PODS, pod_obj("p", ns="team-a"), "team-a")
    assert nudge(kube, "team-a/p", "quota-raised", 12.0) is True
    assert kube.get(PODS, "p", "team-a")["metadata"]["annotations"][QUOTA_RETRY] == "12.000"
    assert nudge(kube, "team-a/gone", "quota-raised") is False  # deleted meanwhile
    kube.fail_next("merge_patch", ApiError(500, "InternalError", "etcd is away"))
    assert nudge(kube, "team-a/p", "cards-in-service") is False
    assert [r.getMessage() for r in caplog.records] == [
        "pod team-a/p: cannot nudge it to try again (cards-in-service): "
        "500 InternalError: etcd is away"
    ]


def test_status_shows_what_is_used_and_by_whom() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 50000}))
        for i in range(2):
            assert w.schedule(w.create(pod_obj(f"s{i}", memory=10000, cores=5, ns="team-a")))
        want = {"limits": [{"name": "a100", "used": {"memoryMiB": 20000, "coresPercent": 10,
                "cards": 0}, "pods": 2, "claims": 0, "holders": ["s0", "s1"]}]}  # fmt: skip
        _eventually(lambda: w.kube.get(GPUQUOTAS, "gpus", "team-a").get("status") == want)
        # The status subresource changes nothing else.
        assert w.kube.get(GPUQUOTAS, "gpus", "team-a")["spec"]["limits"][0]["memoryMiB"] == 50000
    finally:
        w.close()


def test_a_quota_whose_use_changed_has_its_status_written_past_one_that_did_not() -> None:
    w = world()
    try:
        for ns in ("team-a", "team-b"):
            add_quota(w, gpu_quota(ns, {"name": "a100", "models": ["A100"], "memoryMiB": 50000}))

        def used(ns: str) -> int | None:
            status = w.kube.get(GPUQUOTAS, "gpus", ns).get("status") or {"limits": [{}]}
            return status["limits"][0].get("used", {}).get("memoryMiB")

        _eventually(lambda: used("team-a") == 0 and used("team-b") == 0)
        assert w.schedule(w.create(pod_obj("b0", memory=10000, ns="team-b")))
        _eventually(lambda: used("team-b") == 10000)  # team-a, first, is unchanged
    finally:
        w.close()


def test_status_names_the_first_holders_counts_them_all_and_is_written_once() -> None:
    w = world()
    writes: list[str] = []
    patch = w.kube.merge_patch

    def counted(kind: Any, name: str, body: Any, *args: Any, **kw: Any) -> Any:
        if kind == GPUQUOTAS:
            writes.append(name)
        return patch(kind, name, body, *args, **kw)

    w.kube.merge_patch = counted  # type: ignore[method-assign]
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 50000}))
        for i in range(52):
            assert w.schedule(w.create(pod_obj(f"s{i:02d}", memory=100, cores=1, ns="team-a")))

        def limit() -> dict[str, Any]:
            return dict((w.kube.get(GPUQUOTAS, "gpus", "team-a").get("status") or {"limits": [{}]})
                        ["limits"][0])  # fmt: skip

        _eventually(lambda: limit().get("pods") == 52)
        assert limit()["used"]["memoryMiB"] == 5200
        assert limit()["holders"] == [f"s{i:02d}" for i in range(50)]
        settled = len(writes)
        time.sleep(0.3)  # six periods of the writer with nothing changed
        assert len(writes) == settled
    finally:
        w.close()


def test_a_quota_written_past_the_rules_keeps_the_last_good_one() -> None:
    w = world()
    try:
        add_quota(w, gpu_quota("team-a", {"name": "a100", "models": ["A100"], "memoryMiB": 1000}))
        w.kube.merge_patch(GPUQUOTAS, "gpus", {"spec": {"limits": [{"name": "a100"}]}}, "team-a")
        _eventually(lambda: "team-a/gpus" in w.app.state.quotas.book.refused)
        assert "spec.limits[0].models" in w.app.state.quotas.book.refused["team-a/gpus"]
        assert w.app.state.problems["bad-quota"] == 1
        out = w.filter(w.create(pod_obj("x", memory=2000, ns="team-a")), ["a1"])
        assert out["NodeNames"] == []  # still limited by the last good version
        # The counter takes each new problem once, however often it is scraped.
        counted = 'tessera_scheduler_state_problems_total{kind="bad-quota"} '
        assert counted + "1.0" in w.app.metrics.exposition().decode()
        assert counted + "1.0" in w.app.metrics.exposition().decode()
        w.kube.merge_patch(GPUQUOTAS, "gpus", {"spec": {"limits": [{"name": "b"}]}}, "team-a")
        _eventually(lambda: w.app.state.problems["bad-quota"] == 2)
        assert counted + "2.0" in w.app.metrics.exposition().decode()
    finally:
        w.close()


def test_the_webhook_refuses_a_pod_that_could_never_fit_its_quota() -> None:
    w = world()
    try:
        add_quota(
            w,
            gpu_quota(
                "team-a",
                {"name": "a100", "models": ["A100"], "memoryMiB": 20000},
                {"name": "t4", "models": ["T4"], "memoryMiB": 5000},
            ),
        )

        def review(pod: dict[str, Any]) -> dict[str, Any]:
            body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "request": {"uid": "u", "operation": "CREATE", "namespace": "team-a",
                                "object": pod}}  # fmt: skip
            status, out = w.post("validate", json.dumps(body).encode())
            assert status == 200
            return dict(out["response"])

        big = pod_obj("big", memory=30000, ns="team-a")
        del big["metadata"]["namespace"]  # as on CREATE: the request carries it
        out = review(big)
        assert (out["uid"], out["allowed"]) == ("u", False)
        assert out["status"] == {  # as the API server's own quota refuses: 403
            "code": 403,
            "reason": "Forbidden",
            "message": "quota: team-a/gpus a100 (A100) allows 20000 MiB of memory, "
            "the pod alone asks 30000",
        }
        assert review(pod_obj("fits-a100", memory=15000, ns="team-a"))["allowed"] is True
        assert review(pod_obj("other-ns", memory=30000, ns="team-b"))["allowed"] is True
    finally:
        w.close()


def test_only_a_rise_is_a_rise() -> None:
    from tessera.scheduler.state import SchedulerState

    s = SchedulerState()
    base = gpu_quota(
        "team-a", {"name": "a", "models": ["A100", "T4"], "memoryMiB": 100, "cards": 2}
    )
    assert s.quotas.apply(base) is False  # new: it only restricts
    lower = gpu_quota(
        "team-a", {"name": "a", "models": ["A100", "T4"], "memoryMiB": 50, "cards": 2}
    )
    assert s.quotas.apply(lower) is False
    for limit in (
        {"name": "a", "models": ["A100", "T4"], "memoryMiB": 60, "cards": 2},  # a cap up
        {"name": "a", "models": ["A100", "T4"], "cards": 2},  # a cap removed
        {"name": "a", "models": ["A100"], "memoryMiB": 50, "cards": 2},  # a model out
    ):
        s.quotas.apply(lower)
        assert s.quotas.apply(gpu_quota("team-a", limit)) is True, limit
    s.quotas.apply(lower)
    more = gpu_quota("team-a", {"name": "a", "models": ["A100", "T4"], "memoryMiB": 50, "cards": 2},
                     {"name": "b", "models": ["H100"], "cards": 1})  # fmt: skip
    assert s.quotas.apply(more) is False  # another limit only restricts
    assert s.quotas.apply(lower) is True  # ... and taking it away is a rise
    assert s.quotas.apply(lower, deleted=True) is True
