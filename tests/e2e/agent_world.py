"""The node agent on the real control plane, shared by its e2e tests: a kwok node whose
cards the agent publishes, the real kube-scheduler with the Tessera extender, and the
test kubelet (tests/integration/kubelet_double.py) speaking the device plugin and
pod-resources protocols to the agent (``tessera node-agent --backend fake``, a child
process) over unix sockets. The agent serves its exporter on ``World.metrics_port``.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.kube.client import KubeClient
from tessera.kube.errors import Conflict
from tessera.kube.kinds import NODES, PODS, Kind
from tessera.model import annotations
from tessera.model.annotations import decode_inventory
from tessera.model.types import NodeInventory
from tessera.testenv import TestEnv
from tessera.testenv.chart import kube_scheduler_config
from tessera.testenv.process import free_port
from tests.e2e.realnode import Child
from tests.integration.kubelet_double import KContainer, KPod, KubeletDouble

__all__ = ["NODE", "NS", "RES", "SLOTS", "World", "gpu_pod", "kpod", "world"]

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
        self.metrics_port = free_port()
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
                f"--metrics-port={self.metrics_port}",
                "--metrics-address=127.0.0.1",
            ],
        )
        self.extender: Child | None = None
        self.extender_port = 0

    def inventory(self) -> NodeInventory | None:
        node = self.api.get(NODES, NODE)
        text = (node["metadata"].get("annotations") or {}).get(annotations.INVENTORY)
        return decode_inventory(NODE, text, 0, 0) if text else None

    def pod(self, name: str) -> dict[str, Any]:
        return self.api.get(PODS, name, NS)


@pytest.fixture
def world(start_testenv: Any) -> Iterator[World]:
    port = free_port()
    cfg = kube_scheduler_config()
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
    w.extender_port = port
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
