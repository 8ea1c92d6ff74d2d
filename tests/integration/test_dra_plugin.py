"""The node agent as a DRA kubelet plugin, over kubelet's real v1 gRPC protocols.

The test plays kubelet: it finds the registration socket, asks ``GetInfo`` and answers
``NotifyRegistrationStatus`` as kubelet's plugin watcher does, then calls
``NodePrepareResources`` / ``NodeUnprepareResources`` on the endpoint the agent named.
The API server's part (the Node, the ResourceSlice, the claims) is ``FakeKube``; the
same agent runs against the real API server in tests/e2e/scheduler/test_claims.py.
The agent's cards are split: card 0 on the extender path, card 1 on claims.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.claims.devices import (
    CAPACITY_SLOTS,
    CLAIMS_LABEL,
    DRIVER,
    UNHEALTHY_TAINT,
    slice_name,
)
from tessera.kube.errors import NotFound, Unavailable
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import NODES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.model.annotations import decode_inventory
from tessera.model.clusterspec import make_cards
from tessera.node.agent import Agent, AgentConfig
from tessera.node.cards.fake import FakeDiscovery
from tessera.node.dra.server import DraPluginServer
from tessera.node.dra.v1 import dra_pb2 as pb
from tessera.node.dra.v1 import dra_pb2_grpc as pbg
from tessera.node.dra.v1 import registration_pb2 as reg
from tessera.node.dra.v1 import registration_pb2_grpc as regg
from tessera.node.fakes import MemoryEvents, MemoryNode, MemoryPods
from tessera.node.formats.allowance import decode_allowance
from tessera.node.formats.limits import decode_limits
from tessera.node.formats.usage import CardTotals, encode_region
from tests._logs import logged
from tests.integration.agent_metrics import one, probe, scrape
from tests.integration.kubelet_double import KubeletDouble

NODE = "node-a"
AGENT_LOG = "tessera.node.agent"
RES = "tessera.io/gpu"
SLOTS = 6  # not the default 16: the slice and the node check must both use it
CARDS = make_cards(NODE, 2, "A100")
U0, U1 = CARDS[0].uuid, CARDS[1].uuid


@dataclass
class Env:
    root: Path
    kube: FakeKube
    node: MemoryNode
    discovery: FakeDiscovery
    kubelet: KubeletDouble
    agent: Agent

    def stub(self) -> pbg.DRAPluginStub:
        info = self.info()
        return pbg.DRAPluginStub(grpc.insecure_channel(f"unix://{info.endpoint}"))

    def info(self) -> reg.PluginInfo:
        [sock] = (self.root / "registry").glob("*.sock")
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            return regg.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5)

    def slice(self) -> dict[str, Any]:
        return self.kube.get(RESOURCE_SLICES, slice_name(NODE))


@pytest.fixture
def env() -> Iterator[Env]:
    root = Path(tempfile.mkdtemp(prefix="ts-dra-", dir="/tmp"))  # short: unix socket paths
    lib = root / "libvgpu-1.so"
    lib.write_bytes(b"\x7fELF fake libvgpu v1")
    kube = FakeKube()
    kube.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    kubelet = KubeletDouble(root / "dp", root / "pr" / "kubelet.sock", RES, seed=1)
    kubelet.start()
    node = MemoryNode()
    discovery = FakeDiscovery(CARDS)
    cfg = AgentConfig(
        node=NODE,
        resource=RES,
        plugin_dir=root / "dp",
        state_dir=root / "state",
        slots_per_card=SLOTS,
        libvgpu=lib,
        recovery_s=0.3,
        health_interval_s=0.05,
        claims_cards="1",
        dra_plugin_dir=root / "plugins",
        dra_registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        metrics_port=0,
        metrics_address="127.0.0.1",
    )
    pods = MemoryPods(RES, frozenset(c.uuid for c in CARDS))
    agent = Agent(cfg, discovery, pods, MemoryEvents(), node, None, kube=kube)
    agent.start()
    kubelet.wait_devices(SLOTS)
    yield Env(root, kube, node, discovery, kubelet, agent)
    agent.stop()
    kubelet.stop()
    shutil.rmtree(root, ignore_errors=True)


def _claim(kube: FakeKube, name: str, device: str, **consumed: str) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device,
              "shareID": f"share-{name}", "consumedCapacity": consumed}  # fmt: skip
    obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    return kube.seed(RESOURCE_CLAIMS, obj, "team")


def _ref(claim: dict[str, Any]) -> pb.Claim:
    m = claim["metadata"]
    return pb.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def test_cards_are_split_between_the_two_paths(env: Env) -> None:
    # Card 0: the device plugin and the inventory; card 1: the ResourceSlice only.
    assert env.kubelet.wait(lambda: {d.split("::")[0] for d in env.kubelet.devices} == {U0})
    assert [c.uuid for c in decode_inventory(NODE, env.node.text or "", 0, 0).cards] == [U0]
    spec = env.slice()["spec"]
    assert [d["attributes"]["uuid"]["string"] for d in spec["devices"]] == [U1]
    owner = env.slice()["metadata"]["ownerReferences"][0]
    assert owner["uid"] == env.kube.get(NODES, NODE)["metadata"]["uid"]


def test_the_nodes_label_names_the_claims_cards_and_a_bad_one_offers_none(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """Without --claims-cards the node's label decides; a label naming no card of the node
    is logged and offers nothing to claims, and the extender path keeps every card."""
    caplog.set_level(logging.INFO, logger=AGENT_LOG)
    env.agent.stop()
    cfg = replace(env.agent.cfg, claims_cards="")
    told = {
        "9": f"node {NODE}: label {CLAIMS_LABEL}: names card 9, which this node does not "
        "have (got '9'); no card goes to claims",
        "1": f"claims path on {NODE}: cards [1]",
    }
    for label, claims in (("9", set()), ("1", {U1})):
        env.kube.merge_patch(NODES, NODE, {"metadata": {"labels": {CLAIMS_LABEL: label}}})
        agent = Agent(cfg, env.discovery, env.agent.pods, MemoryEvents(), env.node, None,
                      kube=env.kube)  # fmt: skip
        caplog.clear()
        agent.start()
        try:
            assert agent.claim_cards == claims
            inventory = decode_inventory(NODE, env.node.text or "", 0, 0).cards
            assert {c.uuid for c in inventory} == {U0, U1} - claims
        finally:
            agent.stop()
        assert logged(caplog, AGENT_LOG)[0] == told[label]
    env.agent.start()


def test_registration_names_the_driver_and_the_v1_service(env: Env) -> None:
    info = env.info()
    assert (info.type, info.name) == ("DRAPlugin", DRIVER)
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert info.endpoint == str(env.root / "plugins" / DRIVER / "dra.sock")
    assert env.agent.metrics is not None
    registry = env.agent.metrics.registry

    def exported(plugin: str) -> tuple[float | None, float | None]:
        labels = {"node": NODE, "plugin": plugin}
        names = ("tessera_agent_registered", "tessera_agent_registration_failures_total")
        registered, failures = (registry.get_sample_value(n, labels) for n in names)
        return registered, failures

    assert exported("dra") == (0, 0)  # served, not yet taken by kubelet
    waiting = (503, f"kubelet has not registered the DRA driver {DRIVER}\n")
    assert probe(env.agent, "/readyz") == waiting
    assert probe(env.agent, "/healthz") == (200, "ok\n")
    [sock] = (env.root / "registry").glob("*.sock")
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = regg.RegistrationStub(ch)
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=5)
        assert env.agent.dra is not None and env.agent.dra.registered.is_set()
        assert exported("dra") == (1, 0)
        assert probe(env.agent, "/readyz") == (200, "ok\n")
        stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="no"), timeout=5
        )
    assert exported("dra") == (0, 1)
    assert probe(env.agent, "/readyz") == waiting


def test_stopping_removes_both_sockets_but_only_those_it_served(env: Env) -> None:
    """kubelet's plugin watcher learns the driver is gone when its registration socket
    goes; a server that never served (a failed start) leaves what is at its paths."""
    dra = env.agent.dra
    assert dra is not None
    served = (dra.registration_path, dra.socket_path)
    assert all(p.is_socket() for p in served)
    env.agent.stop()
    assert not any(p.exists() for p in served)
    other = DraPluginServer(dra.preparer, env.root / "other-plugins", env.root / "other-reg")
    for p in (other.registration_path, other.socket_path):
        p.parent.mkdir(parents=True)
        p.write_text("another agent's")
    other.stop()
    assert (
        other.registration_path.read_text() == other.socket_path.read_text() == ("another agent's")
    )
    env.agent.start()


def test_prepare_writes_the_limits_and_cdi_spec_and_unprepare_removes_them(env: Env) -> None:
    good = _claim(env.kube, "slice", "gpu-1", memory="8Gi", compute="30", slots="1")
    stale = _claim(env.kube, "stale", "gpu-1", memory="1Gi")
    stale_ref = _ref(stale)
    stale_ref.uid = "not-its-uid"
    extender_card = _claim(env.kube, "wrong-card", "gpu-0", memory="1Gi")
    req = pb.NodePrepareResourcesRequest(claims=[_ref(good), stale_ref, _ref(extender_card)])
    out = env.stub().NodePrepareResources(req, timeout=5)
    uid = good["metadata"]["uid"]
    answer = out.claims[uid]
    assert answer.error == ""
    [device] = answer.devices
    assert (device.pool_name, device.device_name, list(device.request_names)) == (
        NODE, "gpu-1", ["gpu"]
    )  # fmt: skip
    assert list(device.cdi_device_ids) == [f"gpu.tessera.io/claim={uid}"]
    assert device.share_id == "share-slice"
    # Each bad claim gets its own reason; the good one in the same batch is not failed.
    assert "deleted and made again" in out.claims["not-its-uid"].error
    assert not out.claims["not-its-uid"].devices
    assert (
        "device: must be a card this node offers (gpu-1)"
        in out.claims[extender_card["metadata"]["uid"]].error
    )
    limits_file = env.root / "state" / "claims" / uid / "etc" / "limits"
    [card] = decode_limits(limits_file.read_text()).cards
    assert (card.uuid, card.memory_mib, card.cores_percent) == (U1, 8192, 30)
    spec_file = env.root / "cdi" / f"gpu.tessera.io-claim_{uid}.json"
    spec = json.loads(spec_file.read_text())
    mounts = {
        m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]
    }
    assert mounts["/etc/tessera"] == str(limits_file.parent)
    # kubelet prepares again after its own restart: same bytes, nothing else touched.
    before = (limits_file.read_bytes(), spec_file.read_bytes())
    env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(good)]), timeout=5)
    assert (limits_file.read_bytes(), spec_file.read_bytes()) == before
    gone = env.stub().NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[_ref(good)]), timeout=5
    )
    assert gone.claims[uid].error == ""
    assert not spec_file.exists() and not limits_file.parent.parent.exists()


def test_the_agents_context_charge_reaches_a_claims_limits(env: Env) -> None:
    """--context-mib goes to claims as to allocations: libvgpu charges each context it."""
    env.agent.stop()
    env.agent.cfg.context_mib = 300
    env.agent.start()
    claim = _claim(env.kube, "ctx", "gpu-1", memory="2Gi", compute="10")
    out = env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(claim)]))
    assert out.claims[claim["metadata"]["uid"]].error == ""
    limits_file = env.root / "state" / "claims" / claim["metadata"]["uid"] / "etc" / "limits"
    assert decode_limits(limits_file.read_text()).context_mib == 300


def test_a_claim_the_api_server_does_not_have_is_an_error_not_a_crash(env: Env) -> None:
    ghost = pb.Claim(namespace="team", name="ghost", uid="u-ghost")
    out = env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[ghost]), timeout=5)
    assert "reading ResourceClaim team/ghost" in out.claims["u-ghost"].error


def test_a_sick_card_is_tainted_in_the_slice_and_comes_back(env: Env) -> None:
    gen = env.slice()["spec"]["pool"]["generation"]
    env.discovery.set_probe(U1, False)
    env.discovery.inject_xid(U1, 79)
    deadline = time.monotonic() + 5
    while "taints" not in env.slice()["spec"]["devices"][0] and time.monotonic() < deadline:
        time.sleep(0.05)
    spec = env.slice()["spec"]
    assert spec["devices"][0]["taints"][0]["key"] == UNHEALTHY_TAINT
    assert spec["pool"]["generation"] == gen + 1
    # The server stamped the taint's timeAdded: the slice as written is the agent's own,
    # so ten more health ticks write nothing and the taint keeps its time.
    time.sleep(10 * 0.05)
    assert env.slice()["spec"] == spec
    env.discovery.set_probe(U1, True)
    deadline = time.monotonic() + 5
    while "taints" in env.slice()["spec"]["devices"][0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "taints" not in env.slice()["spec"]["devices"][0]
    assert env.slice()["spec"]["pool"]["generation"] == gen + 2


def test_a_slice_write_the_api_server_refuses_is_retried_on_the_next_tick(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=AGENT_LOG)
    gen = env.slice()["spec"]["pool"]["generation"]
    env.kube.fail_next("replace", Unavailable(503, "ServiceUnavailable", "etcd is away"))
    env.discovery.set_probe(U1, False)
    deadline = time.monotonic() + 5
    while "taints" not in env.slice()["spec"]["devices"][0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert env.slice()["spec"]["devices"][0]["taints"][0]["key"] == UNHEALTHY_TAINT
    assert env.slice()["spec"]["pool"]["generation"] == gen + 1  # the refused write is no step
    assert logged(caplog, AGENT_LOG) == [f"could not write the ResourceSlice of {NODE}; will retry"]


def test_a_slice_edited_or_deleted_by_hand_is_written_back(env: Env) -> None:
    edited = env.slice()
    want = copy.deepcopy(edited["spec"]["devices"])
    edited["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1000Gi"
    env.kube.replace(RESOURCE_SLICES, edited)
    deadline = time.monotonic() + 5
    while env.slice()["spec"]["devices"] != want and time.monotonic() < deadline:
        time.sleep(0.05)
    assert env.slice()["spec"]["devices"] == want
    env.kube.delete(RESOURCE_SLICES, slice_name(NODE))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with contextlib.suppress(NotFound):
            if env.slice()["spec"]["devices"] == want:
                break
        time.sleep(0.05)
    assert env.slice()["spec"]["devices"] == want


def test_the_node_refuses_a_claim_that_would_overcommit_its_card(env: Env) -> None:
    # As if the scheduler had been shown more memory than the card has (40 GiB).
    first = _claim(env.kube, "first", "gpu-1", memory="30Gi", compute="50")
    second = _claim(env.kube, "second", "gpu-1", memory="20Gi", compute="10")
    stub = env.stub()
    ok = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(first)]), timeout=5)
    assert ok.claims[first["metadata"]["uid"]].error == ""
    out = stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_ref(second)]), timeout=5
    )
    error = out.claims[second["metadata"]["uid"]].error
    assert "to 51200 of 40960 MiB" in error and first["metadata"]["uid"] in error
    assert not (env.root / "state" / "claims" / second["metadata"]["uid"]).exists()
    # Prepared claims survive an agent restart: the check still counts the first one.
    env.agent.stop()
    env.agent.start()
    out = env.stub().NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_ref(second)]), timeout=5
    )
    assert "refused" in out.claims[second["metadata"]["uid"]].error
    env.stub().NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[_ref(first)]), timeout=5
    )
    out = env.stub().NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_ref(second)]), timeout=5
    )
    assert out.claims[second["metadata"]["uid"]].error == ""


def test_the_node_fills_a_card_to_its_edges_and_refuses_one_step_past(env: Env) -> None:
    """Memory to the card's 40,960 MiB, compute to 100 % and every slot the slice offers
    are the card's to give; one MiB, one percent or one holder more is refused, naming
    what it would take."""
    stub = env.stub()
    slots = int(env.slice()["spec"]["devices"][0]["capacity"][CAPACITY_SLOTS]["value"])
    assert slots == SLOTS

    def prepare(name: str, mib: int, cores: int) -> str:
        claim = _claim(env.kube, name, "gpu-1", memory=f"{mib}Mi", compute=str(cores))
        request = pb.NodePrepareResourcesRequest(claims=[_ref(claim)])
        return str(
            stub.NodePrepareResources(request, timeout=5).claims[claim["metadata"]["uid"]].error
        )

    assert prepare("a", 10240, 60) == "" and prepare("b", 20480, 40) == ""
    assert "to 30721 of 40960 MiB, 101 of 100 % compute" in prepare("c", 1, 1)
    small = [f"s{i}" for i in range(slots - 3)]
    assert all(prepare(name, 1, 0) == "" for name in small)
    used = 30720 + len(small)
    assert "to 40961 of 40960 MiB" in prepare("d", 40961 - used, 0)
    assert prepare("e", 40959 - used, 0) == ""  # every slot taken, one MiB left
    assert f"{slots + 1} of {slots} slots" in prepare("f", 1, 0)
    gone = env.kube.get(RESOURCE_CLAIMS, "s0", "team")
    stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[_ref(gone)]), timeout=5)
    assert prepare("g", 2, 0) == ""  # the last slot, to the card's last MiB


def test_the_exporter_shows_a_prepared_claim_on_its_card(env: Env) -> None:
    claim = _claim(env.kube, "watched", "gpu-1", memory="8Gi", compute="30")
    env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(claim)]))
    m = scrape(env.agent)
    assert one(m, "tessera_claim_memory_limit_bytes") == 8 << 30  # the one claim series
    assert one(m, "tessera_claim_memory_limit_bytes", namespace="team", claim="watched",
               uuid=U1) == 8 << 30  # fmt: skip
    allocated = {dict(ls)["uuid"]: v for (n, ls), v in m.items()
                 if n == "tessera_card_memory_allocated_bytes"}  # fmt: skip
    assert allocated == {U0: 0, U1: 8 << 30}
    env.stub().NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[_ref(claim)]))
    m = scrape(env.agent)
    assert not [n for n, _ in m if n.startswith("tessera_claim_")]
    assert [v for (n, _), v in m.items() if n == "tessera_card_memory_allocated_bytes"] == [0, 0]


def _pod_using(name: str, claim: str, phase: str = "Running") -> dict[str, Any]:
    """A pod on this node whose claim was made from a template (named in its status)."""
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"phase": phase,
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]},
    }  # fmt: skip


def test_claims_kubelet_never_unprepares_are_swept_once_the_api_lets_them_go(env: Env) -> None:
    # Five claims prepared on card 1, then kubelet loses its state: no unprepare comes.
    gone = _claim(env.kube, "gone", "gpu-1", memory="20Gi", compute="10")
    remade = _claim(env.kube, "remade", "gpu-1", memory="2Gi", compute="10")
    moved = _claim(env.kube, "moved", "gpu-1", memory="2Gi", compute="10")
    kept = _claim(env.kube, "kept", "gpu-1", memory="2Gi", compute="10")
    used = _claim(env.kube, "used", "gpu-1", memory="2Gi", compute="10")
    claims = [gone, remade, moved, kept, used]
    out = env.stub().NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_ref(c) for c in claims]), timeout=5
    )
    assert all(a.error == "" for a in out.claims.values())
    uid = {c["metadata"]["name"]: c["metadata"]["uid"] for c in claims}
    # 28 of 40 GiB held: a 20 GiB claim the scheduler placed is refused by the node.
    late = _claim(env.kube, "late", "gpu-1", memory="20Gi", compute="10")
    refused = env.stub().NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_ref(late)]), timeout=5
    )
    assert "refused" in refused.claims[late["metadata"]["uid"]].error
    env.kube.delete(RESOURCE_CLAIMS, "gone", "team")
    env.kube.delete(RESOURCE_CLAIMS, "remade", "team")
    _claim(env.kube, "remade", "gpu-1", memory="2Gi")  # same name, new UID
    elsewhere = copy.deepcopy(env.kube.get(RESOURCE_CLAIMS, "moved", "team"))
    elsewhere["status"]["allocation"]["devices"]["results"][0]["pool"] = "node-b"
    env.kube.merge_patch(RESOURCE_CLAIMS, "moved", {"status": elsewhere["status"]}, "team",
                         subresource="status")  # fmt: skip
    env.kube.delete(RESOURCE_CLAIMS, "used", "team")  # still used by a running pod here
    env.agent.pods.put(_pod_using("p-used", "used"))
    claims_dir = env.root / "state" / "claims"

    def spec_of(name: str) -> Path:
        return env.root / "cdi" / f"gpu.tessera.io-claim_{uid[name]}.json"

    # Young folders stay (a prepare may be in flight); at the production grace, all do.
    assert env.agent.sweep_claims(env.agent.cfg.cleanup_grace_s) == []
    # The API server cannot answer: nothing is removed on a guess.
    for _ in range(4):
        env.kube.fail_next("get", Unavailable(503, "ServiceUnavailable", "etcd is away"))
    assert env.agent.sweep_claims(0) == []
    assert sorted(env.agent.sweep_claims(0)) == sorted(uid[n] for n in ("gone", "remade", "moved"))
    assert sorted(p.name for p in claims_dir.iterdir()) == sorted([uid["kept"], uid["used"]])
    assert not spec_of("gone").exists() and spec_of("kept").exists() and spec_of("used").exists()
    # The freed room is the node's again.
    ok = env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(late)]))
    assert ok.claims[late["metadata"]["uid"]].error == ""
    # The pod that used the deleted claim finishes: now it goes too.
    env.agent.pods.put(_pod_using("p-used", "used", phase="Succeeded"))
    assert env.agent.sweep_claims(0) == [uid["used"]]
    assert not spec_of("used").exists() and spec_of("kept").exists()


def test_the_cleanup_loop_sweeps_claims_on_its_own(env: Env) -> None:
    """The loop, not a test's call, every cleanup_interval_s; at a grace of 0 it still
    keeps what a prepare is writing and what a pod uses (put while the loop runs)."""
    env.agent.stop()
    env.agent.cfg.cleanup_interval_s, env.agent.cfg.cleanup_grace_s = 0.05, 0.0
    env.agent.start()
    gone = _claim(env.kube, "gone", "gpu-1", memory="2Gi", compute="10")
    used = _claim(env.kube, "used", "gpu-1", memory="2Gi", compute="10")
    out = env.stub().NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[_ref(gone), _ref(used)]), timeout=5
    )
    assert all(a.error == "" for a in out.claims.values())
    env.agent.pods.put(_pod_using("p-used", "used"))
    env.kube.delete(RESOURCE_CLAIMS, "gone", "team")
    env.kube.delete(RESOURCE_CLAIMS, "used", "team")
    claims_dir = env.root / "state" / "claims"
    deadline = time.monotonic() + 5
    while (claims_dir / gone["metadata"]["uid"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.name for p in claims_dir.iterdir()] == [used["metadata"]["uid"]]


def test_a_prepare_that_never_finished_is_swept_but_a_spec_keeps_its_folder(env: Env) -> None:
    # The agent died between the folder and meta.json: kubelet's retry would write it
    # again, but the pod went meanwhile and none comes. A folder whose meta.json no longer
    # reads while its CDI spec is there may be in a container's use: it stays.
    claims_dir = env.root / "state" / "claims"
    (claims_dir / "u-half").mkdir(parents=True)
    (claims_dir / "u-half" / "limits").write_text("half")
    (claims_dir / "u-spec").mkdir()
    (claims_dir / "u-spec" / "meta.json").write_text("{not json")
    (env.root / "cdi").mkdir(exist_ok=True)
    spec = env.root / "cdi" / "gpu.tessera.io-claim_u-spec.json"
    spec.write_text("{}")
    assert env.agent.sweep_claims(env.agent.cfg.cleanup_grace_s) == []  # young: in flight
    assert env.agent.sweep_claims(0) == ["u-half"]
    assert sorted(p.name for p in claims_dir.iterdir()) == ["u-spec"] and spec.exists()


def test_an_agent_upgrade_keeps_the_library_a_prepared_claim_uses(env: Env) -> None:
    claim = _claim(env.kube, "kept", "gpu-1", memory="1Gi", compute="10")
    out = env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(claim)]))
    assert out.claims[claim["metadata"]["uid"]].error == ""
    [old] = (env.root / "state" / "lib").iterdir()
    env.agent.stop()
    new_lib = env.root / "libvgpu-2.so"
    new_lib.write_bytes(b"\x7fELF fake libvgpu v2")
    env.agent.cfg.libvgpu = new_lib
    env.agent.start()
    assert env.agent.allocator is not None
    env.agent.allocator.cleanup(grace_s=0)
    assert old.exists()  # the running claim's container still maps it
    env.stub().NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=[_ref(claim)]))
    env.agent.allocator.cleanup(grace_s=0)
    assert not old.exists() and len(list((env.root / "state" / "lib").iterdir())) == 1


def test_the_official_cdi_library_injects_what_the_limits_need(env: Env) -> None:
    # testenv/cdi: the CDI library of containerd >= 1.7 and CRI-O, over the spec we wrote.
    from tessera.testenv import ensure_binaries

    inject = ensure_binaries(["cdi"])["cdi-inject"]
    claim = _claim(env.kube, "cdi", "gpu-1", memory="2Gi", compute="20")
    out = env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(claim)]))
    [device] = out.claims[claim["metadata"]["uid"]].devices
    run = subprocess.run(
        [str(inject), f"--spec-dir={env.root / 'cdi'}", *device.cdi_device_ids],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    oci = json.loads(run.stdout)
    mounts = {m["destination"]: m for m in oci["mounts"]}
    limits = Path(mounts["/etc/tessera"]["source"]) / "limits"
    assert "ro" in mounts["/etc/tessera"]["options"]
    assert "ro" in mounts["/etc/ld.so.preload"]["options"]
    [card] = decode_limits(limits.read_text()).cards
    assert (card.uuid, card.memory_mib, card.cores_percent) == (U1, 2048, 20)
    assert f"NVIDIA_VISIBLE_DEVICES={U1}" in oci["process"]["env"]
    unknown = "gpu.tessera.io/claim=not-prepared"
    bad = subprocess.run(
        [str(inject), f"--spec-dir={env.root / 'cdi'}", unknown], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "unresolvable CDI devices" in bad.stderr


class _CountingApi:
    """The publisher's API with its calls counted (each health tick must cost none)."""

    def __init__(self, inner: FakeKube) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        return getattr(self.inner, name)


def test_a_health_tick_with_nothing_changed_costs_no_api_call(env: Env) -> None:
    assert env.agent.slices is not None
    counting = _CountingApi(env.kube)
    env.agent.slices.api = counting  # type: ignore[assignment]
    time.sleep(0.5)  # ten health ticks at 50 ms
    assert counting.calls == 0


def test_the_burst_share_coordinator_lends_idle_compute_to_a_claim(env: Env) -> None:
    # A burst-share claim (its class's GpuConfig) that is throttled all the time: the
    # coordinator lends it the card's idle compute, as it does an allocation's.
    claim = _claim(env.kube, "burst", "gpu-1", memory="1Gi", compute="30")
    params = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig",
              "computePolicy": "burst-share"}  # fmt: skip
    claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": params}}
    ]
    claim = env.kube.merge_patch(RESOURCE_CLAIMS, "burst", {"status": claim["status"]}, "team",
                                 subresource="status")  # fmt: skip
    out = env.stub().NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[_ref(claim)]))
    assert out.claims[claim["metadata"]["uid"]].error == ""
    folder = env.root / "state" / "claims" / claim["metadata"]["uid"]
    allowance = folder / "allowance" / "allowance"
    busy, percent = 0, {}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and percent.get(0, 0) <= 30:
        busy += 10**9
        region = encode_region(retired=(CardTotals(busy_ns=busy, throttled_ns=busy),))
        (folder / "usage" / "region").write_bytes(region)
        time.sleep(0.15)
        if allowance.exists():
            _, percent = decode_allowance(allowance.read_text())
    assert percent == {0: 100}  # alone on the card: all of it, above its floor of 30
