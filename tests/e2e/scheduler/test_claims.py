"""Claims on the real control plane: the real kube-scheduler allocates Tessera's cards.

50 kwok nodes × 8 cards, each with a real node agent (fake discovery, in this process)
that reads its node's ``tessera.io/claims-cards`` label (4-7): it publishes cards
4-7 in a ResourceSlice and cards 0-3 in the inventory annotation. The chart's
DeviceClasses and the examples' ResourceClaimTemplates are applied as they are. Then
500 pods with claims (slices, whole cards, two cards on one NVLink island, "not a T4")
and 200 extender-path pods go to the same nodes at once. kube-scheduler's DRA plugin
allocates the claims -- no extender on that path -- and the extender places the rest.

Judged from the API objects: no device over its memory, compute or slots; no card of
the claims path in any extender assignment and no extender card in any allocation;
what cannot fit stays pending with the scheduler's reason.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.claims.devices import CLAIMS_LABEL, CORDONED_TAINT, DRIVER, slice_name
from tessera.kube import GPUQUOTAS, NODES, PODS, Obj
from tessera.kube.client import KubeClient
from tessera.kube.errors import ApiError, NotFound
from tessera.kube.kinds import (
    DEVICE_CLASSES,
    EVENTS,
    NAMESPACES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Kind,
)
from tessera.model.clusterspec import make_cards
from tessera.model.quantity import parse_quantity
from tessera.model.types import NodeInventory
from tessera.node.agent import Agent, AgentConfig
from tessera.node.backstop import BackstopMode
from tessera.node.cards.fake import FakeDiscovery
from tessera.node.fakes import MemoryEvents, MemoryPods
from tessera.node.kube_source import KubeNode
from tessera.testenv.chart import deployed
from tessera.view.claim_cel import Selector, device_variable
from tessera.view.cordon import change_cordons
from tests.e2e.plugin import run
from tests.e2e.scheduler.browser import browser
from tests.e2e.scheduler.checks import api_writes, assignment_of, book_all
from tests.e2e.scheduler.harness import REPO, Harness, PodView, unschedulable
from tests.e2e.wait import wait_for

RESOURCE_QUOTAS = Kind("v1", "ResourceQuota", "resourcequotas", namespaced=True)
NS = "claims"
NODE_COUNT = 50
DRIVER_VERSION = "550.54.15"
MODELS = ("A100", "H100", "T4", "A10")
SELECTOR = {"tessera.io/e2e-claims": "true"}
EXAMPLES = REPO / "examples" / "claims"
WHOLE = {  # one whole card, any model: a request that names no capacity
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "one-whole-card"},
    "spec": {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}}},
}  # fmt: skip
HUGE = copy.deepcopy(WHOLE)  # fits no device: 1000 GiB
HUGE["metadata"]["name"] = "huge"
HUGE["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
    "requests": {"memory": "1000Gi"}
}


@dataclass
class World:
    h: Harness
    nodes: list[NodeInventory]
    agents: list[Agent]
    view: PodView


def _nodes() -> list[NodeInventory]:
    out = []
    for i in range(NODE_COUNT):
        name = f"claim-{i:03d}"
        model = MODELS[i % len(MODELS)]
        nvlink = "all" if model in ("A100", "H100") else "none"
        cards = make_cards(name, 8, model, nvlink=nvlink)
        out.append(NodeInventory(name, cards, cpu_milli=96_000, memory_mib=384 * 1024))
    return out


def _agent(h: Harness, root: Path, node: NodeInventory) -> Agent:
    d = root / node.name
    cfg = AgentConfig(
        node=node.name,
        plugin_dir=d / "dp",
        state_dir=d / "state",
        backstop=BackstopMode.OFF,
        coordinator_period_s=0,
        claims_cards="",  # the chart's default: the node's label decides
        dra_plugin_dir=d / "plugins",
        dra_registry_dir=d / "registry",
        cdi_dir=d / "cdi",
    )
    pods = MemoryPods(cfg.resource, frozenset(c.uuid for c in node.cards))
    # A client of its own, as each agent process has: its slice watch holds a connection.
    api = KubeClient.from_kubeconfig(str(h.env.kubeconfig))
    # An NVIDIA-style driver version, so the slices carry driverVersion as a real node's do.
    discovery = FakeDiscovery(node.cards, driver_version=DRIVER_VERSION)
    return Agent(cfg, discovery, pods, MemoryEvents(), KubeNode(api), None, kube=api)


def _apply(h: Harness, kind: Kind, doc: Obj, namespace: str | None = None) -> None:
    with contextlib.suppress(ApiError):  # already there from an earlier module run
        h.admin.create(kind, doc, namespace)


@pytest.fixture(scope="module")
def world(harness: Harness) -> Iterator[World]:
    h = harness
    nodes = _nodes()
    root = Path(tempfile.mkdtemp(prefix="ts-claims-", dir="/tmp"))  # short socket paths
    agents: list[Agent] = []
    h.env.create_gpu_nodes(nodes)
    try:
        labels = {CLAIMS_LABEL: "4-7", **SELECTOR}
        for n in nodes:
            h.admin.merge_patch(NODES, n.name, {"metadata": {"labels": labels}})
        for n in nodes:
            agent = _agent(h, root, n)
            agent.start()
            agents.append(agent)
        for doc in deployed("device-classes.yaml"):
            _apply(h, DEVICE_CLASSES, doc)
        _apply(h, NAMESPACES, {"metadata": {"name": NS}})
        h.ensure_default_service_account(NS)
        for path in sorted(EXAMPLES.glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            if doc["kind"] == "ResourceClaimTemplate":
                _apply(h, RESOURCE_CLAIM_TEMPLATES, doc, NS)
        for doc in (WHOLE, HUGE):
            _apply(h, RESOURCE_CLAIM_TEMPLATES, doc, NS)
        view = PodView(h.admin, NS)
        yield World(h, nodes, agents, view)
        view.stop()
    finally:
        for pod in h.admin.list(PODS, NS).items:
            with contextlib.suppress(NotFound):
                h.admin.delete(PODS, pod["metadata"]["name"], NS)
        for agent in agents:
            agent.stop()
        for n in nodes:
            for kind, name in ((RESOURCE_SLICES, slice_name(n.name)), (NODES, n.name)):
                with contextlib.suppress(NotFound):
                    h.admin.delete(kind, name)
        ext = h.extender
        if ext is not None:  # the other tests count the harness's 100 nodes
            wait_for("the extender to forget the claim nodes",
                     lambda: ext.metric("tessera_scheduler_nodes") == 100, 120)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _claim_pod(name: str, template: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tessera-scheduler",  # the testenv's one profile
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [{"name": "main", "image": "busybox",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def _extender_pod(name: str) -> Obj:
    limits = {"tessera.io/gpu-memory": "8000", "tessera.io/gpu-cores": "25"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},  # no schedulerName: the webhook routes it
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": dict(SELECTOR),
            "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


def _workload() -> list[Obj]:
    pods = [_claim_pod(f"two-a100-{i:03d}", "two-a100-one-island") for i in range(10)]
    pods += [_claim_pod(f"whole-{i:03d}", "one-whole-card") for i in range(40)]
    pods += [_claim_pod(f"not-t4-{i:03d}", "any-but-t4") for i in range(150)]
    pods += [_claim_pod(f"slice-{i:03d}", "slice-8gib-30") for i in range(298)]
    pods += [_claim_pod(f"huge-{i:03d}", "huge") for i in range(2)]
    pods += [_extender_pod(f"ext-{i:03d}") for i in range(200)]
    # Interleave so the two paths race for the same nodes.
    return [p for pair in zip(pods[:350], pods[350:], strict=True) for p in pair]


def _q(raw: object) -> float:
    return float(parse_quantity(raw, "quantity").value)


Device = tuple[str, str]  # pool (node), device name


def _capacity(slices: list[Obj]) -> tuple[dict[Device, dict[str, float]], dict[Device, str]]:
    capacity, model = {}, {}
    for s in slices:
        for d in s["spec"].get("devices") or []:
            key = (s["spec"]["pool"]["name"], d["name"])
            capacity[key] = {k: _q(v["value"]) for k, v in d["capacity"].items()}
            model[key] = d["attributes"]["model"]["string"]
    return capacity, model


def _results(claims: list[Obj]) -> Iterator[Obj]:
    """Every allocation result of our driver in ``claims``."""
    for c in claims:
        allocation = (c.get("status") or {}).get("allocation") or {}
        for r in allocation.get("devices", {}).get("results") or []:
            if r["driver"] == DRIVER:
                yield r


def _used(claims: list[Obj], capacity: dict[Device, dict[str, float]]) -> dict[Device, Any]:
    used: dict[Device, Any] = defaultdict(lambda: defaultdict(float))
    for r in _results(claims):
        key = (r["pool"], r["device"])
        consumed = r.get("consumedCapacity") or capacity[key]  # none: the whole device
        for k, v in consumed.items():
            used[key][k] += _q(v)
    return used


def _overcommitted(slices: list[Obj], claims: list[Obj]) -> list[str]:
    """Devices whose allocations add up past a capacity, from the objects alone."""
    capacity, _ = _capacity(slices)
    return [
        f"{key}: {k} {v} of {capacity[key][k]}"
        for key, kinds in _used(claims, capacity).items()
        for k, v in kinds.items()
        if v > capacity[key][k]
    ]


GIB = float(1 << 30)
SHAPES = {  # pod name prefix -> (devices, memory, compute, models allowed) ; memory None: whole
    "slice-": (1, 8 * GIB, 30.0, None),
    "not-t4-": (1, 16 * GIB, 20.0, "not T4"),
    "whole-": (1, None, 0.0, None),
    "two-a100-": (2, None, 0.0, "A100"),
    "huge-": (1, 1000 * GIB, 0.0, None),
}


def _fits_now(name: str, slices: list[Obj], claims: list[Obj]) -> list[str]:
    """Nodes where the pending pod ``name`` would fit as the claims stand now."""
    count, memory, compute, models = next(v for k, v in SHAPES.items() if name.startswith(k))
    capacity, model = _capacity(slices)
    used = _used(claims, capacity)
    room: dict[str, int] = defaultdict(int)
    for key, cap in capacity.items():
        u = used.get(key, {})
        if (models == "not T4" and model[key] == "T4") or (
            models == "A100" and model[key] != "A100"
        ):
            continue
        want = cap["memory"] if memory is None else memory
        if (cap["memory"] - u.get("memory", 0) >= want and cap["compute"] - u.get("compute", 0)
                >= compute and cap["slots"] - u.get("slots", 0) >= 1):  # fmt: skip
            room[key[0]] += 1
    return sorted(node for node, n in room.items() if n >= count)


def test_kubectl_tessera_top_and_the_page_show_a_claim_beside_the_extender_cards(
    world: World, tmp_path: Path
) -> None:
    # Before the big workload (which fills the claims path), in a namespace of its own.
    h, ns = world.h, "claims-view"
    _apply(h, NAMESPACES, {"metadata": {"name": ns}})
    h.ensure_default_service_account(ns)
    template = yaml.safe_load((REPO / "examples" / "claims" / "slice-8gib-30.yaml").read_text())
    claim = h.admin.create(RESOURCE_CLAIMS, {"metadata": {"name": "viewed-gpu"},
                                             "spec": template["spec"]["spec"]}, ns)  # fmt: skip
    pod = _claim_pod("viewed", "unused")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "viewed-gpu"}]
    h.admin.create(PODS, pod, ns)
    bound = wait_for("viewed bound", lambda: (p := h.admin.get(PODS, "viewed", ns))["spec"]
                     .get("nodeName") and p, 120, 0.5)  # fmt: skip
    claim = h.admin.get(RESOURCE_CLAIMS, "viewed-gpu", ns)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == bound["spec"]["nodeName"]
    # As a person with the chart's read-only role (deploy/rbac.yaml, tessera-gpu-viewer).
    sa = Kind("v1", "ServiceAccount", "serviceaccounts", True)
    h.admin.create(sa, {"metadata": {"name": "claims-viewer"}}, "tessera-system")
    binding = Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings",
                   False)  # fmt: skip
    h.admin.create(binding, {
        "metadata": {"name": "e2e-claims-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "tessera-gpu-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "claims-viewer",
                      "namespace": "tessera-system"}],
    })  # fmt: skip
    out = run(h.token_kubeconfig("claims-viewer", "tessera-system"), "top", "-o", "json")
    assert "cannot list" not in out.stderr, out.stderr
    top = json.loads(out.stdout)
    mine = [c for c in top["cards"] if c["node"] == result["pool"]]
    # Cards 0-3 from the inventory, 4-7 from the slice: one node, one list.
    assert sorted(c["index"] for c in mine) == list(range(8))
    [card] = [c for c in mine if f"gpu-{c['index']}" == result["device"]]
    [holder] = card["holders"]
    assert (holder["namespace"], holder["pod"], holder["claim"], holder["container"]) == (
        ns, "viewed", "viewed-gpu", ""
    )  # fmt: skip
    assert (holder["memoryMiB"], holder["coresPercent"], card["allocatedMiB"]) == (8192, 30, 8192)
    assert top["claimProblems"] == {}
    # The scheduler's GPU map page (--web, the chart's tessera-scheduler role) draws the
    # same card from its own watches.
    ext = h.extender
    assert ext is not None

    def page_card() -> dict[str, Any] | None:
        page = json.loads(ext.get("/gpus.json")[1])
        held = [c for n in page["nodes"] if n["name"] == result["pool"] for c in n["cards"]
                if c["holders"] and f"gpu-{c['index']}" == result["device"]]  # fmt: skip
        return held[0] if held else None

    on_page = wait_for("the claim on the GPU map page", page_card, 30, 0.5)
    [page_holder] = on_page["holders"]
    assert page_holder == {k: holder[k] for k in page_holder}  # top adds live use
    assert on_page["allocatedMiB"] == 8192
    # And as a person sees it: the pod's detail names the claim where a container would be.
    url = f"http://127.0.0.1:{ext.port}/gpus#pod={ns}/viewed"
    page = browser(url, tmp_path)
    [(_, body, _)] = [e for e in page.found if e[0] == "body"]
    assert body.get("data-ready") == "1", "the page's script did not finish"
    [slice_] = [a for _, a, _ in page.with_class("slice") if a["data-pod"] == f"{ns}/viewed"]
    assert "claim viewed-gpu: 8192 MiB, 30%" in slice_["title"]
    _, detail = page.by_id("detail")
    assert "claim viewed-gpu" in detail and "8192 MiB" in detail
    h.admin.delete(PODS, "viewed", ns)
    wait_for("viewed gone", lambda: not h.admin.list(PODS, ns).items, 60, 0.5)
    h.admin.delete(RESOURCE_CLAIMS, "viewed-gpu", ns)


def _events_of(h: Harness, ns: str, pod: str) -> list[str]:
    return [f"{e.get('reason')}: {e.get('message')}" for e in h.admin.list(EVENTS, ns).items
            if e["involvedObject"].get("name") == pod]  # fmt: skip


def test_a_cordoned_claims_card_is_tainted_and_not_allocated_until_uncordoned(
    world: World,
) -> None:
    """`kubectl tessera cordon`'s annotation on the claims path: the node's agent follows
    its Node, taints the card in the ResourceSlice, and the real kube-scheduler allocates
    a claim pinned to that card only once it is uncordoned."""
    h, ns = world.h, "claims-cordon"
    node = world.nodes[2]
    card = next(c for c in node.cards if c.index == 5)
    name = slice_name(node.name)
    _apply(h, NAMESPACES, {"metadata": {"name": ns}})
    h.ensure_default_service_account(ns)

    def taints() -> set[str] | None:
        devices = h.admin.get(RESOURCE_SLICES, name)["spec"]["devices"]
        found = [d for d in devices if d["attributes"]["uuid"]["string"] == card.uuid]
        return {t["key"] for t in found[0].get("taints") or []} if found else None

    pinned = f'device.attributes["{DRIVER}"].uuid == "{card.uuid}"'
    claim = {"metadata": {"name": "on-cordoned"}, "spec": {"devices": {"requests": [{
        "name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.io",
                                   "selectors": [{"cel": {"expression": pinned}}],
                                   "capacity": {"requests": {"memory": "1Gi"}}}}]}}}  # fmt: skip
    pod = _claim_pod("on-cordoned", "unused")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "on-cordoned"}]
    change_cordons(h.admin, node.name, ["5"], cordon=True)
    try:
        wait_for("the agent to taint the cordoned card in its slice",
                 lambda: CORDONED_TAINT in (taints() or set()), 30, 0.2)  # fmt: skip
        # The API server stamps each taint's timeAdded; the agent must take its slice as
        # written, not rewrite it (a new pool generation) on every health tick.
        before = h.admin.get(RESOURCE_SLICES, name)
        time.sleep(3)  # three of the agent's health ticks
        after = h.admin.get(RESOURCE_SLICES, name)
        assert after["spec"]["pool"]["generation"] == before["spec"]["pool"]["generation"]
        h.admin.create(RESOURCE_CLAIMS, claim, ns)
        h.admin.create(PODS, pod, ns)
        wait_for("the pinned claim's pod to be refused",
                 lambda: unschedulable(h.admin.get(PODS, "on-cordoned", ns)), 60, 0.5)  # fmt: skip
        assert not (h.admin.get(RESOURCE_CLAIMS, "on-cordoned", ns).get("status") or {}).get(
            "allocation"
        )
        # why reads the claim: not allocated, what it asks, and, weighing its selector
        # (the pinned card) and its DeviceClass's as the allocator does, that no card in
        # service passes them: the one it names is cordoned.
        why = run(h.env.kubeconfig, "why", "on-cordoned", "-n", ns).stdout
        assert "is on the claims path: kube-scheduler's own allocator places it" in why, why
        assert f"claim gpu ({ns}/on-cordoned): not allocated" in why, why
        assert (f"request gpu: 1 card(s) of {DRIVER} with 1024 MiB and 0 % compute: no card "
                "in service passes its CEL selectors\n") in why, why  # fmt: skip
    finally:
        change_cordons(h.admin, node.name, [], cordon=False)
    try:
        wait_for("the taint gone", lambda: taints() == set(), 30, 0.2)
        wait_for("the pod bound to the card's node once it is back", lambda: h.admin.get(
            PODS, "on-cordoned", ns)["spec"].get("nodeName") == node.name, 60, 0.5)  # fmt: skip
    finally:
        with contextlib.suppress(NotFound):
            h.admin.delete(PODS, "on-cordoned", ns)
        with contextlib.suppress(NotFound):
            h.admin.delete(RESOURCE_CLAIMS, "on-cordoned", ns)


def test_why_weighs_capacity_and_version_selectors_as_the_allocator_does(world: World) -> None:
    """Selectors on a card's memory (a quantity) and its driver version (a semver):
    `kubectl tessera why` evaluates them on the real slices' devices, and the real
    kube-scheduler's allocator agrees -- the one every card passes is allocated, the one
    none passes is refused, and why says so. Likewise a constraint: two T4s on one NVLink
    island, which no T4 node has (its cards are islands of one)."""
    h, ns = world.h, "claims-cel"
    _apply(h, NAMESPACES, {"metadata": {"name": ns}})
    h.ensure_default_service_account(ns)
    memory = f'device.capacity["{DRIVER}"].memory'
    version = f'device.attributes["{DRIVER}"].driverVersion'
    every = (
        f'{memory}.compareTo(quantity("8Gi")) >= 0 && device.allowMultipleAllocations'
        f' && {version}.isGreaterThan(semver("535.104.5")) && {version}.major() == 550'
    )
    none = f'{memory}.isGreaterThan(quantity("1Ti")) || {version}.isLessThan(semver("470.0.0"))'
    slices = h.admin.list(RESOURCE_SLICES).items
    devices = [device_variable(d, DRIVER) for s in slices if s["spec"]["driver"] == DRIVER
               for d in s["spec"].get("devices") or []]  # fmt: skip
    assert devices and all(Selector(every).test(d) is True for d in devices)
    assert all(Selector(none).test(d) is False for d in devices)
    t4 = f'device.attributes["{DRIVER}"].model == "T4"'
    one_island = [{"matchAttribute": f"{DRIVER}/nvlinkIsland"}]
    names = {"every": (every, 1, []), "none": (none, 1, []), "t4-pair": (t4, 2, one_island)}
    try:
        for name, (expression, count, constraints) in names.items():
            exactly = {"deviceClassName": "gpu.tessera.io", "count": count,
                       "selectors": [{"cel": {"expression": expression}}],
                       "capacity": {"requests": {"memory": "1Gi"}}}  # fmt: skip
            requests = [{"name": "gpu", "exactly": exactly}]
            devices = {"requests": requests, "constraints": constraints}
            claim = {"metadata": {"name": name}, "spec": {"devices": devices}}
            h.admin.create(RESOURCE_CLAIMS, claim, ns)
            pod = _claim_pod(name, "unused")
            pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
            h.admin.create(PODS, pod, ns)
        wait_for("the claim every card passes to be allocated and its pod bound",
                 lambda: h.admin.get(PODS, "every", ns)["spec"].get("nodeName"),
                 60, 0.5)  # fmt: skip
        for name in ("none", "t4-pair"):
            wait_for(f"the claim {name} to be refused",
                     lambda n=name: unschedulable(h.admin.get(PODS, n, ns)), 60, 0.5)  # fmt: skip
        why = run(h.env.kubeconfig, "why", "none", "-n", ns).stdout
        assert (f"request gpu: 1 card(s) of {DRIVER} with 1024 MiB and 0 % compute: no card "
                "in service passes its CEL selectors\n") in why, why  # fmt: skip
        assert "not weighed" not in why, why
        why = run(h.env.kubeconfig, "why", "t4-pair", "-n", ns).stdout
        assert (f"request gpu: 2 card(s) of {DRIVER} with 1024 MiB and 0 % compute: no node "
                "has room for it now\n") in why, why  # fmt: skip
    finally:
        for name in names:
            with contextlib.suppress(NotFound):
                h.admin.delete(PODS, name, ns)
            with contextlib.suppress(NotFound):
                h.admin.delete(RESOURCE_CLAIMS, name, ns)


def test_why_weighs_a_request_for_every_card_as_the_allocator_does(world: World) -> None:
    """allocationMode All, the pod held to one node by its affinity: with one of the
    node's claims cards cordoned the real allocator refuses the node -- "all" includes
    the tainted card -- and `kubectl tessera why`, weighing that node only, says so.
    Uncordoned, the claim is given all four of the node's claims cards."""
    h, ns = world.h, "claims-all"
    node = world.nodes[3]
    _apply(h, NAMESPACES, {"metadata": {"name": ns}})
    h.ensure_default_service_account(ns)
    exactly = {"deviceClassName": "gpu.tessera.io", "allocationMode": "All",
               "capacity": {"requests": {"memory": "1Gi"}}}  # fmt: skip
    claim = {"metadata": {"name": "every-card"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}  # fmt: skip
    pod = _claim_pod("every-card", "unused")
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "every-card"}]
    only = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                {"nodeSelectorTerms": [only]}}}  # fmt: skip
    change_cordons(h.admin, node.name, ["6"], cordon=True)
    try:
        name = slice_name(node.name)
        wait_for("the agent to taint the cordoned card", lambda: any(
            d.get("taints") for d in h.admin.get(RESOURCE_SLICES, name)["spec"]["devices"]),
            30, 0.2)  # fmt: skip
        h.admin.create(RESOURCE_CLAIMS, claim, ns)
        h.admin.create(PODS, pod, ns)
        wait_for("the pod to be refused",
                 lambda: unschedulable(h.admin.get(PODS, "every-card", ns)), 60, 0.5)  # fmt: skip
        why = run(h.env.kubeconfig, "why", "every-card", "-n", ns).stdout
        assert "kube-scheduler's own filters leave out" in why, why  # the affinity, read alike
        said = (f"request gpu: every card of {DRIVER} with 1024 MiB and 0 % compute: no node "
                "has every matching card free now (1 with one out of service)\n")  # fmt: skip
        assert said in why, why
    finally:
        change_cordons(h.admin, node.name, [], cordon=False)
    try:
        wait_for("the pod bound once the card is back", lambda: h.admin.get(
            PODS, "every-card", ns)["spec"].get("nodeName") == node.name, 60, 0.5)  # fmt: skip
        results = h.admin.get(RESOURCE_CLAIMS, "every-card", ns)["status"]["allocation"][
            "devices"]["results"]  # fmt: skip
        assert sorted(r["device"] for r in results) == [f"gpu-{i}" for i in range(4, 8)]
    finally:
        with contextlib.suppress(NotFound):
            h.admin.delete(PODS, "every-card", ns)
        with contextlib.suppress(NotFound):
            h.admin.delete(RESOURCE_CLAIMS, "every-card", ns)


def test_a_gpuquota_caps_claims_and_extender_pods_together(world: World) -> None:
    # Before the big workload, which fills the claims path. The chart's claims webhook
    # (deploy/webhook.yaml, claims.tessera.io) is installed with the harness's others.
    h, ns = world.h, "claims-capped"
    _apply(h, NAMESPACES, {"metadata": {"name": ns}})
    h.ensure_default_service_account(ns)
    limit = {"name": "all", "models": ["*"], "memoryMiB": 20000}
    quota = {"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
             "metadata": {"name": "gpus"}, "spec": {"limits": [limit]}}  # fmt: skip
    h.admin.create(GPUQUOTAS, quota, ns)
    template = yaml.safe_load((EXAMPLES / "slice-8gib-30.yaml").read_text())
    _apply(h, RESOURCE_CLAIM_TEMPLATES, template, ns)
    made: list[str] = []
    try:
        # 8,000 MiB on the extender path, then three 8 GiB claims.
        h.admin.create(PODS, {**_extender_pod("ext"), "metadata": {"name": "ext"}}, ns)
        made.append("ext")
        wait_for("ext bound", lambda: h.admin.get(PODS, "ext", ns)["spec"].get("nodeName"), 120)
        for i in range(3):
            h.admin.create(PODS, _claim_pod(f"c{i}", template["metadata"]["name"]), ns)
            made.append(f"c{i}")

        def bound() -> list[str]:
            return sorted(p["metadata"]["name"] for p in h.admin.list(PODS, ns).items
                          if p["spec"].get("nodeName"))  # fmt: skip

        # 8,000 on the extender path leaves room for one 8 GiB claim only (16,192).
        wait_for("one claim pod bound", lambda: len(bound()) == 2, 120, 0.5)
        [waiting, other] = sorted({"c0", "c1", "c2"} - set(bound()))
        wanted = f"quota: {ns}/gpus all ("
        refused = wait_for("kube-scheduler to report the webhook's refusal", lambda: [
            e for e in _events_of(h, ns, waiting) + _events_of(h, ns, other)
            if e.startswith("FailedScheduling") and wanted in e], 60, 0.5)  # fmt: skip
        assert 'admission webhook "claims.tessera.io" denied the request' in refused[0]
        assert "memory 16192 of 20000 MiB used, claim " in refused[0], refused[0]
        assert "asks 8192" in refused[0]

        def status() -> Obj:
            return dict(h.admin.get(GPUQUOTAS, "gpus", ns).get("status") or {})

        def claims_counted() -> list[int]:
            return [x.get("claims") for x in status().get("limits") or []]

        wait_for("the quota's status to count the claim", lambda: claims_counted() == [1], 30,
                 explain=lambda: str(status()))  # fmt: skip
        [lim] = status()["limits"]
        assert (lim["used"]["memoryMiB"], lim["pods"], lim["claims"]) == (16192, 1, 1)
        claim_holder = next(x for x in lim["holders"] if x.startswith("claim/"))
        # The pending pods' claims were never allocated: nothing but the one is counted.
        allocated = [c["metadata"]["name"] for c in h.admin.list(RESOURCE_CLAIMS, ns).items
                     if (c.get("status") or {}).get("allocation")]  # fmt: skip
        assert [f"claim/{n}" for n in allocated] == [claim_holder]
        # kubectl tessera quota counts the same, from the objects.
        out = run(h.env.kubeconfig, "quota", "-n", ns, "-o", "json")
        [row] = json.loads(out.stdout)["quotas"]
        assert row["memoryMiB"] == {"used": 16192, "hard": 20000}, row
        assert sorted(row["holders"]) == sorted([f"{ns}/ext", f"{ns}/{claim_holder}"])
        # The extender pod goes: its 8,000 MiB let one more claim in, not two.
        h.admin.delete(PODS, "ext", ns)
        wait_for("a second claim pod bound", lambda: len(bound()) == 2 and "ext" not in bound(),
                 120, 0.5)  # fmt: skip
        assert len([p for p in h.admin.list(PODS, ns).items if not p["spec"].get("nodeName")]) == 1
    finally:
        for name in made:
            with contextlib.suppress(NotFound):
                h.admin.delete(PODS, name, ns)
        h.admin.delete(GPUQUOTAS, "gpus", ns)


def test_claims_and_extender_pods_share_nodes_without_double_booking(world: World) -> None:
    h = world.h
    wait_for(
        "every agent's ResourceSlice",
        lambda: len([s for s in h.admin.list(RESOURCE_SLICES).items
                     if s["spec"]["driver"] == DRIVER]) >= NODE_COUNT,
        60,
    )  # fmt: skip
    claim_uuids = {c.uuid for n in world.nodes for c in n.cards if c.index >= 4}
    pods = _workload()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: h.admin.create(PODS, p, NS), pods))

    def settled() -> bool:
        live = world.view.all()
        return len(live) == len(pods) and all(
            p["spec"].get("nodeName") or unschedulable(p) for p in live
        )

    wait_for("every pod bound or refused by kube-scheduler", settled, 300, 1.0)
    live = {p["metadata"]["name"]: p for p in world.view.all()}
    slices = [s for s in h.admin.list(RESOURCE_SLICES).items if s["spec"]["driver"] == DRIVER]
    claims = h.admin.list(RESOURCE_CLAIMS, NS).items

    # 1. Claims: no device over its memory, compute or slots; only cards 4-7 handed out.
    assert _overcommitted(slices, claims) == []
    allocated = [(r["pool"], r["device"]) for r in _results(claims)]
    assert allocated and all(d in ("gpu-4", "gpu-5", "gpu-6", "gpu-7") for _, d in allocated)

    # 2. Extender path: nothing over-committed, and never a card of the claims path.
    ext = [p for n, p in live.items() if n.startswith("ext-")]
    _, problems = book_all(h.admin, ext)
    assert problems == []
    ext_uuids = {
        s.uuid
        for p in ext
        if (a := assignment_of(p)) is not None
        for c in a.containers
        for s in c.slices
    }
    assert ext_uuids and not ext_uuids & claim_uuids
    assert all(p["spec"].get("nodeName") for p in ext)  # 200 slices fit cards 0-3 easily

    # 3. Two cards on one NVLink island: both on one node, same island (all: one island).
    for name in (n for n in live if n.startswith("two-a100-") and live[n]["spec"].get("nodeName")):
        [claim] = [c for c in claims if c["metadata"]["ownerReferences"][0]["name"] == name]
        results = claim["status"]["allocation"]["devices"]["results"]
        assert len(results) == 2 and len({r["pool"] for r in results}) == 1
        assert results[0]["pool"].startswith("claim-")
        assert len({r["device"] for r in results}) == 2

    # 4. What cannot fit waits with kube-scheduler's reason.
    for name in ("huge-000", "huge-001"):
        pod = live[name]
        assert not pod["spec"].get("nodeName")
        [cond] = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert cond["reason"] == "Unschedulable"
        assert "cannot allocate all claims" in cond["message"], cond["message"]
    # Every claim that fits is allocated: a pending pod has no node with room for it.
    waiting = [n for n, p in live.items() if not p["spec"].get("nodeName")]
    assert {n: fits for n in waiting if (fits := _fits_now(n, slices, claims))} == {}
    assert len(waiting) < len(pods) // 4  # the mix is meant to mostly fit


def test_a_malformed_class_selector_is_refused_by_the_api_server(world: World) -> None:
    bad = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "broken.gpu.tessera.io"},
        "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.tessera.io" &&'}}]},
    }
    with pytest.raises(ApiError) as err:
        world.h.admin.create(DEVICE_CLASSES, bad)
    assert "spec.selectors[0].cel.expression" in err.value.message


def test_the_example_resourcequota_keeps_a_namespace_off_the_claims_path(world: World) -> None:
    # A GpuQuota counts extender-path pods only; examples/claims/quota-no-claims.yaml is
    # what docs/api.md gives a capped namespace so that claims cannot go around it.
    h, ns = world.h, "claims-closed"
    _apply(h, NAMESPACES, {"metadata": {"name": ns}})
    quota = yaml.safe_load((EXAMPLES / "quota-no-claims.yaml").read_text())
    _apply(h, RESOURCE_QUOTAS, quota, ns)
    name = quota["metadata"]["name"]
    # Until the quota controller has counted the namespace, admission refuses anything.
    wait_for("the quota controller to count the namespace",
             lambda: h.admin.get(RESOURCE_QUOTAS, name, ns).get("status", {}).get("hard"),
             60)  # fmt: skip
    classes = [d["metadata"]["name"] for d in deployed("device-classes.yaml")]
    assert sorted(quota["spec"]["hard"]) == sorted(
        f"{c}.deviceclass.resource.k8s.io/devices" for c in classes
    )  # every class the chart installs is closed
    for cls in classes:
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"slice-{cls.split('.')[0]}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": cls, "capacity": {"requests": {"memory": "1Gi"}}}}]}},
        }  # fmt: skip

        def refusal(claim: Obj = claim) -> ApiError | None:
            try:
                made = h.admin.create(RESOURCE_CLAIMS, claim, ns)
            except ApiError as exc:
                return exc
            # Admitted: the API server's quota admission had not seen the new quota yet
            # (its cache of a namespace's quotas lags the object; seen once under load).
            h.admin.delete(RESOURCE_CLAIMS, made["metadata"]["name"], ns)
            return None

        err = wait_for("the quota to refuse the claim", refusal, 60, 0.5)
        assert err.status == 403, err
        assert "exceeded quota: tessera-no-claims" in err.message, err.message
        assert f"{cls}.deviceclass.resource.k8s.io/devices" in err.message
        # The same claim where no such quota applies is admitted.
        made = h.admin.create(RESOURCE_CLAIMS, claim, NS)
        h.admin.delete(RESOURCE_CLAIMS, made["metadata"]["name"], NS)


def test_an_agents_slice_holds_still_while_its_cards_do(world: World) -> None:
    # The API server stores 40960Mi as 40Gi; the agent must read that as its own slice.
    name = slice_name(world.nodes[1].name)
    before = world.h.admin.get(RESOURCE_SLICES, name)
    time.sleep(3)  # three of the agent's health ticks
    assert (
        world.h.admin.get(RESOURCE_SLICES, name)["metadata"]["resourceVersion"]
        == (before["metadata"]["resourceVersion"])
    )


def test_an_idle_cluster_writes_nothing_but_leases(world: World) -> None:
    """With a card cordoned on each path, the agents and the extender leave the API server
    alone once all is written: a write loop (an agent once rewrote its slice every health
    tick) shows here as writes per second."""
    h, node = world.h, world.nodes[1]
    change_cordons(h.admin, node.name, ["1", "5"], cordon=True)
    try:
        wait_for("the agent to taint the cordoned claims card",
                 lambda: CORDONED_TAINT in json.dumps(h.admin.get(RESOURCE_SLICES,
                                                                  slice_name(node.name))),
                 30, 0.2)  # fmt: skip
        time.sleep(2)  # the writes the cordon caused land
        before = api_writes(h.admin)
        time.sleep(12)  # a dozen agent health ticks, two quota-writer rounds
        after = api_writes(h.admin)
    finally:
        change_cordons(h.admin, node.name, [], cordon=False)
    grew = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    assert set(grew) <= {"PUT leases"}, grew  # kwok's node leases, the leader's Lease


def test_an_agent_restarted_with_the_same_cards_writes_nothing(world: World) -> None:
    # A DaemonSet rollout restarts every agent at once: none may rewrite its slice.
    h, i = world.h, 3
    name = slice_name(world.nodes[i].name)
    before = h.admin.get(RESOURCE_SLICES, name)["metadata"]["resourceVersion"]
    world.agents[i].stop()
    root = Path(world.agents[i].cfg.state_dir).parent.parent
    world.agents[i] = _agent(h, root, world.nodes[i])
    world.agents[i].start()  # publishes once before it returns
    assert world.agents[i].slices is not None
    time.sleep(3)  # three health ticks
    assert world.agents[i].slices.writes == 0
    assert h.admin.get(RESOURCE_SLICES, name)["metadata"]["resourceVersion"] == before


def test_a_hand_edited_slice_is_written_back_by_its_agent(world: World) -> None:
    h = world.h
    name = slice_name(world.nodes[0].name)
    edited = h.admin.get(RESOURCE_SLICES, name)
    want = copy.deepcopy(edited["spec"]["devices"])
    edited["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1000Gi"
    h.admin.replace(RESOURCE_SLICES, edited)
    wait_for("the agent to write its slice back",
             lambda: h.admin.get(RESOURCE_SLICES, name)["spec"]["devices"] == want, 30)  # fmt: skip


def test_an_agent_token_writes_only_its_own_nodes_slice(world: World) -> None:
    # The chart's tessera-node-agent-slices policy (deploy/admission-policy.yaml), with a
    # token bound to an agent pod on claim-001, as kubelet gives the DaemonSet's pod.
    h = world.h
    pod = h.admin.create(PODS, {
        "metadata": {"name": "agent-claim-001"},
        "spec": {"nodeName": "claim-001", "serviceAccountName": "tessera-node-agent",
                 "containers": [{"name": "agent", "image": "busybox"}]},
    }, "tessera-system")  # fmt: skip
    try:
        agent_api = KubeClient.from_kubeconfig(
            str(h.token_kubeconfig("tessera-node-agent", bound_pod=pod))
        )
        own = agent_api.get(RESOURCE_SLICES, slice_name("claim-001"))
        agent_api.replace(RESOURCE_SLICES, own)  # its own node's: allowed
        other = agent_api.get(RESOURCE_SLICES, slice_name("claim-002"))
        with pytest.raises(ApiError) as err:
            agent_api.replace(RESOURCE_SLICES, other)
        assert "only the gpu.tessera.io ResourceSlice of its own node (claim-001)" in str(err.value)
        with pytest.raises(ApiError):
            agent_api.delete(RESOURCE_SLICES, slice_name("claim-002"))
        unbound = KubeClient.from_kubeconfig(str(h.token_kubeconfig("tessera-node-agent")))
        with pytest.raises(ApiError) as err:
            unbound.replace(RESOURCE_SLICES, h.admin.get(RESOURCE_SLICES, slice_name("claim-001")))
        assert "its token names no node" in str(err.value)
    finally:
        h.admin.delete(PODS, "agent-claim-001", "tessera-system")
