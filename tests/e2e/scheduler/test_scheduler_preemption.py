"""GPU preemption on the real control plane: kube-scheduler's own preemption finds no
victim for a Tessera pod (it cannot see cards), so the extender evicts the least
important lower-priority pod through the real Eviction API -- where a
PodDisruptionBudget can refuse it -- and the higher-priority pod takes the card."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.kube import GPUQUOTAS, NODES, PODS, Conflict, Kind, NotFound, Obj
from tessera.kube.kinds import EVENTS, NAMESPACES
from tessera.model.clusterspec import make_cards
from tessera.model.types import NodeInventory
from tests.e2e.plugin import run
from tests.e2e.scheduler.browser import browser
from tests.e2e.scheduler.harness import Harness
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "preempt"
NODE = "preempt-0"
PRIORITY_CLASSES = Kind("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False)
BUDGETS = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True)
# Keeps an evicted pod terminating until the test lets it go (its cards stay its own).
FINALIZER = "tessera.io/e2e-keep"
UNFINALIZE = {"metadata": {"finalizers": None}}


def _pod(name: str, priority_class: str) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"tier": priority_class}},
        "spec": {
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"limits": {"tessera.io/gpu": "1"}}}],
        },
    }  # fmt: skip


@pytest.fixture
def two_cards(harness: Harness) -> Iterator[Harness]:
    """One node of two A100s of its own, and two priority classes."""
    h = harness
    h.env.create_gpu_nodes([NodeInventory(NODE, make_cards(NODE, 2, "A100"),
                                          cpu_milli=16_000, memory_mib=64 * 1024)])  # fmt: skip
    with contextlib.suppress(Conflict):  # made by an earlier test of this file
        h.admin.create(NAMESPACES, {"metadata": {"name": NS}})
    h.ensure_default_service_account(NS)
    for name, value in (("gpu-low", 10), ("gpu-high", 1000)):
        h.admin.create(PRIORITY_CLASSES, {"metadata": {"name": name}, "value": value})
    try:
        yield h
    finally:
        for p in h.admin.list(PODS, NS).items:
            with contextlib.suppress(NotFound):
                h.admin.merge_patch(PODS, p["metadata"]["name"], UNFINALIZE, NS)
                h.admin.delete(PODS, p["metadata"]["name"], NS)
        for name in ("gpu-low", "gpu-high"):
            h.admin.delete(PRIORITY_CLASSES, name)
        h.admin.delete(NODES, NODE)
        ext = h.extender
        assert ext is not None
        wait_for("the extender to forget the node",
                 lambda: ext.metric("tessera_scheduler_nodes") == 100, 60)  # fmt: skip


def _events(h: Harness, reason: str) -> list[Obj]:
    return [e for e in h.admin.list(EVENTS, NS).items if e.get("reason") == reason]


def _failed(h: Harness, pod: str) -> list[str]:
    """kube-scheduler's FailedScheduling messages for ``pod``."""
    mine = [e for e in h.admin.list(EVENTS, NS).items if e["involvedObject"]["name"] == pod]
    return [str(e["message"]) for e in mine if e["reason"] == "FailedScheduling"]


def _bound(h: Harness) -> dict[str, str]:
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in h.admin.list(PODS, NS).items
            if p["spec"].get("nodeName")}  # fmt: skip


def test_a_higher_priority_pod_has_a_lower_one_evicted_budgets_permitting(
    two_cards: Harness, tmp_path: Path
) -> None:
    h = two_cards
    for name in ("low-0", "low-1"):
        pod = _pod(name, "gpu-low")
        pod["metadata"]["finalizers"] = [FINALIZER]  # the victim stays until let go
        h.admin.create(PODS, pod, NS)
    wait_for("both low pods bound", lambda: len(_bound(h)) == 2, 60, 0.2)
    # A budget that allows no disruption: the Eviction API would refuse (429). The
    # preemptor reads it ahead, asks for no eviction and says why; nobody goes.
    selector = {"matchLabels": {"tier": "gpu-low"}}
    budget = {"metadata": {"name": "keep-low"},
              "spec": {"minAvailable": 2, "selector": selector}}  # fmt: skip
    h.admin.create(BUDGETS, budget, NS)
    wait_for("the budget to be counted", lambda: (h.admin.get(BUDGETS, "keep-low", NS)
             .get("status") or {}).get("observedGeneration"), 60, 0.2)  # fmt: skip
    h.admin.create(PODS, _pod("urgent", "gpu-high"), NS)
    blocked = wait_for("the refusal to be reported",
                       lambda: _events(h, "TesseraPreemptionBlocked"), 60, 0.5)  # fmt: skip
    assert blocked[0]["message"] == (
        f"evicting on {NODE} would make room, but the Eviction API would refuse {NS}/low-1: "
        "PodDisruptionBudget keep-low needs 2 healthy pods and has 2"
    ), blocked[0]["message"]
    assert sorted(_bound(h)) == ["low-0", "low-1"]
    # kube-scheduler's own preemption found no victim, as docs/scheduler.md says.
    failed = _failed(h, "urgent")
    assert any("expected at least one victim pod" in m for m in failed), failed
    # kubectl tessera why says what preemption would do.
    why = run(h.env.kubeconfig, "why", "urgent", "-n", NS).stdout
    assert (
        f"preemption: evicting on {NODE} for cards: {NS}/low-1 (priority 10) would make "
        f"room, but the Eviction API would refuse {NS}/low-1: PodDisruptionBudget keep-low"
    ) in why
    # The budget goes: the preemptor's next try (every 10 s while the pod waits) evicts
    # one of them. The victim's finalizer keeps it terminating, on its card, until the
    # test lets it go.
    h.admin.delete(BUDGETS, "keep-low", NS)

    def evicted() -> str | None:
        return next((n for n in ("low-0", "low-1") if h.admin.get(PODS, n, NS)["metadata"]
                     .get("deletionTimestamp")), None)  # fmt: skip

    victim = str(wait_for("a low pod to be evicted", evicted, 60, 0.5))
    kept = "low-1" if victim == "low-0" else "low-0"

    # The preemption is written on the pod (through the chart's admission policy), so an
    # extender restarted now -- a rollout, a takeover -- holds the node again and evicts
    # no second pod while the victim terminates. It is written before the eviction is
    # asked: read once the victim is terminating, it is there.
    annotations = h.admin.get(PODS, "urgent", NS)["metadata"].get("annotations") or {}
    record = json.loads(annotations["tessera.io/preempting"])
    placement = record.pop("placement")  # where the urgent pod is to go: the victim's card
    assert record == {"node": NODE, "v": 1, "victims": [f"{NS}/{victim}"]}
    victim_card = json.loads(h.admin.get(PODS, victim, NS)["metadata"]["annotations"]
                             ["tessera.io/assignment"])["containers"][0]["cards"]  # fmt: skip
    assert placement["node"] == NODE
    assert [c["uuid"] for c in placement["containers"][0]["cards"]] == [
        c["uuid"] for c in victim_card]  # fmt: skip
    ext = h.extender
    assert ext is not None
    ext.stop()
    ext.start()
    # why says the preemption is under way, not which pod it would evict next.
    why = run(h.env.kubeconfig, "why", "urgent", "-n", NS).stdout
    assert (f"preemption: under way on {NODE}, the node held for this pod; waiting for "
            f"{NS}/{victim} (terminating) to go") in why, why  # fmt: skip
    # Meanwhile the node is held for the urgent pod: a low-priority pod that comes now is
    # kept off it, in kube-scheduler's own words, so it cannot take the card that is about
    # to be freed (and be evicted in turn).
    h.admin.create(PODS, _pod("peer", "gpu-low"), NS)
    held = f"held for {NS}/urgent (priority 1000)"
    wait_for("peer to find the node held",
             lambda: any(held in m for m in _failed(h, "peer")), 60, 0.5)  # fmt: skip
    # why judges peer as the leader does: it reads the urgent pod's preemption too.
    why = run(h.env.kubeconfig, "why", "peer", "-n", NS).stdout
    assert f"fits nowhere: 0/1 node fit — 1 node: {held}, which preempted pods" in why, why
    # The operator's GPU map says so too, on the node's row, in a real browser.

    def map_says() -> str:
        doc = json.loads(ext.get("/gpus.json")[1])
        return str(next(n["held"] for n in doc["nodes"] if n["name"] == NODE))

    # What is held is the urgent pod's placement: the victim's card, by index (taken
    # over from the pod's tessera.io/preempting by the restarted extender).
    index = {c.uuid: c.index for c in make_cards(NODE, 2, "A100")}[victim_card[0]["uuid"]]
    on_map = f"{held}: card {index}"
    wait_for("the GPU map to show the hold", lambda: map_says() == on_map, 30, 0.5)
    page = browser(f"http://127.0.0.1:{ext.port}/gpus#q={NODE}", tmp_path)
    [(_, _, shown)] = page.with_class("held")
    assert shown == on_map
    h.admin.merge_patch(PODS, victim, UNFINALIZE, NS)
    wait_for("urgent bound", lambda: _bound(h).get("urgent") == NODE, 120, 0.5)
    assert sorted(_bound(h)) == sorted([kept, "urgent"])
    [preempting] = _events(h, "TesseraPreempting")
    assert preempting["message"] == f"evicting on {NODE} for cards: {NS}/{victim} (priority 10)"
    assert [e["involvedObject"]["name"] for e in _events(h, "TesseraPreempted")] == [victim]
    # An equal-priority pod evicts no one: it waits.
    assert sorted(_bound(h)) == sorted([kept, "urgent"])
    assert len(_events(h, "TesseraPreempting")) == 1
    assert "preemption: none would help" in run(h.env.kubeconfig, "why", "peer", "-n", NS).stdout


def test_a_pod_its_quota_keeps_out_has_a_less_important_pod_of_its_namespace_evicted(
    two_cards: Harness,
) -> None:
    """The namespace may hold one A100 and its low pod holds it; a card is free. The
    urgent pod of the same namespace is kept out by the quota, not by the cards: the low
    pod is evicted for quota room, and the urgent pod is bound."""
    h = two_cards
    limit = {"name": "a100", "models": ["A100"], "cards": 1}
    quota = {"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
             "metadata": {"name": "gpus"}, "spec": {"limits": [limit]}}  # fmt: skip
    h.admin.create(GPUQUOTAS, quota, NS)
    try:
        h.admin.create(PODS, _pod("low-q", "gpu-low"), NS)
        wait_for("low-q bound", lambda: "low-q" in _bound(h), 60, 0.5)

        def used() -> int | None:
            status = h.admin.get(GPUQUOTAS, "gpus", NS).get("status") or {}
            return next((lim["used"]["cards"] for lim in status.get("limits") or []), None)

        wait_for("the quota to count low-q", lambda: used() == 1, 60, 0.5)
        h.admin.create(PODS, _pod("urgent-q", "gpu-high"), NS)
        wait_for("urgent-q bound", lambda: "urgent-q" in _bound(h), 120, 0.5,
                 lambda: str(_failed(h, "urgent-q")))  # fmt: skip
        assert "low-q" not in _bound(h)
        [preempting] = [e for e in _events(h, "TesseraPreempting")
                        if e["involvedObject"]["name"] == "urgent-q"]  # fmt: skip
        assert preempting["message"] == f"evicting for quota room: {NS}/low-q (priority 10)"
    finally:
        h.admin.delete(GPUQUOTAS, "gpus", NS)
