"""``kubectl tessera`` on the real control plane: pods placed by the real kube-scheduler
with the extender, seen through the installed ``kubectl-tessera`` executable with a
kubeconfig of the read-only viewer role (deploy/rbac.yaml); and what it does with a node
whose inventory does not decode (a pod with a foreign assignment cannot be made here: the
admission policy refuses it; tests/unit/test_view_gpumap.py covers it)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.kube import GPUQUOTAS, NODES, PODS, Kind, NotFound
from tessera.kube.kinds import NAMESPACES
from tessera.model.annotations import ASSIGNMENT, GPU_MODEL, GPU_UUID, INVENTORY
from tests.e2e.plugin import rows, run
from tests.e2e.scheduler.browser import browser
from tests.e2e.scheduler.harness import Harness, unschedulable
from tests.e2e.scheduler.workload import _pod
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "view"


def _role_kubeconfig(h: Harness, account: str, roles: list[str]) -> Path:
    """A kubeconfig holding the token of a service account bound to the chart's
    ClusterRoles ``roles`` (deploy/rbac.yaml)."""
    sa = Kind("v1", "ServiceAccount", "serviceaccounts", True)
    h.admin.create(sa, {"metadata": {"name": account}}, "tessera-system")
    binding = Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings",
                   False)  # fmt: skip
    for role in roles:
        h.admin.create(binding, {
            "metadata": {"name": f"e2e-{account}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account,
                          "namespace": "tessera-system"}],
        })  # fmt: skip
    return h.token_kubeconfig(account, "tessera-system", context_namespace=NS)


def _viewer_kubeconfig(h: Harness) -> Path:
    """A kubeconfig of a service account bound to tessera-gpu-viewer only."""
    return _role_kubeconfig(h, "gpu-viewer", ["tessera-gpu-viewer"])


@pytest.fixture(scope="module")
def operator(harness: Harness) -> Path:
    """A kubeconfig of the people who take cards out: tessera-gpu-operator and -viewer."""
    return _role_kubeconfig(harness, "gpu-operator", ["tessera-gpu-operator", "tessera-gpu-viewer"])


@pytest.fixture(scope="module")
def placed(harness: Harness) -> dict[str, Any]:
    h = harness
    h.admin.create(NAMESPACES, {"metadata": {"name": NS}})
    h.ensure_default_service_account(NS)
    pods = {
        "train": _pod("train", {"tessera.io/gpu-memory": "12000", "tessera.io/gpu-cores": "30"},
                      {GPU_MODEL: "A100"}),
        "whole": _pod("whole", {"tessera.io/gpu": "1"}, {GPU_MODEL: "T4"}),
        "waits": _pod("waits", {"tessera.io/gpu-memory": "8000", "tessera.io/gpu-cores": "10"},
                      {GPU_MODEL: "B200"}),  # no B200 in the cluster
    }  # fmt: skip
    for p in pods.values():
        h.admin.create(PODS, p, NS)

    def state() -> dict[str, Any] | None:
        got = {n: h.admin.get(PODS, n, NS) for n in pods}
        if not got["train"]["spec"].get("nodeName") or not got["whole"]["spec"].get("nodeName"):
            return None
        return got if unschedulable(got["waits"]) else None

    def explain() -> str:
        return "\n".join(f"{n}: {h.admin.get(PODS, n, NS).get('status')}" for n in pods)

    got = wait_for("train and whole bound, waits unschedulable", state, 120, 0.5, explain)
    kubeconfig = _viewer_kubeconfig(h)
    return {"pods": got, "kubeconfig": kubeconfig}


def test_top_shows_each_pods_slice_on_its_card(placed: dict[str, Any]) -> None:
    kc = placed["kubeconfig"]
    train = placed["pods"]["train"]
    r = run(kc, "top", "-n", NS)
    by_pod = {row["POD"]: row for row in rows(r.stdout)}
    assert set(by_pod) == {f"{NS}/train", f"{NS}/whole"}, r.stdout
    t = by_pod[f"{NS}/train"]
    assert t["NODE"] == train["spec"]["nodeName"] and t["MODEL"] == "A100"
    assert t["SLICE"] == "12000Mi 30%" and t["CONTAINER"] == "main"
    assert by_pod[f"{NS}/whole"]["SLICE"] == "whole" and by_pod[f"{NS}/whole"]["MODEL"] == "T4"
    assert "1 GPU pod(s) waiting" in r.stdout

    doc = json.loads(run(kc, "top", "-o", "json", "--model", "A100", "--sort-by", "memory").stdout)
    assert all(c["model"] == "A100" for c in doc["cards"]) and len(doc["cards"]) >= 8
    allocated = [c["allocatedMiB"] for c in doc["cards"]]
    assert allocated == sorted(allocated, reverse=True)
    mine = [h for c in doc["cards"] for h in c["holders"] if h["pod"] == "train"]
    assert mine == [{"namespace": NS, "pod": "train", "container": "main", "memoryMiB": 12000,
                     "coresPercent": 30, "policy": "fixed-share", "exclusive": False, "claim": "",
                     "usedBytes": None, "achievedPercent": None}]  # fmt: skip
    assert f"{NS}/waits" in doc["pending"]

    wide = rows(run(kc, "top", "-n", NS, "-o", "wide").stdout)
    assert {row["POD"]: row["STATE"] for row in wide} == {f"{NS}/train": "ok",
                                                           f"{NS}/whole": "ok"}  # fmt: skip
    assert all(row["UUID"].startswith("GPU-") for row in wide)


def test_capacity_sums_the_cards_per_model(placed: dict[str, Any]) -> None:
    kc = placed["kubeconfig"]
    cards = json.loads(run(kc, "top", "-o", "json").stdout)["cards"]
    doc = json.loads(run(kc, "capacity", "-o", "json").stdout)
    by_model = {m["model"]: m for m in doc["models"]}
    assert by_model["all"]["cards"] == len(cards)
    a100 = [c for c in cards if c["model"] == "A100"]
    free = [c for c in a100 if c["healthy"] and not c["cordoned"] and not c["holders"]]
    assert by_model["A100"]["cards"] == len(a100) and by_model["A100"]["freeCards"] == len(free)
    assert by_model["A100"]["allocatedMiB"] == sum(c["allocatedMiB"] for c in a100)
    assert by_model["A100"]["allocatedMiB"] >= 12000  # train's slice
    table = {row["MODEL"]: row for row in rows(run(kc, "capacity").stdout)}
    assert table["A100"]["FREE"] == str(len(free)) and table["all"]["CARDS"] == str(len(cards))


def test_pod_shows_its_cards_and_limits(placed: dict[str, Any]) -> None:
    kc = placed["kubeconfig"]
    train = placed["pods"]["train"]
    a = json.loads(train["metadata"]["annotations"][ASSIGNMENT])
    uuid = a["containers"][0]["cards"][0]["uuid"]
    r = run(kc, "pod", "train")  # the context's namespace, as kubectl does
    assert f"pod {NS}/train on node {train['spec']['nodeName']}" in r.stdout
    [row] = rows(r.stdout.split("\n", 1)[1])
    assert row["UUID"] == uuid and row["MEMORY"] == "12000Mi" and row["COMPUTE"] == "30%"
    doc = yaml.safe_load(run(kc, "pod", "whole", "-n", NS, "-o", "yaml").stdout)
    assert doc["cards"][0]["exclusive"] is True and doc["cards"][0]["model"] == "T4"
    r = run(kc, "pod", "waits")
    assert "is waiting to be placed" in r.stdout and "kubectl tessera why waits" in r.stdout
    r = run(kc, "pod", "nope", ok=False)
    assert r.returncode == 1 and 'pods "nope" not found in namespace view' in r.stderr


def test_why_gives_the_grouped_reason_and_the_scheduler_events(
    placed: dict[str, Any], harness: Harness
) -> None:
    kc = placed["kubeconfig"]
    r = run(kc, "why", "waits")
    assert f"pod {NS}/waits fits nowhere: 0/{len(harness.nodes)} nodes fit" in r.stdout, r.stdout
    assert "B200" in r.stdout
    assert "FailedScheduling" in r.stdout or "TesseraUnschedulable" in r.stdout, r.stdout
    r = run(kc, "why", "train")
    assert "is placed: bound to" in r.stdout


def test_why_weighs_only_the_nodes_kube_scheduler_would_offer(
    placed: dict[str, Any], harness: Harness
) -> None:
    """A pod pinned by required node affinity to one node, which carries a GPU taint the
    pod does not tolerate: kube-scheduler offers it no node, and `why` must not say it
    fits (it did, weighing every node, before it read affinity and taints)."""
    h, kc = harness, placed["kubeconfig"]
    target = h.nodes[0].name
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    h.admin.merge_patch(NODES, target, {"spec": {"taints": [taint]}})
    pinned = _pod("pinned", {"tessera.io/gpu-memory": "1000", "tessera.io/gpu-cores": "10"})
    on_target = {"key": "kubernetes.io/hostname", "operator": "In", "values": [target]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [on_target]}]}
    pinned["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
    }
    try:
        h.admin.create(PODS, pinned, NS)
        r = run(kc, "why", "pinned")
        total = len(h.admin.list(NODES).items)
        left_out = (
            f"kube-scheduler's own filters leave out {total} of {total} nodes — {total - 1} "
            "nodes: required node affinity does not match; 1 node: taint "
            "nvidia.com/gpu=present:NoSchedule not tolerated"
        )
        assert left_out in r.stdout, r.stdout
        assert "offer it no node" in r.stdout and "fits now:" not in r.stdout
    finally:
        with contextlib.suppress(NotFound):
            h.admin.delete(PODS, "pinned", NS)
        h.admin.merge_patch(NODES, target, {"spec": {"taints": None}})


def test_why_names_the_node_topology_spread_keeps_the_pod_off(
    placed: dict[str, Any], harness: Harness
) -> None:
    """A pod spread over hostnames (maxSkew 1, DoNotSchedule) beside one matching pod:
    `why` leaves that pod's node out, counting as kube-scheduler does, and
    kube-scheduler's own FailedScheduling says the same of one node."""
    h, kc = harness, placed["kubeconfig"]
    small = {"tessera.io/gpu-memory": "1000", "tessera.io/gpu-cores": "10"}
    anchor = _pod("spread-anchor", small)
    anchor["metadata"]["labels"] = {"spread": "e2e"}
    spreader = _pod("spread-waits", small, {GPU_MODEL: "B200"})  # no B200: it waits
    spreader["metadata"]["labels"] = {"spread": "e2e"}
    spreader["spec"]["topologySpreadConstraints"] = [{
        "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"spread": "e2e"}},
    }]  # fmt: skip
    try:
        h.admin.create(PODS, anchor, NS)
        node = wait_for("the anchor bound", lambda: h.admin.get(PODS, "spread-anchor", NS)
                        ["spec"].get("nodeName"), 60, 0.5)  # fmt: skip
        h.admin.create(PODS, spreader, NS)
        wait_for("the spreading pod unschedulable",
                 lambda: unschedulable(h.admin.get(PODS, "spread-waits", NS)), 60, 0.5)  # fmt: skip
        r = run(kc, "why", "spread-waits")
        said = (f"1 node: topology spread: kubernetes.io/hostname={node} has 1 matching pods, "
                "the emptiest 0 (maxSkew 1)")  # fmt: skip
        assert said in r.stdout, r.stdout
        assert "1 node(s) didn't match pod topology spread constraints" in r.stdout, r.stdout
    finally:
        for name in ("spread-waits", "spread-anchor"):
            with contextlib.suppress(NotFound):
                h.admin.delete(PODS, name, NS)


def test_why_weighs_anti_affinity_that_selects_namespaces_by_label(
    placed: dict[str, Any], harness: Harness
) -> None:
    """A pod that avoids, on its host, pods of namespaces labelled as this one is: `why`
    (as the viewer, who may list namespaces) reads the labels and leaves the anchor's
    node out, and kube-scheduler's own FailedScheduling says the same of one node."""
    h, kc = harness, placed["kubeconfig"]
    tier = {"tessera.io/e2e-tier": "view"}
    h.admin.merge_patch(NAMESPACES, NS, {"metadata": {"labels": tier}})
    small = {"tessera.io/gpu-memory": "1000", "tessera.io/gpu-cores": "10"}
    anchor = _pod("ns-anchor", small)
    anchor["metadata"]["labels"] = {"ns-aff": "e2e"}
    avoids = _pod("ns-avoids", small, {GPU_MODEL: "B200"})  # no B200: it waits
    avoids["spec"]["affinity"] = {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"ns-aff": "e2e"}},
            "topologyKey": "kubernetes.io/hostname", "namespaceSelector": {"matchLabels": tier},
        }]}}  # fmt: skip
    try:
        h.admin.create(PODS, anchor, NS)
        node = wait_for("the anchor bound", lambda: h.admin.get(PODS, "ns-anchor", NS)
                        ["spec"].get("nodeName"), 60, 0.5)  # fmt: skip
        h.admin.create(PODS, avoids, NS)
        wait_for("the avoiding pod unschedulable",
                 lambda: unschedulable(h.admin.get(PODS, "ns-avoids", NS)), 60, 0.5)  # fmt: skip
        r = run(kc, "why", "ns-avoids")
        said = f"1 node: pod anti-affinity: {NS}/ns-anchor in its kubernetes.io/hostname"
        assert said in r.stdout, r.stdout
        assert node and "namespaces not read" not in r.stdout, r.stdout
        assert "1 node(s) didn't match pod anti-affinity rules" in r.stdout, r.stdout
    finally:
        for name in ("ns-avoids", "ns-anchor"):
            with contextlib.suppress(NotFound):
                h.admin.delete(PODS, name, NS)


def test_a_cordoned_card_takes_no_new_tenant_until_uncordoned(
    placed: dict[str, Any], harness: Harness, operator: Path
) -> None:
    """`kubectl tessera cordon` on the real control plane: the viewer role may not; the
    operator role cordons one card by index; a pod pinned to it waits with kube-scheduler's own
    FailedScheduling naming the cordon, `why` and `top` say so; uncordoned, it binds."""
    h, viewer, op = harness, placed["kubeconfig"], operator
    target = h.nodes[1].name
    card = next(c for c in h.nodes[1].cards if c.index == 3)
    refused = run(viewer, "cordon", target, "3", ok=False)
    assert refused.returncode == 1 and "403" in refused.stderr, refused.stderr
    wrong = run(op, "cordon", target, "9", ok=False)
    assert wrong.returncode == 1 and f"node {target} has no card 9" in wrong.stderr
    pin = _pod("pin-cordoned", {"tessera.io/gpu-memory": "1000", "tessera.io/gpu-cores": "10"},
               {GPU_UUID: card.uuid})  # fmt: skip
    try:
        r = run(op, "cordon", target, "3")
        assert f"node {target}: card 3 ({card.uuid}) cordoned" in r.stdout, r.stdout
        assert "card 3: no tenants" in r.stdout
        h.admin.create(PODS, pin, NS)
        wait_for("the pinned pod to be refused", lambda: unschedulable(
            h.admin.get(PODS, "pin-cordoned", NS)), 60, 0.5)  # fmt: skip
        why = run(viewer, "why", "pin-cordoned").stdout
        assert f"card {card.uuid} cordoned" in why, why
        assert "FailedScheduling" in why and "cordoned" in why.split("FailedScheduling")[1], why
        doc = json.loads(run(viewer, "top", "-o", "json").stdout)
        [shown] = [c for c in doc["cards"] if c["uuid"] == card.uuid]
        assert shown["cordoned"] is True and shown["healthy"] is True
        r = run(op, "uncordon", target)
        assert f"node {target}: card 3 ({card.uuid}) uncordoned" in r.stdout, r.stdout
        wait_for("the pinned pod to be bound once the card is back", lambda: h.admin.get(
            PODS, "pin-cordoned", NS)["spec"].get("nodeName") == target, 60, 0.5)  # fmt: skip
    finally:
        with contextlib.suppress(NotFound):
            h.admin.delete(PODS, "pin-cordoned", NS)
        run(op, "uncordon", target)


def test_drain_evicts_a_cards_pods_through_the_eviction_api_and_its_budgets(
    placed: dict[str, Any], harness: Harness, operator: Path
) -> None:
    """`kubectl tessera drain` on the real control plane: two pods share one card, a
    PodDisruptionBudget protects one of them. The drain evicts the other, is refused
    for the protected one until the timeout (exit 1, naming it), and once the budget is
    gone a second drain empties the card; a pod on the node's next card stays."""
    h, op = harness, operator
    target = h.nodes[5].name
    card, neighbour = h.nodes[5].cards[2], h.nodes[5].cards[3]
    pdbs = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True)
    slice_ = {"tessera.io/gpu-memory": "1000", "tessera.io/gpu-cores": "10"}
    pods = {"drain-free": card.uuid, "drain-kept": card.uuid, "drain-next": neighbour.uuid}
    for name, uuid in pods.items():
        pod = _pod(name, slice_, {GPU_UUID: uuid})
        pod["metadata"]["labels"] = {"e2e-drain": name}
        h.admin.create(PODS, pod, NS)
    kept = {"matchLabels": {"e2e-drain": "drain-kept"}}
    budget = {"metadata": {"name": "keep-one"}, "spec": {"minAvailable": 1, "selector": kept}}
    h.admin.create(pdbs, budget, NS)
    try:
        wait_for("the three pods bound", lambda: all(h.admin.get(PODS, n, NS)["spec"].get(
            "nodeName") == target for n in pods), 60, 0.5)  # fmt: skip
        wait_for("the budget to count its pod", lambda: (h.admin.get(pdbs, "keep-one", NS).get(
            "status") or {}).get("currentHealthy") == 1, 60, 0.5)  # fmt: skip
        r = run(op, "drain", target, "2", "--timeout", "8", ok=False)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{NS}/drain-free evicted" in r.stdout, r.stdout
        assert f"{NS}/drain-kept: eviction refused (429" in r.stdout, r.stdout
        assert f"still on the cards: {NS}/drain-kept" in r.stderr, r.stderr
        h.admin.delete(pdbs, "keep-one", NS)
        r = run(op, "drain", target, "2", "--timeout", "60")
        assert f"node {target}: drained" in r.stdout, r.stdout
        assert h.admin.get(PODS, "drain-next", NS)["spec"]["nodeName"] == target  # untouched
        gone = [n for n in ("drain-free", "drain-kept") if _exists(h, n)]
        assert gone == [], gone
    finally:
        with contextlib.suppress(NotFound):
            h.admin.delete(pdbs, "keep-one", NS)
        for name in pods:
            with contextlib.suppress(NotFound):
                h.admin.delete(PODS, name, NS)
        run(op, "uncordon", target)


def _exists(h: Harness, name: str) -> bool:
    try:
        h.admin.get(PODS, name, NS)
    except NotFound:
        return False
    return True


def test_quota_shows_use_against_the_limits(placed: dict[str, Any], harness: Harness) -> None:
    kc = placed["kubeconfig"]
    harness.admin.create(GPUQUOTAS, {
        "apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
        "metadata": {"name": "gpus", "namespace": NS},
        "spec": {"limits": [{"name": "a100", "models": ["A100"], "memoryMiB": 40000,
                             "coresPercent": 200},
                            {"name": "t4", "models": ["T4"], "cards": 2}]},
    }, NS)  # fmt: skip
    limits = rows(run(kc, "quota", "-o", "wide").stdout)
    assert {r["LIMIT"]: (r["MEMORY"], r["CORES"], r["CARDS"], r["HOLDERS"]) for r in limits} == {
        "a100": ("12000/40000Mi", "30/200%", "-", "train"),
        "t4": ("-", "-", "1/2", "whole"),
    }


def test_a_node_whose_inventory_does_not_decode_is_shown_and_the_rest_served(
    placed: dict[str, Any], harness: Harness
) -> None:
    h = harness
    kc = placed["kubeconfig"]
    broken = {"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "broken-gpu",
                           "annotations": {INVENTORY: "{not json"}}}  # fmt: skip
    h.admin.create(NODES, broken)
    try:
        r = run(kc, "top", "-n", NS)
        assert "node broken-gpu: inventory refused" in r.stderr, r.stderr
        assert {row["POD"] for row in rows(r.stdout)} == {f"{NS}/train", f"{NS}/whole"}
        doc = json.loads(run(kc, "top", "-o", "json").stdout)
        assert "not valid JSON" in doc["nodeProblems"]["broken-gpu"]
        assert len(doc["cards"]) == sum(len(n.cards) for n in h.nodes)
    finally:
        h.admin.delete(NODES, "broken-gpu")


@pytest.fixture(scope="module", autouse=True)
def _cleanup(harness: Harness) -> Any:
    yield
    for name in ("train", "whole", "waits"):
        with contextlib.suppress(NotFound):
            harness.admin.delete(PODS, name, NS)


def test_the_page_draws_the_map_searches_and_shows_a_pod(
    placed: dict[str, Any], harness: Harness, tmp_path: Path
) -> None:
    h = harness
    assert h.extender is not None
    train = placed["pods"]["train"]
    node = train["spec"]["nodeName"]
    uuid = json.loads(train["metadata"]["annotations"][ASSIGNMENT])["containers"][0]["cards"][0][
        "uuid"
    ]
    broken = {"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": "broken-page", "annotations": {INVENTORY: "{oops"}}}  # fmt: skip
    h.admin.create(NODES, broken)
    try:
        wait_for("the extender to refuse the broken inventory",
                 lambda: b"broken-page" in h.extender.get("/gpus.json")[1], 30, 0.2)  # fmt: skip
        url = f"http://127.0.0.1:{h.extender.port}/gpus#q=view/train&pod=view/train"
        page = browser(url, tmp_path)
        everything = browser(f"http://127.0.0.1:{h.extender.port}/gpus", tmp_path / "all")
    finally:
        h.admin.delete(NODES, "broken-page")
    [(_, row, text)] = [e for e in everything.with_class("broken")]
    assert row["data-node"] == "broken-page" and "inventory refused" in text
    assert not [a for _, a, _ in everything.with_class("hidden")]  # no search: every row
    [(_, body, _)] = [e for e in page.found if e[0] == "body"]
    assert body.get("data-ready") == "1", "the page's script did not finish"
    rows = page.with_class("node")
    assert len(rows) == len(h.nodes) + 1  # and the broken one
    shown = [a["data-node"] for _, a, _ in rows if "hidden" not in a["class"].split()]
    assert shown == [node]  # the search keeps the one node holding view/train
    tiles = page.with_class("card")
    assert len(tiles) == sum(len(n.cards) for n in h.nodes)
    [tile] = [a for _, a, _ in tiles if a["data-uuid"] == uuid]
    assert "12000 of" in tile["title"] and "30% compute" in tile["title"]
    [hit] = [a for _, a, _ in page.with_class("slice") if a["data-pod"] == "view/train"]
    assert "match" in hit["class"].split() and "12000 MiB, 30%" in hit["title"]
    detail, text = page.by_id("detail")
    assert "open" in detail["class"].split()
    assert "view/train" in text and "12000 MiB" in text and "fixed-share" in text
    _, summary = page.by_id("summary")
    assert f"{len(h.nodes) + 1} nodes" in summary and "1 pods waiting" in summary
    shot = (tmp_path / "gpus.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000, len(shot)
