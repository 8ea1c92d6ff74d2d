"""The real-node world of the e2e tests: a control plane, one real node (kubelet +
containerd, testenv.realnode), ``tessera node-agent`` inside the node's namespace and
``tessera scheduler`` as kube-scheduler's extender. Pods run the GPU probe image, whose
fake driver sees the cards the agent's Allocate answer names (NVIDIA_VISIBLE_DEVICES)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tessera.kube import EVENTS, PODS, Kind
from tessera.kube.client import KubeClient
from tessera.kube.errors import Conflict, NotFound
from tessera.model.clusterspec import make_cards
from tessera.testenv import TestEnv
from tessera.testenv.images import GPU_PROBE_IMAGE, build_gpu_probe
from tessera.testenv.realnode import RealNode
from tests.e2e.scheduler.harness import scheduler_config
from tests.e2e.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
LIBVGPU_BUILD = REPO / "libvgpu" / "build"
NODE = "localhost"
CARDS = make_cards(NODE, 2, "A100")
NS = "default"
FAKE_DEVICES = "/var/run/tessera-fake-gpu"  # where the probe pods see the fake cards

__all__ = [
    "CARDS",
    "NODE",
    "NS",
    "PROBE",
    "Child",
    "RealWorld",
    "agent_registered",
    "gpu_pod",
    "probe_facts",
    "scheduler_config",
]


class Child:
    """A ``tessera`` sub-command as a child process (inside the node's namespace when
    ``node`` is given), restartable, with one log file per start."""

    def __init__(self, workdir: Path, name: str, argv: list[str], node: RealNode | None = None):
        self.workdir, self.name, self.argv, self.node = workdir, name, argv, node
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "tessera.cli", *self.argv]
        if self.node is not None:
            argv = self.node.nsenter(argv)
        with (self.workdir / f"{self.name}-{self.starts}.log").open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.workdir.glob(f"{self.name}-*.log")))


class RealWorld:
    def __init__(
        self,
        env: TestEnv,
        root: Path,
        extra_agent_args: list[str] | None = None,
        containerd: Path | None = None,
    ):
        self.env, self.root = env, root
        self.containerd = containerd  # None: Debian's (1.6); a built 1.7 applies CDI
        self.api = KubeClient.from_kubeconfig(str(env.kubeconfig))
        self.node = self._start_node()
        (root / "nodes.csv").write_text(
            f"sn,cpu_milli,memory_mib,gpu,model\n{NODE},96000,393216,{len(CARDS)},A100\n"
        )
        self.devices = root / "fake-gpu"  # the fake cards' files, as /dev/nvidia* would be
        self.devices.mkdir(mode=0o777)
        self.devices.chmod(0o777)
        self.state = root / "agent-state"
        self.agent = Child(
            root,
            "agent",
            [
                "node-agent",
                f"--node={NODE}",
                "--backend=fake",
                f"--nodes={root / 'nodes.csv'}",
                f"--fake-device-dir={self.devices}",
                f"--kubeconfig={env.kubeconfig}",
                f"--state-dir={self.state}",
                f"--libvgpu={LIBVGPU_BUILD / 'libvgpu.so'}",
                *(extra_agent_args or []),
            ],
            node=self.node,
        )
        self.extender: Child | None = None

    def _start_node(self) -> RealNode:
        images = self.root / "images"
        return RealNode.start(
            self.env,
            self.root / "node",
            name=NODE,
            images=[build_gpu_probe(images, LIBVGPU_BUILD)],
            containerd=self.containerd,
        )

    def start(self, extender_port: int) -> None:
        self.agent.start()
        self.start_extender(extender_port)
        self.wait_registered(1)
        wait_for("the agent's slots on the node", self.slots_advertised, 60, 0.2)

    def start_extender(self, extender_port: int) -> None:
        sa = Kind("v1", "ServiceAccount", "serviceaccounts", namespaced=True)
        with contextlib.suppress(Conflict):
            self.api.create(sa, {"metadata": {"name": "default"}}, NS)
        self.extender = Child(
            self.root,
            "extender",
            [
                "scheduler",
                f"--kubeconfig={self.env.kubeconfig}",
                "--host=127.0.0.1",
                f"--port={extender_port}",
                "--webhook-port=0",
                "--no-leader-elect",
            ],
        )
        self.extender.start()

    def wait_registered(self, times: int) -> None:
        """Until the agent has registered with kubelet ``times`` times in all (the moment
        kubelet admits GPU pods again after a restart of either)."""
        wait_for(
            f"the agent's registration #{times} with kubelet",
            lambda: self.agent.log().count("registered with kubelet as") >= times,
            60,
            0.1,
        )

    def slots_advertised(self) -> bool:
        node = self.api.get(Kind("v1", "Node", "nodes", False), NODE)
        return int((node.get("status") or {}).get("allocatable", {}).get("tessera.io/gpu", 0)) > 0

    def stop(self) -> None:
        for child in (self.extender, self.agent):
            if child is not None:
                child.stop()
        self.node.stop()

    # --- pods -------------------------------------------------------------------------

    def create(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.api.create(PODS, pod, NS)

    def pod(self, name: str) -> dict[str, Any]:
        return self.api.get(PODS, name, NS)

    def phase(self, name: str) -> str:
        try:
            return str((self.pod(name).get("status") or {}).get("phase", ""))
        except NotFound:
            return "Gone"

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout: float = 90) -> str:
        wait_for(f"pod {name} to be {'/'.join(phases)}", lambda: self.phase(name) in phases,
                 timeout, 0.1, lambda: self.diagnose(name))  # fmt: skip
        return self.phase(name)

    def logs(self, name: str, container: str | None = None, namespace: str = NS) -> str:
        from kubernetes import client

        api = self.env.api_client()
        try:
            core = client.CoreV1Api(api)
            return str(core.read_namespaced_pod_log(name, namespace, container=container))
        finally:
            api.close()

    def events(self, name: str) -> list[dict[str, Any]]:
        items = self.api.list(EVENTS, namespace=NS).items
        return [e for e in items if e.get("involvedObject", {}).get("name") == name]

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound):
            self.api.delete(PODS, name, NS)

    def diagnose(self, name: str) -> str:
        try:
            status = yaml.safe_dump(self.pod(name).get("status"))
        except NotFound:
            status = "(gone)"
        events = [(e.get("reason"), e.get("message")) for e in self.events(name)]
        tail = "\n".join(self.agent.log().splitlines()[-15:])
        return f"status:\n{status}\nevents: {events}\nagent log tail:\n{tail}"


def gpu_pod(
    name: str,
    memory: int,
    cores: int,
    script: str,
    devices: Path,
    *,
    restart: str = "Never",
    init_script: str | None = None,
    init_memory: int = 0,
) -> dict[str, Any]:
    """A pod of the probe image asking for one card's slice, running ``script`` in sh."""

    def container(cname: str, mib: int, run: str) -> dict[str, Any]:
        return {
            "name": cname,
            "image": GPU_PROBE_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", run],
            "env": [{"name": "FAKECUDA_DEVICE_DIR", "value": FAKE_DEVICES}],
            "volumeMounts": [{"name": "fake-gpu", "mountPath": FAKE_DEVICES}],
            "resources": {
                "limits": {
                    "tessera.io/gpu": "1",
                    "tessera.io/gpu-memory": str(mib),
                    "tessera.io/gpu-cores": str(cores),
                }
            },
        }

    spec: dict[str, Any] = {
        "schedulerName": "tessera-scheduler",
        "hostNetwork": True,
        "automountServiceAccountToken": False,
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "containers": [container("main", memory, script)],
        "volumes": [{"name": "fake-gpu", "hostPath": {"path": str(devices)}}],
    }
    if init_script is not None:
        spec["initContainers"] = [container("setup", init_memory, init_script)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


# The probe image's report of the slice it sees through libvgpu (over the fake driver).
SLICE = re.compile(r"card (\d+) uuid=(\S+) total_mib=(\d+) free_mib=(\d+)")
FILL = re.compile(r"fill (\d+) ok=(\d+) oom=(\d)")
PROBE = (
    "tool_slice; echo rc=$?; "
    "if (echo x >> /etc/tessera/limits) 2>/dev/null; then echo limits=writable; "
    "else echo limits=read-only; fi; "
    "echo preload=$(cat /etc/ld.so.preload); echo visible=$NVIDIA_VISIBLE_DEVICES"
)


def probe_facts(out: str) -> dict[str, str]:
    """What PROBE printed, parsed: its key=value lines, the card it sees and the fill."""
    facts = dict(line.split("=", 1) for line in out.splitlines() if line.count("=") == 1)
    (m,) = SLICE.findall(out)
    (f,) = FILL.findall(out)
    facts.update(uuid=m[1], total_mib=m[2], free_mib=m[3], filled=f[1], oom=f[2])
    return facts


def agent_registered(metrics_port: int | str) -> dict[str, float]:
    """tessera_agent_registered by plugin, from the agent's /metrics on this host."""
    with urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.labels["plugin"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "tessera_agent_registered"}  # fmt: skip
