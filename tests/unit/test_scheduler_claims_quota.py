"""GpuQuota on the claims path: the claims book counts what the webhook admits and what
the watch shows allocated, beside the extender's pods, through a claim's lifecycle."""

from __future__ import annotations

import copy
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tessera.kube import GPUQUOTAS
from tessera.kube.kinds import RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.kube.port import WatchEvent
from tessera.model.clusterspec import make_cards
from tessera.quota.usage import Usage
from tessera.scheduler.claims_book import ClaimsBook
from tessera.scheduler.state import SchedulerState
from tests.unit._claims import a_slice, claim
from tests.unit._clock import Clock
from tests.unit._scheduler_world import World, node_obj, pod_obj
from tests.unit._wait import eventually

A100_MIB = make_cards("c1", 1, "A100")[0].memory_mib
QUOTA = {
    "apiVersion": "tessera.io/v1alpha1",
    "kind": "GpuQuota",
    "metadata": {"namespace": "team-a", "name": "gpus", "resourceVersion": "1"},
    "spec": {"limits": [{"name": "a100", "models": ["A100"], "memoryMiB": 20000}]},
}


def book(ttl: float = 30.0) -> tuple[SchedulerState, ClaimsBook, Clock]:
    state = SchedulerState()
    state.quotas.apply(QUOTA)
    clock = Clock(100.0)
    b = ClaimsBook(state, assume_ttl_s=ttl, clock=clock)
    b.slices_handler.replace([a_slice(), a_slice("t1", "T4")])
    b.claims_handler.replace([])
    return state, b, clock


def used(state: SchedulerState) -> int:
    [lim] = state.quotas.book.of("team-a")[0].limits
    return state.quotas.usage.of("team-a", lim).memory_mib


def test_admitted_claims_count_at_once_until_the_quota_is_full() -> None:
    state, b, _ = book()
    assert b.admit(claim("a")) == ""
    assert b.admit(claim("b", device="gpu-1")) == ""
    assert used(state) == 16384
    why = b.admit(claim("c", device="gpu-2"))
    assert why == (
        "quota: team-a/gpus a100 (A100) memory 16384 of 20000 MiB used, claim c asks 8192"
    )
    assert used(state) == 16384  # the refused claim counts nothing
    # Another model, another namespace, another driver: not this quota's business.
    assert b.admit(claim("t", pool="t1")) == ""
    assert b.admit(claim("o", ns="team-b")) == ""
    assert b.admit(claim("n", driver="gpu.nvidia.com")) == ""
    assert used(state) == 16384


def test_a_retry_of_the_same_claim_is_not_in_its_own_way() -> None:
    state, b, _ = book()
    assert b.admit(claim("a", memory="12Gi")) == ""
    assert b.admit(claim("a", memory="12Gi")) == ""  # the write failed, kube-scheduler retries
    assert used(state) == 12288


def test_the_watch_takes_over_and_a_deletion_frees_the_quota() -> None:
    state, b, clock = book()
    released: list[str] = []
    b.on_release = released.append
    assert b.admit(claim("a")) == ""
    b.claims_handler.apply(WatchEvent("MODIFIED", claim("a")))  # the allocation is in
    assert b.assumed() == 0 and used(state) == 8192
    clock.now += 3600  # observed records do not expire
    b.expire()
    assert used(state) == 8192
    b.claims_handler.apply(WatchEvent("DELETED", claim("a")))
    assert used(state) == 0 and released == ["team-a"]


def test_a_claim_made_again_under_its_name_is_counted_again() -> None:
    # The deletion was missed (a watch that lapsed): the new claim's allocation replaces
    # the old one's, though a claim's own allocation never changes.
    state, b, _ = book()
    b.claims_handler.apply(WatchEvent("ADDED", claim("a", uid="u1")))
    b.claims_handler.apply(WatchEvent("MODIFIED", claim("a", uid="u1")))
    assert used(state) == 8192
    b.claims_handler.apply(WatchEvent("ADDED", claim("a", uid="u2", memory="4Gi")))
    assert used(state) == 4096


def test_a_claim_that_held_nothing_counted_frees_no_quota_when_it_goes() -> None:
    _, b, _ = book()
    released: list[str] = []
    b.on_release = released.append
    other = claim("n", driver="gpu.nvidia.com")
    b.claims_handler.apply(WatchEvent("ADDED", other))
    b.claims_handler.apply(WatchEvent("DELETED", other))
    assert released == []  # nothing to nudge waiting pods for
    b.claims_handler.apply(WatchEvent("ADDED", claim("a")))
    b.claims_handler.apply(WatchEvent("DELETED", claim("a")))
    assert released == ["team-a"]


def test_an_admitted_allocation_that_never_shows_expires() -> None:
    state, b, clock = book(ttl=30.0)
    assert b.admit(claim("a")) == ""
    # An event of the claim without the allocation (an older write) keeps the admission.
    b.claims_handler.apply(WatchEvent("MODIFIED", claim("a", memory=None)))
    clock.now += 29
    b.expire()
    assert used(state) == 8192
    clock.now += 1  # its deadline: gone
    b.expire()
    assert used(state) == 0 and b.assumed() == 0


def test_a_deleted_claim_drops_its_admission_but_a_new_one_of_that_name_does_not() -> None:
    state, b, _ = book()
    assert b.admit(claim("a", uid="u1")) == ""
    b.claims_handler.apply(WatchEvent("DELETED", claim("a", uid="u0", memory=None)))
    assert used(state) == 8192  # an older claim of that name went: not this admission
    b.claims_handler.apply(WatchEvent("DELETED", claim("a", uid="u1", memory=None)))
    assert used(state) == 0


def test_a_claim_seen_before_its_slice_counts_when_the_slice_comes_and_after_it_goes() -> None:
    state, b, _ = book()
    b.claims_handler.apply(WatchEvent("ADDED", claim("a", pool="c2")))
    assert used(state) == 0
    s2 = a_slice("c2")
    b.slices_handler.apply(WatchEvent("ADDED", s2))
    assert used(state) == 8192
    b.slices_handler.apply(WatchEvent("DELETED", s2))  # the node went; the claim did not
    assert used(state) == 8192
    assert b.admit(claim("b", pool="c2")).endswith("pool c2 has no known slice")


def test_a_claim_deleted_before_its_slice_came_is_not_counted_when_it_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, b, _ = book()
    caplog.set_level("INFO", logger="tessera.scheduler.claims_book")
    waiting = claim("a", pool="c2")
    why = ("claim team-a/claim/a is not counted yet: status.allocation.devices.results: "
           "pool c2 has no known slice")  # fmt: skip
    b.claims_handler.apply(WatchEvent("ADDED", waiting))
    assert [r.getMessage() for r in caplog.records] == [why]
    b.claims_handler.apply(WatchEvent("MODIFIED", waiting))
    assert [r.getMessage() for r in caplog.records] == [why]  # said once, however often seen
    b.claims_handler.apply(WatchEvent("DELETED", waiting))
    b.slices_handler.apply(WatchEvent("ADDED", a_slice("c2")))
    assert used(state) == 0


def test_a_relist_recounts_and_keeps_pending_admissions() -> None:
    state, b, _ = book()
    b.claims_handler.replace([claim("x"), claim("y", memory="4Gi")])
    assert used(state) == 8192 + 4096  # each claim under its own name
    b.claims_handler.replace([claim("a"), claim("b", memory=None)])
    assert used(state) == 8192
    assert b.admit(claim("b", memory="4Gi")) == ""
    b.claims_handler.replace([claim("b", memory=None)])  # a gone, b's write not in yet
    assert used(state) == 4096
    whole = claim("w", device="gpu-3")
    del whole["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    b.claims_handler.replace([claim("b", memory="4Gi"), whole])
    [lim] = state.quotas.book.of("team-a")[0].limits
    assert state.quotas.usage.of("team-a", lim) == Usage(4096 + A100_MIB, 10 + 100, 1)


# --- through the app: the review, the extender's pods, the status ---------------------


def review(new: dict[str, Any], old: dict[str, Any] | None = None, sub: str = "status") -> bytes:
    request = {"uid": "r1", "operation": "UPDATE", "subResource": sub, "object": new,
               "oldObject": old if old is not None else {**new, "status": {}}}  # fmt: skip
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "request": request}).encode()


def answer(w: World, body: bytes) -> dict[str, Any]:
    r = w.app.handle("POST", "/validate-claims", body)
    assert r.status == 200, r.body
    doc = json.loads(r.body)
    assert (doc["apiVersion"], doc["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    out = doc["response"]
    assert out["uid"] == "r1"
    return dict(out)


@pytest.fixture
def world() -> Any:
    w = World([node_obj("a1", 2, "A100")])
    w.kube.create(GPUQUOTAS, copy.deepcopy(QUOTA), "team-a")
    w.kube.create(RESOURCE_SLICES, a_slice())
    eventually(lambda: w.app.state.quotas.book.of("team-a") and w.app.claims_book.pools() == ["c1"])
    yield w
    w.close()


def test_the_webhook_refuses_an_allocation_over_the_quota_and_counts_pods_with_claims(
    world: World,
) -> None:
    w = world
    assert answer(w, review(claim("a", memory="12Gi")))["allowed"] is True
    # An extender-path pod of the namespace now finds only 20000 - 12288 MiB of A100.
    out = w.filter(w.create(pod_obj("p", memory=8000, ns="team-a")))
    assert out["NodeNames"] == []
    assert "12288 of 20000 MiB used, the pod asks 8000" in out["FailedNodes"]["a1"]
    assert w.schedule(w.create(pod_obj("q", memory=7000, ns="team-a")))
    refused = answer(w, review(claim("b", memory="1Gi", device="gpu-1")))
    assert refused["allowed"] is False and refused["status"]["code"] == 403
    assert "19288 of 20000 MiB used, claim b asks 1024" in refused["status"]["message"]
    text = w.app.handle("GET", "/metrics", b"").body.decode()
    assert 'tessera_scheduler_admissions_total{hook="claims",result="allowed"} 1.0' in text
    assert 'tessera_scheduler_admissions_total{hook="claims",result="refused"} 1.0' in text
    # The quota's status names the claim beside the pod.
    w.kube.create(RESOURCE_CLAIMS, claim("a", memory="12Gi"), "team-a")
    want = {"name": "a100", "used": {"memoryMiB": 19288, "coresPercent": 10, "cards": 0},
            "pods": 1, "claims": 1, "holders": ["claim/a", "q"]}  # fmt: skip
    w.app.quota_writer.step()
    eventually(lambda: (w.kube.get(GPUQUOTAS, "gpus", "team-a").get("status") or {}).get(
        "limits") == [want])  # fmt: skip


def test_only_a_first_allocation_is_judged(world: World) -> None:
    w = world
    big = claim("big", memory="30Gi")
    assert answer(w, review(big, old=big))["allowed"] is True  # already allocated
    assert answer(w, review(big, sub=""))["allowed"] is True  # not the status
    assert answer(w, review(claim("none", memory=None)))["allowed"] is True
    assert answer(w, review(big))["allowed"] is False
    text = w.app.handle("GET", "/metrics", b"").body.decode()
    assert 'tessera_scheduler_admissions_total{hook="claims",result="allowed"} 3.0' in text
    assert 'tessera_scheduler_admissions_total{hook="claims",result="refused"} 1.0' in text


def test_a_standby_refuses_as_unavailable_and_bad_reviews_are_named(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = world
    w.app.leading = lambda: False  # type: ignore[method-assign]
    out = answer(w, review(claim("a")))
    assert out["allowed"] is False and out["status"]["code"] == 503
    assert out["status"]["message"] == (
        "standby replica of the Tessera scheduler (the leader is ''); try again"
    )
    # Under leader election it names the replica it knows leads.
    monkeypatch.setattr(w.app, "leader", SimpleNamespace(holder="replica-b"))
    out = answer(w, review(claim("a")))
    assert out["status"]["message"] == (
        "standby replica of the Tessera scheduler (the leader is 'replica-b'); try again"
    )
    monkeypatch.setattr(w.app, "leader", None)
    # Leading but not listed yet: unavailable too, saying so.
    w.app.leading = lambda: True  # type: ignore[method-assign]
    w.app.synced = lambda: False  # type: ignore[method-assign]
    out = answer(w, review(claim("a")))
    assert (out["allowed"], out["status"]["code"], out["status"]["message"]) == (
        False,
        503,
        "the Tessera scheduler has not listed pods, quotas and claims yet; try again",
    )
    r = w.app.handle("POST", "/validate-claims", b"{")
    assert r.status == 400 and b"not valid JSON" in r.body
    body = json.dumps({"request": {"uid": "r1", "object": {}, "oldObject": []}}).encode()
    r = w.app.handle("POST", "/validate-claims", body)
    assert r.status == 400 and b"request.oldObject: must be an object" in r.body


def test_objects_are_kept_for_the_page_only() -> None:
    state, b, _ = book()
    b.claims_handler.apply(WatchEvent("ADDED", claim("a")))
    assert (b.slices(), b.claims(), b.pools()) == ([], [], ["c1", "t1"])
    paged = ClaimsBook(state, keep_objects=True)
    paged.slices_handler.replace([a_slice()])
    paged.claims_handler.replace([claim("a"), claim("b", memory=None)])
    assert [c["metadata"]["name"] for c in paged.claims()] == ["a"]
    assert [s["spec"]["nodeName"] for s in paged.slices()] == ["c1"]


def test_a_namespace_without_a_quota_is_not_asked_about_its_slices() -> None:
    _, b, _ = book()
    assert b.admit(claim("far", ns="team-b", pool="not-listed-yet")) == ""


def test_a_limit_over_two_models_is_judged_on_their_sum() -> None:
    state = SchedulerState()
    both = {"name": "mixed", "models": ["A100", "T4"], "memoryMiB": 12000}
    state.quotas.apply({**QUOTA, "spec": {"limits": [both]}})
    b = ClaimsBook(state)
    b.slices_handler.replace([a_slice(), a_slice("t1", "T4")])
    two = claim("two")
    second = {**two["status"]["allocation"]["devices"]["results"][0], "pool": "t1"}
    two["status"]["allocation"]["devices"]["results"].append(second)
    why = b.admit(two)
    assert why == "quota: team-a/gpus mixed (T4) memory 8192 of 12000 MiB used, claim two asks 8192"
    assert (
        state.quotas.usage.of("team-a", state.quotas.book.of("team-a")[0].limits[0]).memory_mib == 0
    )


def test_a_slice_that_does_not_read_is_a_problem_and_its_cards_are_not_known(
    caplog: pytest.LogCaptureFixture,
) -> None:
    state, b, _ = book()
    broken = a_slice("c3")
    del broken["spec"]["devices"][0]["attributes"]["model"]
    b.slices_handler.apply(WatchEvent("ADDED", broken))
    assert state.problems["bad-slice"] == 1 and "c3" not in b.pools()
    assert b.admit(claim("a", pool="c3")).endswith("pool c3 has no known slice")
    b.slices_handler.apply(WatchEvent("MODIFIED", broken))
    assert state.problems["bad-slice"] == 2  # counted each time it is read
    assert caplog.records[-1].getMessage() == (
        "ResourceSlice c3-gpu.tessera.io does not read, its cards are not known: "
        "spec.devices[0].attributes.model: is missing"
    )


def test_the_leaders_quota_round_drops_an_admission_that_never_showed() -> None:
    w = World([node_obj("a1", 2, "A100")], reservation_ttl_s=0.2)
    try:
        w.kube.create(GPUQUOTAS, copy.deepcopy(QUOTA), "team-a")
        w.kube.create(RESOURCE_SLICES, a_slice())
        eventually(lambda: w.app.state.quotas.book.of("team-a") and w.app.claims_book.pools())
        assert answer(w, review(claim("a")))["allowed"] is True
        w.app.quota_writer.step()
        lim = w.kube.get(GPUQUOTAS, "gpus", "team-a")["status"]["limits"][0]
        assert (lim["used"]["memoryMiB"], lim["claims"]) == (8192, 1)
        time.sleep(0.3)  # no allocation came: the write failed after the webhook
        w.app.quota_writer.step()
        lim = w.kube.get(GPUQUOTAS, "gpus", "team-a")["status"]["limits"][0]
        assert (lim["used"]["memoryMiB"], lim["claims"], lim["holders"]) == (0, 0, [])
    finally:
        w.close()
