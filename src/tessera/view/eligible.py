"""Which nodes kube-scheduler's own filters would offer a pod, and why not the others
(pure): ``kubectl tessera why`` weighs a pod's cards only on those.

The four filters that decide by the pod's spec and the node's labels alone, as
kube-scheduler applies them (its plugins NodeUnschedulable, NodeName, NodeAffinity and
TaintToleration): a cordoned node, ``spec.nodeName``, ``spec.nodeSelector`` and the
required node affinity, and NoSchedule / NoExecute taints the pod does not tolerate.
Given the pods placed, also three that depend on them (NodePorts, InterPodAffinity and
PodTopologySpread): a host port another pod on the node holds; required pod affinity
and anti-affinity, the pod's own and the anti-affinity of the pods already placed; and
the pod's topology spread constraints that may not be broken (``whenUnsatisfiable:
DoNotSchedule``). A term that selects namespaces by label (``namespaceSelector``) is
weighed with the namespaces' labels, when they are given. When not, an anti-affinity
term is weighed by the namespaces it names (and an empty selector's every namespace),
and a pod affinity term with a selector that is not empty is left out. The CPU
and memory kube-scheduler counts are left to kube-scheduler, whose events ``why`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tessera.kube.port import object_name
from tessera.kube.selectors import selects

__all__ = ["ineligible", "placed_form"]

Obj = Mapping[str, Any]

# kube-scheduler's NodeUnschedulable lets a pod that tolerates this taint onto a
# cordoned node (the taint itself is what `kubectl cordon` implies).
_UNSCHEDULABLE = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def ineligible(
    pod: Obj,
    nodes: Iterable[Obj],
    placed: Iterable[Obj] = (),
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """Node name -> why kube-scheduler's own filters would not offer it to ``pod``; the
    nodes not named would be offered. ``placed``: the cluster's pods (those bound and not
    finished count), for ports and inter-pod affinity. ``namespace_labels``: each
    namespace's labels, for affinity terms with a ``namespaceSelector`` (None: unknown;
    see the module's docstring)."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    nodes = list(nodes)
    labels_of = {object_name(n): (n.get("metadata") or {}).get("labels") or {} for n in nodes}
    me = _uid(pod)
    others = [p for p in placed if _bound(p) in labels_of and _uid(p) != me]
    on_node: dict[str, list[Obj]] = {}
    for p in others:
        on_node.setdefault(_bound(p), []).append(p)
    affinity = _affinity_rule(pod, labels_of, others, namespace_labels)
    spread = _spread_rule(pod, nodes, others)
    out = {}
    for node in nodes:
        name = object_name(node)
        why = (
            _why_not(spec, tolerations, node, name)
            or _port_taken(spec, on_node.get(name, []))
            or affinity(name)
            or spread(name)
        )
        if why:
            out[name] = why
    return out


def placed_form(pod: Obj) -> Obj | None:
    """What ``ineligible`` reads of a placed pod, or None for a pod that holds no place
    (unbound or finished): its name, namespace, uid, labels and deletion mark, its node,
    its host ports and its required anti-affinity. ``kubectl tessera why`` keeps only
    this of each pod it lists: 200,000 whole pod objects are gigabytes."""
    node = _bound(pod)
    if not node:
        return None
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "labels", "deletionTimestamp")
            if k in meta}  # fmt: skip
    out_spec: dict[str, Any] = {"nodeName": node}
    ports = [{k: p[k] for k in ("hostIP", "protocol", "hostPort") if k in p}
             for c in spec.get("containers") or [] for p in c.get("ports") or []
             if p.get("hostPort")]  # fmt: skip
    if ports:
        out_spec["containers"] = [{"ports": ports}]
    anti = (spec.get("affinity") or {}).get("podAntiAffinity")
    if anti:
        out_spec["affinity"] = {"podAntiAffinity": anti}
    return {"metadata": kept, "spec": out_spec}


def _uid(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _bound(pod: Obj) -> str:
    """The node of a pod that holds its place there (bound, not finished), else ""."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return ""
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _host_ports(spec: Obj) -> list[tuple[str, str, int]]:
    return [
        (str(p.get("hostIP") or "0.0.0.0"), str(p.get("protocol") or "TCP"), int(p["hostPort"]))
        for c in spec.get("containers") or []
        for p in c.get("ports") or []
        if p.get("hostPort")
    ]


def _port_taken(spec: Obj, on_node: list[Obj]) -> str:
    """A host port of the pod that a pod on the node holds (an address of 0.0.0.0 meets
    every address, as kube-scheduler's NodePorts has it)."""
    wanted = _host_ports(spec)
    if not wanted:
        return ""
    for other in on_node:
        for ip, proto, port in _host_ports(other.get("spec") or {}):
            for want_ip, want_proto, want_port in wanted:
                same_ip = "0.0.0.0" in (ip, want_ip) or ip == want_ip
                if (proto, port) == (want_proto, want_port) and same_ip:
                    return f"host port {port}/{proto} held by {_key(other)}"
    return ""


def _terms(pod: Obj, kind: str) -> list[Obj]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get(kind) or {}
    return list(affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])


class _Terms:
    """Which pods an affinity term selects, as kube-scheduler's InterPodAffinity reads
    it: in the namespaces it names, or those its ``namespaceSelector`` selects (an
    empty one: every namespace), or, naming neither, the owner's own; and by its label
    selector. With the namespaces' labels unknown, a selector that is not empty selects
    none of them: what the term selects is then known from below only."""

    def __init__(self, namespace_labels: Mapping[str, Mapping[str, str]] | None) -> None:
        self.namespace_labels = namespace_labels

    def exact(self, term: Obj) -> bool:
        """Whether ``selects`` is exact for ``term``: only a selector that is not empty,
        with the namespaces' labels unknown, leaves it short. Anti-affinity may be
        weighed short (a node it keeps the pod off stays off); pod affinity may not."""
        by_label = term.get("namespaceSelector")
        return by_label is None or self.namespace_labels is not None or _selects_all(by_label)

    def selects(self, term: Obj, owner: Obj, pod: Obj) -> bool:
        """Whether ``term`` (of ``owner``) selects ``pod``."""
        meta = pod.get("metadata") or {}
        ns = meta.get("namespace")
        named = term.get("namespaces") or []
        by_label = term.get("namespaceSelector")
        if not named and by_label is None:
            named = [(owner.get("metadata") or {}).get("namespace")]
        in_scope = ns in named or (
            by_label is not None
            and (
                _selects_all(by_label)
                if self.namespace_labels is None
                else selects(by_label, self.namespace_labels.get(str(ns), {}))
            )
        )
        return in_scope and selects(term.get("labelSelector"), meta.get("labels") or {})


def _selects_all(selector: Obj) -> bool:
    """An empty label selector: it selects everything, whatever the labels."""
    return not selector.get("matchLabels") and not selector.get("matchExpressions")


def _affinity_rule(pod: Obj, labels_of: Mapping[str, Mapping[str, str]], others: list[Obj],
                   namespace_labels: Mapping[str, Mapping[str, str]] | None,
                   ) -> Callable[[str], str]:  # fmt: skip
    """Why required inter-pod affinity or anti-affinity keeps ``pod`` off a node. The
    terms are matched against the pods once; a node is then a lookup of its topology
    values (a pass over every pod for each node would be minutes at 5,000 nodes)."""

    def domains(key: str, pods: Iterable[Obj]) -> dict[str, str]:
        """Topology value -> a pod of ``pods`` in it (the first, for the message)."""
        out: dict[str, str] = {}
        for o in pods:
            value = labels_of[_bound(o)].get(key)
            if value is not None:
                out.setdefault(value, _key(o))
        return out

    terms = _Terms(namespace_labels)
    rules: list[tuple[str, dict[str, str], str]] = []  # (key, domains, what keeps it off)
    for term in _terms(pod, "podAntiAffinity"):
        key = str(term.get("topologyKey") or "")
        taken = domains(key, (o for o in others if terms.selects(term, pod, o)))
        rules.append((key, taken, "pod anti-affinity: "))
    theirs: dict[str, dict[str, str]] = {}  # the placed pods' anti-affinity, by key
    for other in others:
        for term in _terms(other, "podAntiAffinity"):
            if terms.selects(term, other, pod):
                key = str(term.get("topologyKey") or "")
                for value, who in domains(key, [other]).items():
                    theirs.setdefault(key, {}).setdefault(value, who)
    rules += [(key, taken, "the anti-affinity of ") for key, taken in theirs.items()]
    wanted: list[tuple[str, dict[str, str]]] = []
    for term in _terms(pod, "podAffinity"):
        if not terms.exact(term):
            continue
        key = str(term.get("topologyKey") or "")
        matching = [o for o in others if terms.selects(term, pod, o)]
        if matching or not terms.selects(term, pod, pod):  # else the first of its group
            wanted.append((key, domains(key, matching)))

    def why(node: str) -> str:
        labels = labels_of[node]
        for key, taken, what in rules:
            if labels.get(key) in taken:
                return f"{what}{taken[labels[key]]} in its {key}"
        for key, present in wanted:
            if labels.get(key) not in present:
                return f"pod affinity: no pod it wants in its {key}"
        return ""

    return why


def _spread_rule(pod: Obj, nodes: list[Obj], others: list[Obj]) -> Callable[[str], str]:
    """Why the pod's topology spread constraints keep it off a node, counted as
    kube-scheduler's PodTopologySpread filter counts (v1.36): only constraints with
    ``whenUnsatisfiable: DoNotSchedule``; a node lacking any of their topology keys is
    out; the pods counted are those of the pod's namespace its selector picks (with
    ``matchLabelKeys`` taken from its own labels), not terminating, on nodes that have
    every key and pass its node selector and affinity (``nodeAffinityPolicy: Honor``,
    the default) and, with ``nodeTaintsPolicy: Honor``, whose taints it tolerates. A
    node is out when its domain's count, plus one if the pod matches itself, passes the
    emptiest domain's by more than ``maxSkew`` (the emptiest counting 0 while there are
    fewer domains than ``minDomains``)."""
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    constraints = [c for c in spec.get("topologySpreadConstraints") or []
                   if c.get("whenUnsatisfiable") == "DoNotSchedule"]  # fmt: skip
    if not constraints:
        return lambda name: ""
    own = meta.get("labels") or {}
    tolerations = spec.get("tolerations") or []
    keys = [str(c.get("topologyKey", "")) for c in constraints]
    labels_of = {object_name(n): (n.get("metadata") or {}).get("labels") or {} for n in nodes}
    complete = [n for n in nodes if all(k in labels_of[object_name(n)] for k in keys)]
    rules = []
    for c, key in zip(constraints, keys, strict=True):
        selector = dict(c.get("labelSelector") or {})
        extra = [{"key": k, "operator": "In", "values": [own[k]]}
                 for k in c.get("matchLabelKeys") or [] if k in own]  # fmt: skip
        if extra and c.get("labelSelector") is not None:
            selector["matchExpressions"] = [*(selector.get("matchExpressions") or []), *extra]
        selected = selector if c.get("labelSelector") is not None else None
        honour_taints = c.get("nodeTaintsPolicy") == "Honor"
        ignore_affinity = c.get("nodeAffinityPolicy") == "Ignore"
        counted = {
            object_name(n)
            for n in complete
            if (
                ignore_affinity
                or not _affinity_why(spec, labels_of[object_name(n)], object_name(n))
            )
            and (not honour_taints or not _taint_why(n, tolerations))
        }
        counts = {labels_of[n][key]: 0 for n in counted}
        for p in others:
            if (
                _bound(p) in counted
                and (p.get("metadata") or {}).get("namespace") == meta.get("namespace")
                and not (p.get("metadata") or {}).get("deletionTimestamp")
                and selects(selected, (p.get("metadata") or {}).get("labels") or {})
            ):
                counts[labels_of[_bound(p)][key]] += 1
        least = min(counts.values(), default=0)
        if len(counts) < int(c.get("minDomains") or 1):
            least = 0
        rules.append((key, int(c.get("maxSkew") or 1), counts, least,
                      1 if selects(selected, own) else 0))  # fmt: skip

    def why(name: str) -> str:
        labels = labels_of.get(name, {})
        missing = next((k for k in keys if k not in labels), None)
        if missing is not None:
            return f"topology spread: the node has no {missing} label"
        for key, max_skew, counts, least, me in rules:
            have = counts.get(labels[key], 0)
            if have + me - least > max_skew:
                return (
                    f"topology spread: {key}={labels[key]} has {have} matching pods, the "
                    f"emptiest {least} (maxSkew {max_skew})"
                )
        return ""

    return why


def _why_not(spec: Obj, tolerations: list[Obj], node: Obj, name: str) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable") and not _tolerated(_UNSCHEDULABLE, tolerations):
        return "cordoned (unschedulable)"
    wanted = spec.get("nodeName")
    if wanted and wanted != name:
        return f"the pod names node {wanted}"
    return _affinity_why(spec, labels, name) or _taint_why(node, tolerations)


def _affinity_why(spec: Obj, labels: Mapping[str, str], name: str) -> str:
    """Why the node selector or the required node affinity keeps the pod off a node."""
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))  # fmt: skip
    terms = (required or {}).get("nodeSelectorTerms") or []
    if required is not None and not _any_term(terms, labels, name):
        return "required node affinity does not match"
    return ""


def _taint_why(node: Obj, tolerations: list[Obj]) -> str:
    """The first NoSchedule or NoExecute taint of the node the pod does not tolerate."""
    for taint in (node.get("spec") or {}).get("taints") or []:
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
