"""The nodes kube-scheduler's own filters would offer a pod: cordons, nodeName,
nodeSelector, required node affinity and taints, host ports, required inter-pod
affinity and topology spread, as kube-scheduler reads them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from tessera.view import eligible
from tessera.view.eligible import placed_form


def ineligible(
    pod: dict[str, Any],
    nodes: list[dict[str, Any]],
    placed: Iterable[dict[str, Any]] = (),
    namespace_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """``eligible.ineligible``, judged on the placed pods' objects and again on what
    ``kubectl tessera why`` keeps of them (``placed_form``): every case must agree."""
    placed = list(placed)
    whole = eligible.ineligible(pod, nodes, placed, namespace_labels)
    kept = [f for p in placed if (f := placed_form(p)) is not None]
    assert eligible.ineligible(pod, nodes, kept, namespace_labels) == whole
    return whole


def node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": spec}


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}  # fmt: skip


def test_a_plain_pod_may_go_to_every_schedulable_untainted_node() -> None:
    nodes = [node("a"), node("b", taints=[{"key": "k", "effect": "PreferNoSchedule"}])]
    assert ineligible(pod(), nodes) == {}


def test_a_cordoned_node_is_left_out_unless_the_pod_tolerates_the_cordon() -> None:
    nodes = [node("a", unschedulable=True), node("b")]
    assert ineligible(pod(), nodes) == {"a": "cordoned (unschedulable)"}
    tolerant = pod(tolerations=[{"key": "node.kubernetes.io/unschedulable",
                                 "operator": "Exists", "effect": "NoSchedule"}])  # fmt: skip
    assert ineligible(tolerant, nodes) == {}


def test_node_name_and_node_selector() -> None:
    nodes = [node("a", {"pool": "gpu"}), node("b", {"pool": "cpu"})]
    assert ineligible(pod(nodeName="a"), nodes) == {"b": "the pod names node a"}
    assert ineligible(pod(nodeSelector={"pool": "gpu"}), nodes) == {
        "b": "nodeSelector pool=gpu does not match"
    }


@pytest.mark.parametrize(
    ("expr", "offered"),
    [
        ({"key": "zone", "operator": "In", "values": ["z1", "z2"]}, {"a", "b"}),
        ({"key": "zone", "operator": "NotIn", "values": ["z1"]}, {"b", "c"}),  # no label: in
        ({"key": "zone", "operator": "Exists"}, {"a", "b"}),
        ({"key": "zone", "operator": "DoesNotExist"}, {"c"}),
        ({"key": "gen", "operator": "Gt", "values": ["3"]}, {"b"}),
        ({"key": "gen", "operator": "Lt", "values": ["4"]}, {"a"}),
        ({"key": "gen", "operator": "Gt", "values": ["x"]}, set()),  # not an integer
        ({"key": "zone", "operator": "Nope", "values": ["z1"]}, set()),
    ],
)
def test_required_node_affinity_operators(expr: dict[str, Any], offered: set[str]) -> None:
    nodes = [node("a", {"zone": "z1", "gen": "3"}), node("b", {"zone": "z2", "gen": "4"}),
             node("c", {"gen": "x"})]  # fmt: skip
    left_out = ineligible(pod(affinity=affinity({"matchExpressions": [expr]})), nodes)
    assert {"a", "b", "c"} - left_out.keys() == offered
    assert set(left_out.values()) <= {"required node affinity does not match"}


def test_affinity_terms_are_ored_their_parts_anded_and_an_empty_term_matches_nothing() -> None:
    nodes = [node("a", {"zone": "z1", "gpu": "a100"}), node("b", {"zone": "z1"}), node("c")]
    both = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]},
                                 {"key": "gpu", "operator": "Exists"}]}  # fmt: skip
    named = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]}
    assert ineligible(pod(affinity=affinity(both, named)), nodes).keys() == {"b"}
    assert ineligible(pod(affinity=affinity({})), nodes).keys() == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}, False),
        ({"operator": "Exists"}, True),  # no key: every taint
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_a_gpu_taint_needs_a_matching_toleration(
    toleration: dict[str, Any], tolerated: bool
) -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [node("gpu", taints=[taint])]
    left_out = ineligible(pod(tolerations=[toleration]), nodes)
    why = "taint nvidia.com/gpu=present:NoSchedule not tolerated"
    assert left_out == ({} if tolerated else {"gpu": why})


def test_no_execute_and_valueless_taints_and_tolerations_read_past_the_first() -> None:
    no_exec = {"key": "drain", "effect": "NoExecute"}
    soft = {"key": "maybe", "value": "x", "effect": "PreferNoSchedule"}  # never blocks
    nodes = [node("a", taints=[soft, no_exec])]
    assert ineligible(pod(), nodes) == {"a": "taint drain:NoExecute not tolerated"}
    # The first toleration is for another effect; the second tolerates the taint.
    tolerations = [{"key": "drain", "operator": "Exists", "effect": "NoSchedule"},
                   {"key": "drain", "operator": "Exists", "effect": "NoExecute"}]  # fmt: skip
    assert ineligible(pod(tolerations=tolerations), nodes) == {}


def test_an_empty_term_first_does_not_end_the_terms_and_only_the_name_field_is_read() -> None:
    nodes = [node("a", {"zone": "z1"}), node("b")]
    in_z1 = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
    assert ineligible(pod(affinity=affinity({}, in_z1)), nodes).keys() == {"b"}
    other_field = {"matchFields": [{"key": "spec.nodeName", "operator": "In", "values": ["a"]}]}
    assert ineligible(pod(affinity=affinity(other_field)), nodes).keys() == {"a", "b"}


def placed(name: str, on: str, labels: dict[str, str] | None = None, ns: str = "default",
           phase: str = "Running", **spec: Any) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": name, "namespace": ns, "uid": f"u-{name}",
                         "labels": labels or {}},
            "spec": {"nodeName": on, **spec}, "status": {"phase": phase}}  # fmt: skip


def with_port(port: int, ip: str | None = None, proto: str | None = None) -> dict[str, Any]:
    p: dict[str, Any] = {"containerPort": 80, "hostPort": port}
    if ip:
        p["hostIP"] = ip
    if proto:
        p["protocol"] = proto
    return {"containers": [{"name": "c", "ports": [p]}]}


def me(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u-p",
                         "labels": labels or {}}, "spec": spec}  # fmt: skip


def test_a_host_port_another_pod_holds_on_the_node() -> None:
    nodes = [node("a"), node("b"), node("c")]
    pods = [placed("web", "a", **with_port(8080)),
            placed("dns", "b", **with_port(8080, "10.0.0.2", "UDP")),
            placed("done", "c", phase="Succeeded", **with_port(8080))]  # fmt: skip
    assert ineligible(me(**with_port(8080)), nodes, pods) == {
        "a": "host port 8080/TCP held by default/web"}  # fmt: skip
    assert ineligible(me(**with_port(8080, "10.0.0.2", "UDP")), nodes, pods).keys() == {"b"}
    assert ineligible(me(**with_port(9090)), nodes, pods) == {}
    # Another address on the node: the port is free there.
    assert ineligible(me(**with_port(8080, "10.0.0.3", "UDP")), nodes, pods) == {}
    assert ineligible(me(**with_port(8080, None, "UDP")), nodes, pods).keys() == {"b"}


def test_pods_on_nodes_not_offered_are_not_weighed() -> None:
    """A pod bound to a node kube-scheduler does not offer (deleted, or filtered out
    before) neither holds a port nor counts in a domain of the offered nodes."""
    zone = "topology.kubernetes.io/zone"
    nodes = [node("a", {zone: "z1"})]
    ghost = placed("db-0", "gone", {"app": "db"}, **with_port(8080))
    db = me({"app": "db"}, affinity=anti("podAntiAffinity", zone, matchLabels={"app": "db"}),
            **with_port(8080))  # fmt: skip
    assert ineligible(db, nodes, [ghost]) == {}


def anti(kind: str, key: str, **selector: Any) -> dict[str, Any]:
    term = {"labelSelector": selector, "topologyKey": key}
    return {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def test_required_pod_anti_affinity_both_ways_and_pod_affinity() -> None:
    zone = "topology.kubernetes.io/zone"
    host = "kubernetes.io/hostname"
    nodes = [node(n, {zone: z, host: n}) for n, z in (("a", "z1"), ("b", "z1"), ("c", "z2"))]
    pods = [placed("db-0", "a", {"app": "db"}),
            placed("lonely", "c", {"app": "x"},
                   affinity=anti("podAntiAffinity", host, matchLabels={"app": "db"}))]  # fmt: skip
    # The pod's own anti-affinity: no two db pods in one zone.
    db = me({"app": "db"}, affinity=anti("podAntiAffinity", zone, matchLabels={"app": "db"}))
    assert ineligible(db, nodes, pods) == {
        "a": f"pod anti-affinity: default/db-0 in its {zone}",
        "b": f"pod anti-affinity: default/db-0 in its {zone}",
        "c": f"the anti-affinity of default/lonely in its {host}",
    }
    # Pod affinity: next to a db pod, by host; in another namespace it selects nobody.
    near = me(affinity=anti("podAffinity", host, matchExpressions=[
        {"key": "app", "operator": "In", "values": ["db"]}]))  # fmt: skip
    assert ineligible(near, nodes, pods).keys() == {"b", "c"}
    elsewhere = [{**pods[0], "metadata": {**pods[0]["metadata"], "namespace": "other"}}]
    assert ineligible(near, nodes, elsewhere).keys() == {"a", "b", "c"}
    # The first of a group that wants itself together may go anywhere.
    first = me({"app": "db"}, affinity=anti("podAffinity", zone, matchLabels={"app": "db"}))
    assert ineligible(first, nodes, []) == {}


def test_a_term_that_selects_namespaces_by_label_reads_their_labels() -> None:
    """As InterPodAffinity: the namespaces a term names or its namespaceSelector selects
    (an empty one: every namespace); naming neither, the owner's own. Without the
    namespaces' labels, a selector that is not empty selects none of them: anti-affinity
    keeps the pod off what the named namespaces hold, pod affinity is not weighed."""
    host = "kubernetes.io/hostname"
    nodes = [node(n, {host: n}) for n in ("a", "b", "c")]
    pods = [placed("db-0", "a", {"app": "db"}, ns="prod"),
            placed("db-1", "b", {"app": "db"}, ns="dev"),
            placed("db-2", "c", {"app": "db"})]  # fmt: skip
    labels = {"prod": {"tier": "prod"}, "dev": {"tier": "dev"}, "default": {}}

    def avoiding(**term: Any) -> dict[str, Any]:
        full = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": host, **term}
        return me(affinity={"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [full]}})  # fmt: skip

    prod_only = avoiding(namespaceSelector={"matchLabels": {"tier": "prod"}})
    assert ineligible(prod_only, nodes, pods, labels) == {
        "a": f"pod anti-affinity: prod/db-0 in its {host}"}  # fmt: skip
    everywhere = avoiding(namespaceSelector={})
    assert ineligible(everywhere, nodes, pods, labels).keys() == {"a", "b", "c"}
    named_too = avoiding(namespaces=["dev"], namespaceSelector={"matchLabels": {"tier": "prod"}})
    assert ineligible(named_too, nodes, pods, labels).keys() == {"a", "b"}  # not its own
    assert ineligible(avoiding(), nodes, pods, labels).keys() == {"c"}  # its own namespace
    # The labels unknown: the selector selects nothing; the named namespaces still do,
    # and an empty selector still selects every namespace.
    assert ineligible(prod_only, nodes, pods) == {}
    assert ineligible(named_too, nodes, pods) == {"b": f"pod anti-affinity: dev/db-1 in its {host}"}
    assert ineligible(everywhere, nodes, pods).keys() == {"a", "b", "c"}
    # A placed pod's term that selects the pending pod's namespace by label keeps it off.
    guard = placed("guard", "b", {"app": "x"}, ns="prod", affinity={"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {}, "topologyKey": host, "namespaceSelector": {}}]}})  # fmt: skip
    assert ineligible(me(), nodes, [guard], labels) == {
        "b": f"the anti-affinity of prod/guard in its {host}"}  # fmt: skip
    assert ineligible(me(), nodes, [guard]).keys() == {"b"}  # {} needs no labels
    # The labels unknown, a placed pod's term that names the pending pod's namespace
    # keeps it off; one whose only way to select it is the selector does not.
    named = {"labelSelector": {}, "topologyKey": host, "namespaces": ["default"],
             "namespaceSelector": {"matchLabels": {"tier": "x"}}}  # fmt: skip
    terms = guard["spec"]["affinity"]["podAntiAffinity"]
    terms["requiredDuringSchedulingIgnoredDuringExecution"] = [named]
    assert ineligible(me(), nodes, [guard]) == {
        "b": f"the anti-affinity of prod/guard in its {host}"}  # fmt: skip
    named["namespaces"] = ["dev"]
    assert ineligible(me(), nodes, [guard]) == {}
    # Pod affinity: to a prod db pod's node.
    near = me(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": host,
        "namespaceSelector": {"matchLabels": {"tier": "prod"}}}]}})  # fmt: skip
    assert ineligible(near, nodes, pods, labels).keys() == {"b", "c"}
    assert ineligible(near, nodes, pods) == {}  # the labels unknown: not weighed
    near_any = me(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": host,
        "namespaceSelector": {}}]}})  # fmt: skip
    assert ineligible(near_any, nodes, pods) == {}  # a db pod on every node
    lone = [placed("db-0", "a", {"app": "db"}, ns="prod"), placed("web", "b", {"app": "web"})]
    assert ineligible(near_any, nodes, lone) == {
        n: f"pod affinity: no pod it wants in its {host}" for n in ("b", "c")}  # fmt: skip


def spread(key: str = "zone", max_skew: int = 1, **more: Any) -> dict[str, Any]:
    return {"topologySpreadConstraints": [{
        "maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}}, **more}]}  # fmt: skip


ZONES = [node("a1", {"zone": "a"}), node("a2", {"zone": "a"}), node("b1", {"zone": "b"}),
         node("c1", {"zone": "c"}), node("bare")]  # fmt: skip


def test_topology_spread_keeps_the_pod_off_the_fuller_domains() -> None:
    going = placed("going", "c1", {"app": "web"})  # terminating: not counted
    going["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    pods = [placed("w1", "a1", {"app": "web"}), placed("w2", "a2", {"app": "web"}),
            placed("w3", "b1", {"app": "web"}),
            placed("other", "c1", {"app": "db"}),  # another selector: not counted
            placed("elsewhere", "c1", {"app": "web"}, ns="other"),  # another namespace
            going]  # fmt: skip
    out = ineligible(me({"app": "web"}, **spread()), ZONES, pods)
    assert out == {
        "a1": "topology spread: zone=a has 2 matching pods, the emptiest 0 (maxSkew 1)",
        "a2": "topology spread: zone=a has 2 matching pods, the emptiest 0 (maxSkew 1)",
        "b1": "topology spread: zone=b has 1 matching pods, the emptiest 0 (maxSkew 1)",
        "bare": "topology spread: the node has no zone label",
    }
    # A pod its own selector does not pick adds nothing: zone b (1 - 0) is within 1.
    assert set(ineligible(me({"app": "other"}, **spread()), ZONES, pods)) == {"a1", "a2", "bare"}
    # maxSkew 2: zone a (2 + 1 against 0) is still too full, zone b (1 + 1) is not.
    wider = ineligible(me({"app": "web"}, **spread(max_skew=2)), ZONES, pods)
    assert wider == {
        "a1": "topology spread: zone=a has 2 matching pods, the emptiest 0 (maxSkew 2)",
        "a2": "topology spread: zone=a has 2 matching pods, the emptiest 0 (maxSkew 2)",
        "bare": "topology spread: the node has no zone label",
    }
    # ScheduleAnyway is a preference: kube-scheduler filters nothing for it.
    lenient = spread()
    lenient["topologySpreadConstraints"][0]["whenUnsatisfiable"] = "ScheduleAnyway"
    assert ineligible(me({"app": "web"}, **lenient), ZONES, pods) == {}


def test_topology_spread_counts_only_the_nodes_the_pod_may_use_and_min_domains() -> None:
    pods = [placed("w1", "a1", {"app": "web"}), placed("w2", "b1", {"app": "web"})]
    # Zone c is out of the pod's node affinity: its 0 does not count as the emptiest.
    honour = me({"app": "web"}, nodeSelector={"zone-ok": "y"}, **spread())
    nodes = [node("a1", {"zone": "a", "zone-ok": "y"}), node("b1", {"zone": "b", "zone-ok": "y"}),
             node("c1", {"zone": "c"})]  # fmt: skip
    assert set(ineligible(honour, nodes, pods)) == {"c1"}  # c1 only for its selector
    ignore = me({"app": "web"}, nodeSelector={"zone-ok": "y"},
                **spread(nodeAffinityPolicy="Ignore"))  # fmt: skip
    out = ineligible(ignore, nodes, pods)
    assert out["a1"].startswith("topology spread: zone=a has 1 matching pods, the emptiest 0")
    # Fewer domains than minDomains: the emptiest counts as 0.
    two = [node("a1", {"zone": "a"}), node("b1", {"zone": "b"})]
    assert ineligible(me({"app": "web"}, **spread()), two, pods) == {}
    assert set(ineligible(me({"app": "web"}, **spread(minDomains=3)), two, pods)) == {"a1", "b1"}
    # As many domains as minDomains: the emptiest is the real one (1), and both fit.
    assert ineligible(me({"app": "web"}, **spread(minDomains=2)), two, pods) == {}


def test_topology_spread_counts_only_nodes_with_every_constraints_key() -> None:
    """Two constraints (zone and host): a pod on a node with a zone but no host label is
    not counted in its zone, as kube-scheduler counts only nodes with every key."""
    both = spread()["topologySpreadConstraints"] + spread("host")["topologySpreadConstraints"]
    nodes = [node("a1", {"zone": "a", "host": "a1"}), node("half", {"zone": "a"}),
             node("b1", {"zone": "b", "host": "b1"})]  # fmt: skip
    pods = [placed("w1", "half", {"app": "web"})]
    out = ineligible(me({"app": "web"}, topologySpreadConstraints=both), nodes, pods)
    assert out == {"half": "topology spread: the node has no host label"}


def test_topology_spread_match_label_keys_and_node_taints_policy() -> None:
    pods = [placed("w1", "a1", {"app": "web", "version": "1"}),
            placed("w2", "b1", {"app": "web", "version": "2"})]  # fmt: skip
    mine = {"app": "web", "version": "2"}
    # Without matchLabelKeys both versions count: zones a and b hold 1, zone c 0.
    assert set(ineligible(me(mine, **spread()), ZONES, pods)) == {"a1", "a2", "b1", "bare"}
    # With it, only pods of the pod's own version: zone a holds none of them.
    keyed = ineligible(me(mine, **spread(matchLabelKeys=["version"])), ZONES, pods)
    assert set(keyed) == {"b1", "bare"}
    # A zone whose only node has a taint the pod does not tolerate: counted (as 0) by
    # default, left out of the count with nodeTaintsPolicy: Honor.
    taint = [{"key": "gpu", "effect": "NoSchedule"}]
    nodes = [node("a1", {"zone": "a"}), node("b1", {"zone": "b"}),
             node("c1", {"zone": "c"}, taints=taint)]  # fmt: skip
    assert set(ineligible(me(mine, **spread()), nodes, pods)) == {"a1", "b1", "c1"}
    assert set(ineligible(me(mine, **spread(nodeTaintsPolicy="Honor")), nodes, pods)) == {"c1"}


def test_topology_spread_defaults_tolerated_taints_and_keys_beside_expressions() -> None:
    # No minDomains: one domain is enough, and its own count is the emptiest (1 + 1 - 1).
    one_zone = [node("a1", {"zone": "a"}), node("a2", {"zone": "a"})]
    lone = [placed("w1", "a1", {"app": "web"})]
    assert ineligible(me({"app": "web"}, **spread()), one_zone, lone) == {}
    # nodeTaintsPolicy: Honor leaves out only taints the pod does not tolerate: a zone
    # whose node it tolerates counts (as 0), so zones a and b are too full.
    taint = [{"key": "gpu", "effect": "NoSchedule"}]
    nodes = [node("a1", {"zone": "a"}), node("b1", {"zone": "b"}),
             node("c1", {"zone": "c"}, taints=taint)]  # fmt: skip
    pods = [placed("w1", "a1", {"app": "web"}), placed("w2", "b1", {"app": "web"})]
    tolerant = me({"app": "web"}, tolerations=[{"key": "gpu", "operator": "Exists"}],
                  **spread(nodeTaintsPolicy="Honor"))  # fmt: skip
    assert set(ineligible(tolerant, nodes, pods)) == {"a1", "b1"}
    # matchLabelKeys adds to the selector's own expressions: only a pod of the same
    # tier (its expression) and version (the key) counts, here the one in zone a.
    tiered = {"app": "web", "version": "2", "tier": "front"}
    pods = [placed("w1", "a1", tiered), placed("w2", "b1", {**tiered, "tier": "back"}),
            placed("w3", "c1", {**tiered, "version": "1"})]  # fmt: skip
    both = spread(matchLabelKeys=["version"])
    both["topologySpreadConstraints"][0]["labelSelector"]["matchExpressions"] = [
        {"key": "tier", "operator": "In", "values": ["front"]}]  # fmt: skip
    assert set(ineligible(me(tiered, **both), ZONES, pods)) == {"a1", "a2", "bare"}


def test_the_placed_form_keeps_only_what_the_filters_read() -> None:
    """``why`` keeps this of each listed pod: none of its annotations, env, volumes or
    status, and nothing of a pod that holds no place."""
    full = placed("web", "a", {"app": "web"}, **with_port(8080, "10.0.0.2"))
    full["metadata"] |= {"annotations": {"big": "x" * 1000}, "managedFields": [{}],
                         "deletionTimestamp": "2026-11-27T00:00:00Z"}  # fmt: skip
    full["spec"]["containers"][0] |= {"env": [{"name": "A", "value": "1"}], "image": "i"}
    full["spec"]["containers"].append({"name": "side", "ports": [{"containerPort": 9}]})
    full["spec"] |= {
        "volumes": [{"name": "v"}],
        "affinity": {
            "nodeAffinity": {},
            **anti("podAntiAffinity", "zone", matchLabels={"app": "db"}),
        },
    }
    assert placed_form(full) == {
        "metadata": {"name": "web", "namespace": "default", "uid": "u-web",
                     "labels": {"app": "web"}, "deletionTimestamp": "2026-11-27T00:00:00Z"},
        "spec": {"nodeName": "a",
                 "containers": [{"ports": [{"hostIP": "10.0.0.2", "hostPort": 8080}]}],
                 "affinity": anti("podAntiAffinity", "zone", matchLabels={"app": "db"})},
    }  # fmt: skip
    assert placed_form(placed("done", "a", phase="Failed")) is None
    assert placed_form(me()) is None  # not bound
