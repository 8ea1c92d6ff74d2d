"""The pods bound to this node, as the allocator needs them (pure translation + ports).

``pod_info`` turns a Pod as the API server sends it (a JSON dict) into a ``PodInfo``:
its GPU containers in the order kubelet allocates them (init containers, then app
containers, each in spec order) and its decoded ``tessera.io/assignment`` or the reason
it cannot be used (missing, malformed, stale). The ports below are what the allocator
asks of the outside; ``kube_source.py`` implements them against the API server and the
tests use in-memory fakes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.errors import FormatError
from tessera.model import annotations as ann
from tessera.model.types import Assignment, ContainerAssignment

__all__ = ["GpuContainer", "PodInfo", "pod_info"]


@dataclass(frozen=True, slots=True)
class GpuContainer:
    name: str
    init: bool
    count: int  # the container's limit of the plugin's resource: its number of cards


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    node: str
    created: str  # RFC 3339 (sorts as text); kubelet admits oldest first
    containers: tuple[GpuContainer, ...]
    assignment: Assignment | None
    problem: str = ""  # why the assignment cannot be used; "" when it can
    terminal: bool = False
    # Runtime container ID (without the "containerd://" scheme) -> container name, for
    # the containers kubelet has started: how a process on a card is traced to its pod.
    container_ids: tuple[tuple[str, str], ...] = ()
    # The ResourceClaims the pod uses (in its namespace): named in its spec, or made
    # from a template and named in its status; and, per container, the ones it uses.
    claims: tuple[str, ...] = ()
    container_claims: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def container(self, name: str) -> ContainerAssignment | None:
        if self.assignment is None:
            return None
        for c in self.assignment.containers:
            if c.name == name:
                return c
        return None


def _count(resources: Mapping[str, Any] | None, resource: str) -> int:
    if not resources:
        return 0
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(resource)
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def pod_info(obj: Mapping[str, Any], resource: str, cards: frozenset[str]) -> PodInfo:
    """A Pod dict as the allocator sees it; ``cards`` are the UUIDs of this node's cards."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ns = meta.get("namespace", "default")
    name = meta.get("name", "")
    node = spec.get("nodeName") or ""
    containers: list[GpuContainer] = []
    for init, field in ((True, "initContainers"), (False, "containers")):
        for c in spec.get(field) or []:
            n = _count(c.get("resources"), resource)
            if n > 0:
                containers.append(GpuContainer(c.get("name", ""), init, n))
    text = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
    assignment: Assignment | None = None
    problem = ""
    if text is None:
        if containers:
            problem = (
                f"pod {ns}/{name} asks for {resource} but has no {ann.ASSIGNMENT} "
                "annotation: it was not placed by the Tessera scheduler"
            )
    else:
        try:
            assignment = ann.decode_assignment(f"{ns}/{name}", text)
        except FormatError as exc:
            problem = str(exc)
    if assignment is not None:
        problem = _stale(ns, name, node, assignment, containers, cards)
    claim_names = _claim_names(spec, status)
    return PodInfo(
        uid=meta.get("uid", ""),
        namespace=ns,
        name=name,
        node=node,
        created=meta.get("creationTimestamp") or "",
        containers=tuple(containers),
        assignment=assignment,
        problem=problem,
        terminal=status.get("phase") in ("Succeeded", "Failed"),
        container_ids=_container_ids(status),
        claims=tuple(sorted(set(claim_names.values()))),
        container_claims=_container_claims(spec, claim_names),
    )


def _claim_names(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, str]:
    """The pod's claim entries (spec.resourceClaims[].name) -> ResourceClaim names."""
    out: dict[str, str] = {}
    for entry in [
        *(spec.get("resourceClaims") or []),
        *(status.get("resourceClaimStatuses") or []),
    ]:
        if isinstance(entry, Mapping) and entry.get("name") and entry.get("resourceClaimName"):
            out[str(entry["name"])] = str(entry["resourceClaimName"])
    return out


def _container_claims(
    spec: Mapping[str, Any], claim_names: Mapping[str, str]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out = []
    for field in ("initContainers", "containers"):
        for c in spec.get(field) or []:
            refs = (c.get("resources") or {}).get("claims") or []
            names = {claim_names[str(r.get("name"))] for r in refs
                     if isinstance(r, Mapping) and str(r.get("name")) in claim_names}  # fmt: skip
            if names:
                out.append((str(c.get("name", "")), tuple(sorted(names))))
    return tuple(out)


def _container_ids(status: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    out = []
    for field in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(field) or []:
            cid = str(cs.get("containerID") or "")
            if "://" in cid and cs.get("name"):
                out.append((cid.split("://", 1)[1], str(cs["name"])))
    return tuple(out)


def _stale(
    ns: str,
    name: str,
    node: str,
    a: Assignment,
    containers: list[GpuContainer],
    cards: frozenset[str],
) -> str:
    what = f"pod {ns}/{name}: annotation {ann.ASSIGNMENT}"
    if node and a.node != node:
        return f"{what} is stale: it places the pod on node {a.node}, but it is bound to {node}"
    by_name = {c.name: c for c in a.containers}
    for c in containers:
        ca = by_name.get(c.name)
        if ca is None:
            return f"{what} has no entry for container {c.name!r}, which asks for GPUs"
        if len(ca.slices) != c.count:
            return (
                f"{what} gives container {c.name!r} {len(ca.slices)} card(s), "
                f"but it asks for {c.count}"
            )
        missing = [s.uuid for s in ca.slices if s.uuid not in cards]
        if missing and cards:
            return (
                f"{what} is stale: container {c.name!r} is assigned card(s) {missing} "
                "that are not on this node"
            )
    return ""
