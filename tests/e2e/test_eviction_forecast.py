"""The preemptor's forecast of the Eviction API holds against the real one.

GPU preemption chooses only victims the Eviction API would let go (BudgetBook.refusal
over Disruptee.of, read from the pods and budgets as the API server serves them); a wrong
forecast either evicts a first victim for nothing or passes over one that could go. Here
pods kwok runs, some made unready and one never bound, sit under budgets of each kind
(minAvailable, maxUnavailable, a percentage, AlwaysAllow for unready pods, none to
spare); the forecast made from one read, spending as a preemption plan does, must name
exactly the evictions the API server then takes, and FakeKube must take the same ones.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import pytest

from tessera.kube import NODES, PODS, ApiError, FakeKube
from tessera.kube.client import KubeClient
from tessera.kube.kinds import POD_DISRUPTION_BUDGETS, Kind
from tessera.model.clusterspec import synthetic_nodes
from tessera.scheduler.budgets import BudgetBook, Disruptee
from tessera.testenv import TestEnv
from tests.e2e.wait import wait_for

pytestmark = pytest.mark.e2e

# Per group: the budget's spec, then how many of its pods run Ready, run unready, and
# wait unbound (phase Pending).
GROUPS: dict[str, tuple[dict[str, Any], int, int, int]] = {
    "tight": ({"minAvailable": 2}, 2, 1, 0),  # none to spare; the unready pod goes
    "short": ({"minAvailable": 3}, 2, 1, 1),  # fewer healthy than wanted: only Pending goes
    "always": ({"minAvailable": 3, "unhealthyPodEvictionPolicy": "AlwaysAllow"}, 2, 1, 0),
    "spare": ({"minAvailable": 0}, 1, 1, 0),  # one disruption, taken by the first
    # No controller to count expected pods from: the disruption controller allows none.
    "max": ({"maxUnavailable": 1}, 2, 1, 0),
    "percent": ({"minAvailable": "50%"}, 2, 2, 0),
}
CRON_JOBS = Kind("batch/v1", "CronJob", "cronjobs", namespaced=True)  # only this test's
# Two pods a controller without a scale owns, under maxUnavailable: the disruption
# controller cannot count them and allows no disruption. A Job is the common such owner,
# but kwok completes a Job's pods at once (and a finished pod is no budget's), so these
# name a suspended CronJob, which has no scale either.
JOB_BUDGET = {"maxUnavailable": 1}
BUDGETS = {**{group: spec for group, (spec, *_) in GROUPS.items()}, "job": JOB_BUDGET}
GOES = {"forecast-tight-2", "forecast-short-p0", "forecast-always-2", "forecast-spare-0"}


def _pods(node: str) -> list[dict[str, Any]]:
    out = []
    for group, (_, ready, unready, pending) in GROUPS.items():
        names = [(f"forecast-{group}-{i}", True) for i in range(ready + unready)]
        names += [(f"forecast-{group}-p{i}", False) for i in range(pending)]
        for name, bound in names:
            spec: dict[str, Any] = {
                "schedulerName": "nobody",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "x"}],
                **({"nodeName": node} if bound else {}),
            }
            out.append({"metadata": {"name": name, "labels": {"app": group}}, "spec": spec})
    return out


def _owned_pods(api: KubeClient, node: str) -> list[dict[str, Any]]:
    """Two pods on ``node`` whose controller is a new, suspended CronJob."""
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
    spec = {"schedule": "0 0 1 1 *", "suspend": True,
            "jobTemplate": {"spec": {"template": template}}}  # fmt: skip
    owner = api.create(CRON_JOBS, {"metadata": {"name": "forecast-cron"}, "spec": spec},
                       "default")["metadata"]  # fmt: skip
    ref = {"apiVersion": "batch/v1", "kind": "CronJob", "name": owner["name"],
           "uid": owner["uid"], "controller": True}  # fmt: skip
    pods = []
    for i in range(2):
        pod = {"metadata": {"name": f"forecast-job-{i}", "labels": {"app": "job"},
                            "ownerReferences": [ref]},
               "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                        "containers": [{"name": "c", "image": "x"}]}}  # fmt: skip
        pods.append(api.create(PODS, pod, "default"))
    return pods


def _unready(api: KubeClient) -> None:
    """The last ``unready`` running pods of each group lose Ready (kwok leaves a running
    pod's conditions alone)."""
    for group, (_, ready, unready, _) in GROUPS.items():
        for i in range(ready, ready + unready):
            name = f"forecast-{group}-{i}"
            conditions = [
                dict(c, status="False") if c.get("type") in ("Ready", "ContainersReady") else c
                for c in api.get(PODS, name, "default")["status"]["conditions"]
            ]
            patch = {"status": {"conditions": conditions}}
            api.merge_patch(PODS, name, patch, "default", subresource="status")


def _counted(api: KubeClient) -> list[dict[str, Any]] | None:
    """The budgets, once their controller has counted each with its unready pods (and
    failed to count the CronJob's)."""
    items = [b for b in api.list(POD_DISRUPTION_BUDGETS, "default").items
             if b["metadata"]["name"] in BUDGETS]  # fmt: skip
    for b in items:
        name, status = b["metadata"]["name"], b.get("status") or {}
        reasons = [c.get("reason") for c in status.get("conditions") or []]
        if name == "job":
            counted = "SyncFailed" in reasons
        else:
            ready = GROUPS[name][1]
            counted = (status.get("observedGeneration"), status.get("currentHealthy")) == (1, ready)
        if not counted:
            return None
    return items if len(items) == len(BUDGETS) else None


def _evicted(kube: Any, names: list[str]) -> set[str]:
    """Evict each pod in order (by its UID there); the names taken. Every refusal is the
    budget's 429."""
    taken = set()
    for name in names:
        try:
            kube.evict("default", name, kube.get(PODS, name, "default")["metadata"]["uid"])
        except ApiError as exc:
            assert (exc.status, exc.reason) == (429, "TooManyRequests"), (name, exc)
        else:
            taken.add(name)
    return taken


def test_the_forecast_names_the_evictions_the_api_server_takes(testenv: TestEnv) -> None:
    api = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    (inv,) = synthetic_nodes(1, 0, "A100", prefix="forecast")
    testenv.create_gpu_nodes([inv])
    made = _pods(inv.name)
    try:
        for pod in made:
            api.create(PODS, pod, "default")
        made += _owned_pods(api, inv.name)
        bound = [p["metadata"]["name"] for p in made if p["spec"].get("nodeName")]
        wait_for("kwok runs the bound pods",
                 lambda: all(api.get(PODS, n, "default")["status"].get("phase") == "Running"
                             for n in bound))  # fmt: skip
        _unready(api)
        for group, spec in BUDGETS.items():
            body = {"metadata": {"name": group},
                    "spec": {**spec, "selector": {"matchLabels": {"app": group}}}}  # fmt: skip
            api.create(POD_DISRUPTION_BUDGETS, body, "default")
        budgets = wait_for("the disruption controller counts the budgets",
                           lambda: _counted(api))  # fmt: skip
        pods = sorted((api.get(PODS, p["metadata"]["name"], "default") for p in made),
                      key=lambda p: p["metadata"]["name"])  # fmt: skip
        book = BudgetBook()
        book.replace(budgets)
        spent: Counter[str] = Counter()
        order = [p["metadata"]["name"] for p in pods]
        forecast = {
            name: book.refusal(Disruptee.of(f"default/{name}", pod), spent)
            for name, pod in zip(order, pods, strict=True)
        }
        fake = FakeKube()
        for pod in pods:
            fake.seed(PODS, pod, "default")
        for budget in budgets:
            fake.seed(POD_DISRUPTION_BUDGETS, budget, "default")
        taken = _evicted(api, order)
    finally:
        with contextlib.suppress(ApiError):
            api.delete(CRON_JOBS, "forecast-cron", "default")
        for p in made:
            with contextlib.suppress(ApiError):
                api.delete(PODS, p["metadata"]["name"], "default")
        for group in BUDGETS:
            with contextlib.suppress(ApiError):
                api.delete(POD_DISRUPTION_BUDGETS, group, "default")
        with contextlib.suppress(ApiError):
            api.delete(NODES, inv.name)
    assert taken == GOES
    assert {name for name, why in forecast.items() if not why} == taken
    for name in ("forecast-max-0", "forecast-percent-0"):  # bare pods: no expected count
        assert "counts no expected pods" in forecast[name]
    jobs = [why for name, why in forecast.items() if name.startswith("forecast-job-")]
    assert len(jobs) == 2
    assert all("cannot count it (cronjobs.batch does not implement" in why for why in jobs)
    assert _evicted(fake, order) == taken
