"""The node agent on the real control plane: inventory, a burst placed by the real
kube-scheduler + Tessera extender, allocated by the test kubelet in kubelet's order,
with an agent restart and a kubelet restart in the middle; bad input; health.

The agent runs as ``tessera node-agent --backend fake`` (a child process) for a kwok
node that starts with no inventory; the test kubelet (tests/integration/kubelet_double.py)
speaks the device plugin and pod-resources protocols to it over unix sockets.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tessera.kube.client import KubeClient
from tessera.kube.errors import Conflict
from tessera.kube.kinds import EVENTS, NODES, PODS, Kind
from tessera.model import annotations
from tessera.model.annotations import decode_assignment, decode_inventory
from tessera.model.types import NodeInventory
from tessera.node.formats.layout import CONTAINER_ETC_DIR
from tessera.node.formats.limits import decode_limits, limits_for
from tessera.testenv import TestEnv
from tessera.testenv.process import free_port
from tests.e2e.realnode import Child
from tests.e2e.wait import wait_for
from tests.integration.kubelet_double import AdmissionError, KContainer, KPod, KubeletDouble

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NODE = "gpu-agent-0"
RES = "tessera.io/gpu"
SLOTS = 16
NS = "default"


class World:
    def __init__(self, env: TestEnv, root: Path, api: KubeClient) -> None:
        self.env, self.root, self.api = env, root, api
        self.kubelet = KubeletDouble(root / "dp", root / "pr" / "kubelet.sock", RES, seed=7)
        lib = root / "libvgpu.so"
        lib.write_bytes(b"e2e libvgpu")
        (root / "faults").mkdir()
        self.agent = Child(
            root,
            "agent",
            [
                "node-agent",
                f"--node={NODE}",
                "--backend=fake",
                f"--nodes={root / 'nodes.csv'}",
                f"--fault-dir={root / 'faults'}",
                f"--kubeconfig={env.kubeconfig}",
                f"--plugin-dir={root / 'dp'}",
                f"--pod-resources={root / 'pr' / 'kubelet.sock'}",
                f"--state-dir={root / 'state'}",
                f"--slots-per-card={SLOTS}",
                f"--libvgpu={lib}",
                "--recovery-s=1",
            ],
        )
        self.extender: Child | None = None

    def inventory(self) -> NodeInventory | None:
        node = self.api.get(NODES, NODE)
        text = (node["metadata"].get("annotations") or {}).get(annotations.INVENTORY)
        return decode_inventory(NODE, text, 0, 0) if text else None

    def pod(self, name: str) -> dict[str, Any]:
        return self.api.get(PODS, name, NS)


@pytest.fixture
def world(start_testenv: Any) -> Iterator[World]:
    port = free_port()
    cfg = yaml.safe_load((REPO / "deploy" / "kube-scheduler-config.yaml").read_text())
    cfg.pop("leaderElection", None)
    cfg["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    env: TestEnv = start_testenv(scheduler_config=cfg, controller_manager=False)
    # unix socket paths are limited to 107 bytes: a short folder.
    root = Path(tempfile.mkdtemp(prefix="ts-e2e-", dir="/tmp"))
    (root / "nodes.csv").write_text(
        f"sn,cpu_milli,memory_mib,gpu,model\n{NODE},96000,393216,4,A100\n"
    )
    # The kwok node starts with no cards: the agent publishes them.
    env.create_gpu_nodes([NodeInventory(NODE, (), 96000, 393216)])
    api = KubeClient.from_kubeconfig(str(env.kubeconfig))
    # Pods need the namespace's default ServiceAccount; no controller manager makes it here.
    sa = Kind("v1", "ServiceAccount", "serviceaccounts", namespaced=True)
    with contextlib.suppress(Conflict):
        api.create(
            sa, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}, NS
        )
    w = World(env, root, api)
    w.kubelet.start()
    w.extender = Child(
        root,
        "extender",
        [
            "scheduler",
            f"--kubeconfig={env.kubeconfig}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--webhook-port=0",
            "--no-leader-elect",
        ],
    )
    try:
        w.agent.start()
        w.extender.start()
        yield w
    finally:
        w.agent.stop()
        if w.extender is not None:
            w.extender.stop()
        w.kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def gpu_pod(name: str, memory: int, cores: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "tessera-scheduler",
        "containers": [
            {
                "name": "main",
                "image": "cuda",
                "resources": {
                    "limits": {
                        RES: "1",
                        "tessera.io/gpu-memory": str(memory),
                        "tessera.io/gpu-cores": str(cores),
                    }
                },
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def kpod(obj: dict[str, Any]) -> KPod:
    meta = obj["metadata"]
    return KPod(
        NS,
        meta["name"],
        meta["uid"],
        [
            KContainer(c["name"], int(c["resources"]["limits"][RES]))
            for c in obj["spec"]["containers"]
        ],
    )


def test_burst_on_an_agent_node_with_restarts_in_the_middle(world: World) -> None:
    w = world
    inv = wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    assert len(inv.cards) == 4 and all(c.healthy for c in inv.cards)
    w.kubelet.wait_devices(4 * SLOTS, timeout=30)

    names = [f"burst-{i:02d}" for i in range(12)]
    for i, name in enumerate(names):
        w.api.create(PODS, gpu_pod(name, memory=1000 + 250 * i, cores=5 + i), NS)

    def placed() -> list[dict[str, Any]] | None:
        pods = [w.pod(n) for n in names]
        ok = all(
            p["spec"].get("nodeName") == NODE
            and annotations.ASSIGNMENT in (p["metadata"].get("annotations") or {})
            for p in pods
        )
        return pods if ok else None

    try:
        pods = wait_for("the burst to be bound with assignments", placed, timeout=120)
    except BaseException:
        p0 = w.pod(names[0])
        ext = w.extender.log()[-4000:] if w.extender else ""
        raise AssertionError(
            f"{names[0]} status: {p0.get('status')}\nextender log:\n{ext}\n"
            f"kube-scheduler log:\n{w.env.log('kube-scheduler').read_text()[-3000:]}"
        ) from None
    per_card: dict[str, int] = {}
    for p in pods:
        text = p["metadata"]["annotations"][annotations.ASSIGNMENT]
        for s in decode_assignment("-", text).containers[0].slices:
            per_card[s.uuid] = per_card.get(s.uuid, 0) + 1
    assert max(per_card.values()) >= 2  # pending pods hold different slices of one card
    # kubelet admits oldest first.
    pods.sort(key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
    for n, p in enumerate(pods):
        if n == 4:  # agent restart in the middle
            w.agent.stop()
            w.agent.start()
            regs = len(w.kubelet.registrations)
            wait_for("re-registration", lambda r=regs: len(w.kubelet.registrations) > r)
            w.kubelet.wait_devices(4 * SLOTS, timeout=30)
        if n == 8:  # kubelet restart in the middle
            w.kubelet.restart()
            w.kubelet.wait_devices(4 * SLOTS, timeout=30)
        started = w.kubelet.run(kpod(p))
        meta = p["metadata"]
        assignment = decode_assignment(
            f"{NS}/{meta['name']}", meta["annotations"][annotations.ASSIGNMENT]
        )
        (ca,) = assignment.containers
        (s,) = started
        uuids = [x.uuid for x in ca.slices]
        assert s.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
        assert [d.split("::")[0] for d in s.devices] == uuids
        host = Path(s.mount(CONTAINER_ETC_DIR).host_path)
        assert decode_limits((host / "limits").read_text()) == limits_for(ca, card_order=uuids)
    # No slot was handed to two containers.
    held = [d for ids in w.kubelet.pod_devices.values() for d in ids]
    assert len(held) == len(set(held)) == len(names)


def test_bad_input_gets_a_clear_error_and_an_event(world: World) -> None:
    w = world
    wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    w.kubelet.wait_devices(4 * SLOTS, timeout=30)
    # Bound straight to the node, around the scheduler: no assignment.
    created = w.api.create(PODS, gpu_pod("rogue", 1000, 10, node=NODE), NS)
    with pytest.raises(AdmissionError) as info:
        w.kubelet.run(kpod(created))
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{NS}/rogue" in str(info.value) and annotations.ASSIGNMENT in str(info.value)

    def event() -> list[dict[str, Any]]:
        items = w.api.list(EVENTS, NS).items
        return [e for e in items if e["involvedObject"].get("name") == "rogue"]

    (ev,) = wait_for("a Warning Event on the pod", event, timeout=30)
    assert ev["type"] == "Warning" and annotations.ASSIGNMENT in ev["message"]
    # A malformed annotation on a bound pod: same, with the decoder's message.
    bad = gpu_pod("garbled", 1000, 10, node=NODE)
    bad["metadata"]["annotations"] = {annotations.ASSIGNMENT: "{not json"}
    created = w.api.create(PODS, bad, NS)
    with pytest.raises(AdmissionError, match="not valid JSON"):
        w.kubelet.run(kpod(created))
    # The agent is still serving.
    assert w.agent.proc is not None and w.agent.proc.poll() is None


def test_xid_marks_the_card_unhealthy_in_the_inventory_and_it_recovers(world: World) -> None:
    w = world
    inv = wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    w.kubelet.wait_devices(4 * SLOTS, timeout=30)
    uuid = inv.cards[2].uuid
    (w.root / "faults" / "probe-fail").write_text(uuid + "\n")
    with (w.root / "faults" / "xid").open("a") as f:
        f.write(f"{uuid} 79\n")

    def health() -> list[bool]:
        i = w.inventory()
        return [c.healthy for c in i.cards] if i else []

    wait_for("the card Unhealthy in the inventory", lambda: health() == [True, True, False, True])
    assert w.kubelet.health_of(uuid) == {"Unhealthy"}
    (w.root / "faults" / "probe-fail").write_text("")
    wait_for("the card Healthy again", lambda: all(health()) and len(health()) == 4)
    assert w.kubelet.wait(lambda: w.kubelet.health_of(uuid) == {"Healthy"}, timeout=10)
