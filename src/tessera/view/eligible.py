"""Which nodes kube-scheduler's own filters would offer a pod, and why not the others
(pure): ``kubectl tessera why`` weighs a pod's cards only on those.

The four filters that decide by the pod's spec and the node's labels alone, as
kube-scheduler applies them (its plugins NodeUnschedulable, NodeName, NodeAffinity and
TaintToleration): a cordoned node, ``spec.nodeName``, ``spec.nodeSelector`` and the
required node affinity, and NoSchedule / NoExecute taints the pod does not tolerate.
What depends on other pods (ports, topology spread, inter-pod affinity) and the CPU and
memory kube-scheduler counts are left to kube-scheduler, whose events ``why`` prints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ineligible"]

Obj = Mapping[str, Any]

# kube-scheduler's NodeUnschedulable lets a pod that tolerates this taint onto a
# cordoned node (the taint itself is what `kubectl cordon` implies).
_UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def ineligible(pod: Obj, nodes: Iterable[Obj]) -> dict[str, str]:
    """Node name -> why kube-scheduler's own filters would not offer it to ``pod``; the
    nodes not named would be offered."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    out = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        why = _why_not(spec, tolerations, node, name)
        if why:
            out[name] = why
    return out


def _why_not(spec: Obj, tolerations: list[Obj], node: Obj, name: str) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not _tolerated(_UNSCHEDULABLE, tolerations):
        return "cordoned (unschedulable)"
    wanted = spec.get("nodeName")
    if wanted and wanted != name:
        return f"the pod names node {wanted}"
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))  # fmt: skip
    terms = (required or {}).get("nodeSelectorTerms") or []
    if required is not None and not _any_term(terms, labels, name):
        return "required node affinity does not match"
    for taint in node_spec.get("taints") or []:
        blocking = taint.get("effect") in ("NoSchedule", "NoExecute")
        if blocking and not _tolerated(taint, tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"taint {taint.get('key')}{value}:{taint.get('effect')} not tolerated"
    return ""


def _any_term(terms: list[Obj], labels: Mapping[str, str], name: str) -> bool:
    """nodeSelectorTerms are ORed; a term's expressions and fields are ANDed; a term with
    neither matches nothing (as the API defines it)."""
    for term in terms:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_matches(e, labels.get(e.get("key", ""))) for e in exprs) and all(
            _matches(f, name if f.get("key") == "metadata.name" else None) for f in fields
        ):
            return True
    return False


def _matches(expr: Obj, value: str | None) -> bool:
    op = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _tolerated(taint: Obj, tolerations: list[Obj]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False
