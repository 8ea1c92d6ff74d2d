"""GpuQuota on the real control plane: the CRD's rules, the scheduler's one pod write,
and a burst of 500 pods from three namespaces through the real kube-scheduler with the
extender restarted midway -- no namespace's use, read from the annotations, ever passes
its quota; pods over it wait with the quota's reason; a raised quota schedules them."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import pytest

from tessera.kube import GPUQUOTAS, PODS, ApiError, Kind, Obj
from tessera.kube.client import KubeClient
from tessera.kube.kinds import NAMESPACES
from tessera.model.annotations import GPU_MODEL
from tessera.model.quantity import parse_quantity
from tessera.quota.spec import parse_quota
from tessera.quota.usage import Usage, holding
from tests.e2e.scheduler.checks import assignment_of, book_all, events_by_pod
from tests.e2e.scheduler.harness import Harness, PodView, unschedulable
from tests.e2e.scheduler.workload import _pod
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUOTAS = {
    "q-a": [
        {"name": "a100", "models": ["A100"], "memoryMiB": 60000},
        {"name": "t4", "models": ["T4"], "memoryMiB": 40000, "cards": 2},
    ],
    "q-b": [{"name": "a100", "models": ["A100"], "coresPercent": 300}],
    "q-c": [{"name": "pool", "models": ["A100", "T4"], "memoryMiB": 100000, "cards": 3}],
}


def _namespace(h: Harness, name: str) -> str:
    h.admin.create(NAMESPACES, {"metadata": {"name": name}})
    h.ensure_default_service_account(name)
    return name


def _quota(ns: str, limits: list[dict[str, Any]], name: str = "gpus") -> dict[str, Any]:
    return {"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
            "metadata": {"name": name, "namespace": ns}, "spec": {"limits": limits}}  # fmt: skip


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ([], "spec.limits: Invalid value: 0"),
        ([{"name": "a", "models": ["A100"]}], "must cap at least one of memoryMiB, coresPercent"),
        ([{"name": "A_1", "models": ["A100"], "cards": 1}], "spec.limits[0].name"),
        ([{"name": "a", "models": [], "cards": 1}], "spec.limits[0].models"),
        ([{"name": "a", "models": ["A100"], "cards": -1}], "spec.limits[0].cards"),
        ([{"name": "a", "models": ["A100"], "cards": 1},
          {"name": "b", "models": ["T4", "A100"], "cards": 1}], "a card model may be in one limit"),
        ([{"name": "a", "models": ["A100"], "cards": 1},
          {"name": "a", "models": ["T4"], "cards": 1}], "Duplicate value"),
    ],
)  # fmt: skip
def test_the_crd_refuses_malformed_quotas_naming_field_and_rule(
    harness: Harness, limits: list[Any], message: str
) -> None:
    with pytest.raises(ApiError) as info:
        harness.admin.create(GPUQUOTAS, _quota("default", limits, "bad"), "default")
    assert info.value.status == 422, info.value
    assert message in info.value.message, info.value.message


def test_the_scheduler_account_may_change_only_its_two_annotations(harness: Harness) -> None:
    h = harness
    assert h.extender is not None
    sa = KubeClient.from_kubeconfig(str(h.extender.kubeconfig))
    pod = h.admin.create(PODS, _pod("nudge-probe", {"cpu": "10m"}), "default")
    name = pod["metadata"]["name"]
    try:
        for key in ("tessera.io/quota-retry", "tessera.io/preempting"):
            sa.merge_patch(PODS, name, {"metadata": {"annotations": {key: "1"}}}, "default")
        for patch in (
            {"metadata": {"annotations": {"other": "x"}}},
            {"metadata": {"labels": {"app": "x"}}},
            {"spec": {"activeDeadlineSeconds": 5}},
        ):
            with pytest.raises(ApiError) as info:
                sa.merge_patch(PODS, name, patch, "default")
            assert (
                "may change only metadata.annotations[tessera.io/quota-retry] and "
                "metadata.annotations[tessera.io/preempting] of a pod" in info.value.message
            ), info.value.message
    finally:
        h.admin.delete(PODS, name, "default")


def _burst_pods(ns: str, count: int, seed: int) -> list[dict[str, Any]]:
    """Pods that all ask for the quota's models, sized under every single cap (the
    webhook refuses a pod larger than its quota alone)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        model = rng.choice(["A100", "T4", "A100,T4"])
        if rng.random() < 0.8:
            limits = {"tessera.io/gpu-memory": str(rng.choice([2000, 4000, 8000, 12000])),
                      "tessera.io/gpu-cores": str(rng.choice([10, 20, 50]))}  # fmt: skip
        else:
            limits = {"tessera.io/gpu": "1"}
        if ns == "q-b" and "tessera.io/gpu" in limits:
            model = "A100"
        out.append(_pod(f"{ns}-{i:03d}", limits, {GPU_MODEL: model}))
    return out


def _use(h: Harness, pods: list[Obj]) -> dict[str, dict[str, Usage]]:
    """Per namespace and limit, what the bound pods hold -- from their annotations."""
    model_of = {c.uuid: c.model for n in h.nodes for c in n.cards}
    out: dict[str, dict[str, Usage]] = {}
    for ns, limits in QUOTAS.items():
        q = parse_quota(_quota(ns, limits))
        for lim in q.limits:
            total = Usage()
            for p in pods:
                a = assignment_of(p)
                if p["metadata"]["namespace"] != ns or a is None or not p["spec"].get("nodeName"):
                    continue
                for model, u in holding(a, model_of.__getitem__).items():
                    if lim.covers(model):
                        total = total + u
            out.setdefault(ns, {})[lim.name] = total
    return out


def _within(use: dict[str, dict[str, Usage]], quotas: dict[str, list[dict[str, Any]]]) -> None:
    for ns, limits in quotas.items():
        for lim in limits:
            u = use[ns][lim["name"]]
            for key, got in (("memoryMiB", u.memory_mib), ("coresPercent", u.cores_percent),
                             ("cards", u.cards)):  # fmt: skip
                assert key not in lim or got <= lim[key], (ns, lim, u)


def test_burst_of_three_namespaces_stays_inside_their_quotas(harness: Harness) -> None:
    h = harness
    assert h.extender is not None
    views = {}
    for ns, limits in QUOTAS.items():
        _namespace(h, ns)
        h.admin.create(GPUQUOTAS, _quota(ns, limits), ns)
        views[ns] = PodView(h.admin, ns)
    pods = [(ns, p) for i, ns in enumerate(QUOTAS) for p in _burst_pods(ns, 167, seed=i)][:500]

    def everything() -> list[Obj]:
        return [p for v in views.values() for p in v.all()]

    checks = 0
    try:
        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(h.admin.create, PODS, p, ns) for ns, p in pods]
            wait_for("40 pods bound", lambda: sum(
                1 for p in everything() if p["spec"].get("nodeName")) >= 40, 300, 0.05)  # fmt: skip
            h.extender.kill()  # mid-burst: the restarted process rebuilds use from annotations
            time.sleep(2.0)
            h.extender.start()
            for f in futures:
                f.result()

        def settled() -> bool:
            nonlocal checks
            live = everything()
            _within(_use(h, live), QUOTAS)  # at every moment we look, not only at the end
            checks += 1
            return len(live) == 500 and all(
                p["spec"].get("nodeName") or unschedulable(p) for p in live
            )

        wait_for("every pod bound or unschedulable", settled, 420, 1.0)
        live = everything()
        _, problems = book_all(h.admin, live)
        assert problems == []
        waiting = [p for p in live if not p["spec"].get("nodeName")]
        assert len(waiting) > 300  # the quotas, not the 100 nodes, hold them back

        # Each waiting pod says why: its namespace's quota (events are written apart from
        # the pod's condition, so the last may land a moment after it).
        def unexplained() -> list[str]:
            events = {ns: events_by_pod(h.admin, ns) for ns in QUOTAS}
            out = []
            for p in waiting[:60]:
                ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
                messages = [e.get("message", "") for e in events[ns].get(name, [])]
                if not any(f"quota: {ns}/gpus" in m for m in messages):
                    out.append(f"{name}: {messages}")
            return out

        wait_for("every waiting pod's event to name its quota", lambda: not unexplained(),
                 30, 0.5, lambda: str(unexplained()[:3]))  # fmt: skip
        # The status shows the use.
        status = h.admin.get(GPUQUOTAS, "gpus", "q-a").get("status") or {}
        assert [lim["name"] for lim in status.get("limits", [])] == ["a100", "t4"]

        # Raised: q-a's waiting pods are tried again at once (not minutes later) and use
        # the new room -- its A100 use goes past the old cap. (How many pods that is
        # depends on which of them kube-scheduler tries first: a whole card is 40960 MiB.)
        old_cap = QUOTAS["q-a"][0]["memoryMiB"]
        before = _use(h, views["q-a"].all())["q-a"]["a100"].memory_mib
        assert before <= old_cap
        raised = {"q-a": [dict(QUOTAS["q-a"][0], memoryMiB=200000), QUOTAS["q-a"][1]]}
        h.admin.merge_patch(GPUQUOTAS, "gpus", {"spec": {"limits": raised["q-a"]}}, "q-a")
        t0 = time.monotonic()
        ext = h.extender

        def a100_in_a() -> int:
            return _use(h, views["q-a"].all())["q-a"]["a100"].memory_mib

        def explain() -> str:
            nudges = ext.metric("tessera_scheduler_quota_nudges_total")
            return f"nudges: {nudges}, q-a A100 memory: {a100_in_a()} (before {before})"

        wait_for("q-a's pods to use the raised quota", lambda: a100_in_a() > old_cap,
                 60, 0.2, explain=explain)  # fmt: skip
        took = time.monotonic() - t0
        _within(_use(h, everything()), {**QUOTAS, **raised})
        assert took < 60 and checks > 3
    finally:
        for ns, view in views.items():
            for p in view.all():
                h.admin.delete(PODS, p["metadata"]["name"], ns)
            wait_for("the pods to go", lambda v=view: not v.all(), 180, 0.5)  # type: ignore[misc]
            h.admin.delete(GPUQUOTAS, "gpus", ns)
            view.stop()


RESOURCEQUOTAS = Kind("v1", "ResourceQuota", "resourcequotas", True)


def _used(client: KubeClient, ns: str, name: str, resource: str) -> Fraction:
    """What a ResourceQuota's status says is used of one resource, as the controller counted it."""
    used = client.get(RESOURCEQUOTAS, name, ns).get("status", {}).get("used", {})
    return parse_quantity(used.get(resource, "0"), resource).value


def test_resourcequota_and_gpuquota_together(harness: Harness) -> None:
    """ResourceQuota refuses at creation (namespace-wide, as written in the spec);
    GpuQuota holds a pod Pending until its model has room (per model, at placement)."""
    h = harness
    ns = _namespace(h, "q-both")
    h.admin.create(RESOURCEQUOTAS, {"metadata": {"name": "gpu-memory"},
                                    "spec": {"hard": {"requests.tessera.io/gpu-memory": "25000"}}},
                   ns)  # fmt: skip
    h.admin.create(GPUQUOTAS, _quota(ns, [{"name": "a100", "models": ["A100"],
                                           "memoryMiB": 15000}]), ns)  # fmt: skip
    view = PodView(h.admin, ns)
    a100 = {GPU_MODEL: "A100"}
    mem = "tessera.io/gpu-memory"
    try:
        ext = h.extender
        assert ext is not None
        wait_for("the extender to see the quota",
                 lambda: ext.metric("tessera_scheduler_quotas") >= 1, 30, 0.1)  # fmt: skip
        # Until the quota controller has counted the namespace, admission refuses any pod.
        wait_for("the quota controller to count the namespace",
                 lambda: h.admin.get(RESOURCEQUOTAS, "gpu-memory", ns).get("status", {}).get(
                     "hard"), 60, 0.2)  # fmt: skip
        first = h.admin.create(PODS, _pod("first", {mem: "10000"}, a100), ns)
        wait_for("first bound", lambda: bool((view.get("first") or {}).get("spec", {}).get(
            "nodeName")), 60, 0.2)  # fmt: skip
        # Within the ResourceQuota (20000 of 25000), over the GpuQuota on A100: Pending.
        h.admin.create(PODS, _pod("second", {mem: "10000"}, a100), ns)
        wait_for("second unschedulable", lambda: unschedulable(view.get("second") or {}),
                 60, 0.2)  # fmt: skip

        def messages() -> list[str]:
            return [e.get("message", "") for e in events_by_pod(h.admin, ns).get("second", [])]

        wait_for("second's event to name the quota",
                 lambda: any(f"quota: {ns}/gpus a100 (A100)" in m for m in messages()),
                 30, 0.2, lambda: str(messages()))  # fmt: skip
        # Over the ResourceQuota (20000 + 10000 > 25000): refused at creation, by Kubernetes.
        with pytest.raises(ApiError) as info:
            h.admin.create(PODS, _pod("third", {mem: "10000"}, a100), ns)
        assert info.value.status == 403 and "exceeded quota: gpu-memory" in info.value.message
        # A T4 pod: outside the GpuQuota, inside the ResourceQuota... once the Pending pod
        # gives its ResourceQuota share back.
        h.admin.delete(PODS, "second", ns)
        wait_for("second gone", lambda: view.get("second") is None, 60, 0.2)
        # The quota controller recounts usage after the delete, on its own time.
        wait_for("the ResourceQuota to count second out",
                 lambda: _used(h.admin, ns, "gpu-memory", f"requests.{mem}") <= 10000,
                 60, 0.2)  # fmt: skip
        h.admin.create(PODS, _pod("t4", {mem: "10000"}, {GPU_MODEL: "T4"}), ns)
        wait_for("t4 bound", lambda: bool((view.get("t4") or {}).get("spec", {}).get(
            "nodeName")), 60, 0.2)  # fmt: skip
        assert first["metadata"]["name"] == "first"
    finally:
        for p in view.all():
            h.admin.delete(PODS, p["metadata"]["name"], ns)
        wait_for("the pods to go", lambda: not view.all(), 120, 0.5)
        h.admin.delete(GPUQUOTAS, "gpus", ns)
        view.stop()
