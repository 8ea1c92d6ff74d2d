"""Helpers for the scheduler's unit tests: a FakeKube with GPU nodes, pods and an app."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tessera.kube import GPUQUOTAS, NODES, PODS, FakeKube
from tessera.model.annotations import INVENTORY, encode_inventory
from tessera.model.clusterspec import make_cards
from tessera.scheduler.app import SchedulerApp
from tessera.scheduler.config import SchedulerConfig
from tests.unit._wait import eventually

SCHED = "tessera-scheduler"


def node_obj(
    name: str, count: int = 2, model: str = "A100", cpu: str = "64", sick: tuple[int, ...] = ()
) -> dict[str, Any]:
    """A GPU node; the cards at the indices ``sick`` are reported unhealthy."""
    cards = tuple(
        replace(c, healthy=False) if i in sick else c
        for i, c in enumerate(make_cards(name, count, model))
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {INVENTORY: encode_inventory(cards)}},
        "status": {"allocatable": {"cpu": cpu, "memory": "256Gi"}},
    }


def pod_obj(
    name: str,
    gpu: int | None = 1,
    memory: int | None = None,
    cores: int | None = None,
    annotations: dict[str, str] | None = None,
    ns: str = "default",
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if gpu is not None:
        limits["tessera.io/gpu"] = str(gpu)
    if memory is not None:
        limits["tessera.io/gpu-memory"] = str(memory)
    if cores is not None:
        limits["tessera.io/gpu-cores"] = str(cores)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": SCHED,
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}],
        },
    }


def prio_pod(name: str, priority: int, **kw: Any) -> dict[str, Any]:
    p = pod_obj(name, **kw)
    p["spec"]["priority"] = priority  # as the API server sets it from the PriorityClass
    return p


def running_pod(name: str, priority: int, app: str, **kw: Any) -> dict[str, Any]:
    """A pod as the kubelet reports it once started: Running and Ready, labelled."""
    p = prio_pod(name, priority, **kw)
    p["metadata"]["labels"] = {"app": app}
    p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return p


def pdb(name: str, app: str, allowed: int) -> dict[str, Any]:
    """A budget as its controller has counted it: two healthy pods, ``allowed`` spare."""
    return {
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": app}}},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": 2,
            "desiredHealthy": 2 - allowed,
            "expectedPods": 2,
            "observedGeneration": 1,
        },
    }


def gpu_quota(ns: str, *limits: dict[str, Any], name: str = "gpus") -> dict[str, Any]:
    return {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "GpuQuota",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"limits": list(limits)},
    }


def add_quota(w: World, obj: dict[str, Any]) -> None:
    """Create a GpuQuota and wait until the extender holds it."""
    ns = obj["metadata"]["namespace"]
    w.kube.create(GPUQUOTAS, obj, ns)
    key = f"{ns}/{obj['metadata']['name']}"
    eventually(lambda: w.app.state.quotas.book.get(ns, key) is not None)


def scraped(w: World, name: str, **labels: str) -> float:
    """The value of sample ``name`` with ``labels`` in the app's /metrics text, as
    Prometheus would read it; 0 when it is not there."""
    text = w.app.metrics.exposition().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def binding_args(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """kube-scheduler's ExtenderBindingArgs for binding ``pod`` to ``node``."""
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}  # fmt: skip


class World:
    """A FakeKube plus a synced SchedulerApp (no leader election unless asked)."""

    def __init__(
        self, nodes: list[dict[str, Any]], kube: FakeKube | None = None, **config: Any
    ) -> None:
        self.kube = kube or FakeKube()
        for n in nodes:
            self.kube.create(NODES, n)
        config.setdefault("leader_elect", False)
        config.setdefault("watch_timeout_s", 1)
        self.app = SchedulerApp(SchedulerConfig(**config), self.kube)
        self.app.start()
        assert self.app.wait_synced(5)

    def close(self) -> None:
        self.app.stop()
        self.kube.close()

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.kube.seed(PODS, pod, pod["metadata"]["namespace"])

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = self.app.handle("POST", f"/{verb}", raw)
        return r.status, json.loads(r.body)

    def filter(self, pod: dict[str, Any], nodes: list[str] | None = None) -> dict[str, Any]:
        names = nodes if nodes is not None else sorted(self.app.state.cluster.node_names())
        status, out = self.post("filter", {"Pod": pod, "NodeNames": names})
        assert status == 200, out
        return dict(out)

    def bind(self, pod: dict[str, Any], node: str) -> dict[str, Any]:
        status, out = self.post("bind", binding_args(pod, node))
        assert status == 200, out
        return dict(out)

    def schedule(self, pod: dict[str, Any]) -> str | None:
        """filter + bind like the scheduler in narrow mode; the node, or None."""
        out = self.filter(pod)
        if not out["NodeNames"]:
            return None
        node = out["NodeNames"][0]
        assert self.bind(pod, node)["Error"] == ""
        return str(node)
