"""Checks made from the API server alone: the annotations say who holds which card, its
own request counts what was written."""

from __future__ import annotations

import re
from typing import Any

import urllib3

from tessera.cluster import ClusterState
from tessera.errors import PlacementError
from tessera.kube import EVENTS, NODES, Obj
from tessera.kube.client import KubeClient
from tessera.model.annotations import ASSIGNMENT, decode_assignment
from tessera.model.podspec import Compat, parse_pod
from tessera.model.types import Assignment, PodRequest
from tessera.placement.fit import filter_nodes
from tessera.scheduler.state import SchedulerState

COMPAT = Compat(hami=True, gpu_manager=True)


def request_of(pod: Obj) -> PodRequest:
    req = parse_pod(pod, compat=COMPAT)
    assert req is not None, pod["metadata"]["name"]
    return req


def assignment_of(pod: Obj) -> Assignment | None:
    text = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT)
    if text is None:
        return None
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    return decode_assignment(key, text)


def empty_state(api: KubeClient) -> ClusterState:
    """The GPU nodes as the extender reads them (same decoding), in list order."""
    s = SchedulerState(compat=COMPAT)
    s.replace_nodes(api.list(NODES).items)
    return s.cluster


def book_all(api: KubeClient, pods: list[Obj]) -> tuple[ClusterState, list[str]]:
    """A ClusterState holding every bound pod's annotation; problems found on the way.

    ``ClusterState.assign`` refuses any booking over a card's memory or cores, onto a
    card held whole, or of the wrong count -- so an empty problem list plus a clean
    ``check_invariants`` proves no card is over-committed.
    """
    state = empty_state(api)
    problems = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        node = (pod.get("spec") or {}).get("nodeName")
        assignment = assignment_of(pod)
        name = pod["metadata"]["name"]
        if node and assignment is None:
            problems.append(f"{name}: bound to {node} without an assignment")
            continue
        if not node:
            continue
        assert assignment is not None
        if assignment.node != node:
            problems.append(f"{name}: bound to {node}, assignment says {assignment.node}")
            continue
        try:
            state.assign(request_of(pod), assignment)
        except PlacementError as exc:
            problems.append(f"{name}: {exc}")
    problems.extend(state.check_invariants())
    return state, problems


def fits_now(state: ClusterState, pod: Obj) -> list[str]:
    """The nodes where ``pod`` would fit in ``state`` (empty: it rightly waits)."""
    return filter_nodes(state.snapshot(), request_of(pod)).feasible


def events_by_pod(api: KubeClient, namespace: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in api.list(EVENTS, namespace).items:
        out.setdefault(e["involvedObject"].get("name", ""), []).append(e)
    return out


def api_writes(api: KubeClient) -> dict[str, int]:
    """Writes kube-apiserver has served so far, by verb and resource ("PUT
    resourceslices"), from its own apiserver_request_total."""
    pool = urllib3.PoolManager(ssl_context=api.ssl_context(),
                               server_hostname=api.server_hostname())  # fmt: skip
    resp = pool.request("GET", api.host + "/metrics", headers=api.headers(), timeout=30)
    assert resp.status == 200, resp.status
    out: dict[str, int] = {}
    for line in resp.data.decode().splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if labels.get("verb") not in ("POST", "PUT", "PATCH", "DELETE", "APPLY"):
            continue
        sub = labels.get("subresource", "")
        what = f"{labels['verb']} {labels.get('resource', '')}" + (f"/{sub}" if sub else "")
        out[what] = out.get(what, 0) + round(float(line.rsplit(" ", 1)[1]))
    return out
