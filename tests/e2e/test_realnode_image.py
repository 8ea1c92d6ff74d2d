"""Tessera's image on the real node: built by image/build.py (no registry, no daemon),
imported into the node's containerd, and run as the chart's node-agent DaemonSet (created
by the real controller manager's DaemonSet controller, placed by kube-scheduler) under its
own service account's RBAC. A GPU pod placed by the extender then runs with exactly its
slice; the same image runs the scheduler's command as the non-root user.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient

from tessera.kube import EVENTS, NODES, PODS, Kind
from tessera.testenv.chart import NAMESPACE, render
from tessera.testenv.images import build_gpu_probe
from tessera.testenv.process import free_port
from tessera.testenv.realnode import RealNode, missing_prerequisites
from tests.e2e.realnode import CARDS, LIBVGPU_BUILD, NODE, NS, RealWorld, gpu_pod
from tests.e2e.scheduler.harness import scheduler_config
from tests.e2e.wait import wait_for

_MISSING = missing_prerequisites() + [
    f"{tool} (Debian package)" for tool in ("mmdebstrap", "umoci") if shutil.which(tool) is None
]
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(bool(_MISSING), reason="; ".join(_MISSING)),
]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "tessera.local/tessera"
NAMESPACES = Kind("v1", "Namespace", "namespaces", False)
SCRIPT = "id -u; python3 -m tessera.cli version; python3 -m tessera.cli scheduler --help | head -3"


def _build_image() -> tuple[Path, str]:
    tag = "e2e"
    done = subprocess.run([sys.executable, str(REPO / "image" / "build.py"),
                           "--name", f"{IMAGE}:{tag}"],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip()), tag


class ImageWorld(RealWorld):
    """RealWorld whose node agent is the image's, run by the chart's DaemonSet."""

    def __init__(self, env: Any, root: Path, archive: Path, tag: str) -> None:
        # RealWorld's own Child agent is made but never started.
        self.archive, self.tag = archive, tag
        super().__init__(env, root)

    def _start_node(self) -> RealNode:
        images = self.root / "images"
        probe_image = build_gpu_probe(images, LIBVGPU_BUILD)
        return RealNode.start(self.env, self.root / "node", name=NODE,
                              images=[probe_image, self.archive])  # fmt: skip

    def start_agent_daemonset(self) -> None:
        api, root = self.api, self.root
        api.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        api.merge_patch(NODES, NODE, {"metadata": {"labels": {"tessera.io/gpu-node": "true"}}})
        apiserver_port = self.env.server.rsplit(":", 1)[1]
        values = {
            "image": {"repository": IMAGE, "tag": self.tag, "pullPolicy": "Never"},
            "nodeAgent": {
                "backend": "fake",
                "hostNetwork": True,
                "metricsPort": free_port(),
                "stateDir": str(self.state),
                "recoverySeconds": 1,
                "extraArgs": [f"--nodes={root / 'nodes.csv'}",
                              f"--fake-device-dir={self.devices}"],
                # No kube-proxy here: the API server is reached on the host's loopback.
                "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                             {"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port}],
                "extraVolumes": [{"name": "world", "hostPath": {"path": str(root)}}],
                "extraVolumeMounts": [{"name": "world", "mountPath": str(root)}],
            },
        }  # fmt: skip
        values_file = root / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        dyn = DynamicClient(self.env.api_client())
        for template in ("rbac.yaml", "node-agent.yaml"):
            text = render(show_only=f"templates/{template}", extra=["-f", str(values_file)])
            for doc in (d for d in yaml.safe_load_all(text) if d):
                if template == "rbac.yaml" and "node-agent" not in doc["metadata"]["name"]:
                    continue  # the agent's account only: least privilege is what is tested
                resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
                resource.create(body=doc, namespace=doc["metadata"].get("namespace"))

    def agent_pod(self) -> dict[str, Any] | None:
        pods = self.api.list(PODS, NAMESPACE, label_selector="app=tessera-node-agent").items
        return pods[0] if pods else None

    def agent_log(self) -> str:
        """The agent pod's status, the namespace's events and the pod's log, for a failure."""
        p = self.agent_pod()
        if p is None:
            ds = self.api.list(Kind("apps/v1", "DaemonSet", "daemonsets", True), NAMESPACE).items
            return f"no agent pod; DaemonSets: {[d.get('status') for d in ds]}"
        events = [(e.get("reason"), e.get("message"))
                  for e in self.api.list(EVENTS, NAMESPACE).items]  # fmt: skip
        try:
            log = self.logs_in(p["metadata"]["name"], NAMESPACE)
        except Exception as exc:  # not started yet
            log = f"(no log: {exc})"
        return f"status: {yaml.safe_dump(p.get('status'))}\nevents: {events}\nlog:\n{log}"

    def logs_in(self, name: str, namespace: str) -> str:
        from kubernetes import client

        api = self.env.api_client()
        try:
            return str(client.CoreV1Api(api).read_namespaced_pod_log(name, namespace))
        finally:
            api.close()


@pytest.fixture(scope="module")
def world(testenv_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageWorld]:
    from tessera.testenv import TestEnv

    archive, tag = _build_image()
    port = free_port()
    cfg = scheduler_config(port)
    # The DaemonSet's pod goes to the default profile (the extender sees GPU pods only).
    cfg["profiles"].append({"schedulerName": "default-scheduler"})
    env = TestEnv.start(tmp_path_factory.mktemp("image-cp"), binaries=testenv_binaries,
                        scheduler_config=cfg)  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="ts-img-", dir="/tmp"))
    root.chmod(0o755)
    w: ImageWorld | None = None
    try:
        w = ImageWorld(env, root, archive, tag)
        w.start_agent_daemonset()
        w.start_extender(port)
        yield w
    finally:
        if w is not None:
            w.stop()
        env.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_image_runs_the_agent_daemonset_and_a_gpu_pod_gets_its_slice(
    world: ImageWorld,
) -> None:
    w = world

    def running() -> bool:
        p = w.agent_pod()
        return bool(p and (p.get("status") or {}).get("phase") == "Running")

    wait_for("the DaemonSet's agent pod Running", running, 120, 0.5, w.agent_log)
    wait_for("the agent's slots on the node", w.slots_advertised, 60, 0.5, w.agent_log)
    pod = w.agent_pod()
    assert pod is not None
    assert pod["spec"]["containers"][0]["image"] == f"{IMAGE}:{w.tag}"
    assert "registered with kubelet as tessera.io/gpu" in w.agent_log()

    probe = "tool_slice; echo rc=$?"
    w.create(gpu_pod("img-slice", 1500, 30, probe, w.devices))
    assert w.wait_phase("img-slice", ("Succeeded", "Failed")) == "Succeeded", w.diagnose(
        "img-slice"
    )
    out = w.logs("img-slice")
    w.delete("img-slice")
    assert "rc=0" in out and "total_mib=1500" in out, out
    assert any(f"uuid={c.uuid}" in out for c in CARDS), out


def test_the_image_runs_the_scheduler_command_as_non_root(world: ImageWorld) -> None:
    w = world
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "img-version"},
        "spec": {"restartPolicy": "Never", "hostNetwork": True, "nodeName": NODE,
                 "automountServiceAccountToken": False,
                 "containers": [{"name": "tessera", "image": f"{IMAGE}:{w.tag}",
                                 "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", SCRIPT]}]},
    }  # fmt: skip
    w.api.create(PODS, pod, NS)
    assert w.wait_phase("img-version", ("Succeeded", "Failed")) == "Succeeded", w.diagnose(
        "img-version"
    )
    out = w.logs("img-version")
    w.delete("img-version")
    lines = out.splitlines()
    assert lines[0] == "65532" and lines[1] == "0.1.0", out
    assert "scheduler" in out
