"""Tessera installed with its Helm chart on the real node: the image built by
image/build.py (no registry, no daemon) and the stock kube-scheduler imported into the
node's containerd; `helm install --wait` brings up the scheduler pair, the webhook and the
node-agent DaemonSet as pods (real controller manager, in-cluster auth under the chart's
RBAC). A GPU pod created with no scheduler name is routed by the webhook, placed by the
chart's kube-scheduler and extender, and runs with exactly its slice; `kubectl tessera
top` and the GPU map page show it. The image also runs as its non-root user.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
import yaml

from tessera.kube import EVENTS, NODES, PODS, Kind
from tessera.testenv.chart import CHART, NAMESPACE, helm_on
from tessera.testenv.images import ImageConfig, ImageFile, build_gpu_probe, oci_archive
from tessera.testenv.process import free_port
from tessera.testenv.realnode import RealNode, missing_prerequisites
from tests.e2e.plugin import run
from tests.e2e.realnode import (
    CARDS,
    LIBVGPU_BUILD,
    NODE,
    NS,
    RealWorld,
    agent_registered,
    gpu_pod,
)
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
KUBE_SCHEDULER_IMAGE = "tessera.local/kube-scheduler:v1.36.3"
EXTENDER_PORT, WEBHOOK_PORT = 8888, 8443  # the chart's, on the host's network here
SCRIPT = "id -u; python3 -m tessera.cli version; python3 -m tessera.cli scheduler --help | head -3"


def _kube_scheduler_image(binaries: Any, folder: Path) -> Path:
    """The stock kube-scheduler (the testenv's build: static) as an image of one file."""
    dest = folder / "kube-scheduler.oci.tar"
    oci_archive(dest, KUBE_SCHEDULER_IMAGE,
                [ImageFile("/usr/local/bin/kube-scheduler", source=binaries["kube-scheduler"])],
                ImageConfig())  # fmt: skip
    return dest


def _build_image() -> tuple[Path, str]:
    tag = "e2e"
    done = subprocess.run([sys.executable, str(REPO / "image" / "build.py"),
                           "--name", f"{IMAGE}:{tag}"],
                          capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip()), tag


class ImageWorld(RealWorld):
    """RealWorld whose node agent is the image's, run by the chart's DaemonSet."""

    def __init__(self, env: Any, root: Path, archives: list[Path], tag: str) -> None:
        # RealWorld's own Child agent is made but never started.
        self.archives, self.tag = archives, tag
        self.metrics_port = free_port()  # the agent's /metrics, on the host's network
        super().__init__(env, root)

    def _start_node(self) -> RealNode:
        images = self.root / "images"
        probe_image = build_gpu_probe(images, LIBVGPU_BUILD)
        return RealNode.start(self.env, self.root / "node", name=NODE,
                              images=[probe_image, *self.archives])  # fmt: skip

    def helm_install(self) -> None:
        """The chart, installed by helm with the values a cluster without kube-proxy and
        cluster DNS needs (host network, the API server on the host's loopback)."""
        api, root = self.api, self.root
        api.merge_patch(NODES, NODE, {"metadata": {"labels": {"tessera.io/gpu-node": "true"}}})
        apiserver_port = self.env.server.rsplit(":", 1)[1]
        # No kube-proxy here: every pod reaches the API server on the host's loopback.
        env = [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
               {"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port}]  # fmt: skip
        values = {
            "image": {"repository": IMAGE, "tag": self.tag, "pullPolicy": "Never"},
            "scheduler": {"replicas": 1, "hostNetwork": True, "web": True, "extraEnv": env,
                          "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}},
            "kubeScheduler": {"image": KUBE_SCHEDULER_IMAGE, "replicas": 1, "hostNetwork": True,
                              "extenderURL": f"http://127.0.0.1:{EXTENDER_PORT}",
                              "extraEnv": env},
            "webhook": {"url": f"https://127.0.0.1:{WEBHOOK_PORT}"},
            "nodeAgent": {
                "backend": "fake",
                "hostNetwork": True,
                "metricsPort": self.metrics_port,
                "stateDir": str(self.state),
                "recoverySeconds": 1,
                "extraArgs": [f"--nodes={root / 'nodes.csv'}",
                              f"--fake-device-dir={self.devices}"],
                "extraEnv": env,
                "extraVolumes": [{"name": "world", "hostPath": {"path": str(root)}}],
                "extraVolumeMounts": [{"name": "world", "mountPath": str(root)}],
            },
        }  # fmt: skip
        values_file = root / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        try:
            helm_on(self.env.kubeconfig, "install", "tessera", str(CHART), "-n", NAMESPACE,
                    "--create-namespace", "-f", str(values_file), "--wait",
                    "--timeout", "4m")  # fmt: skip
        except subprocess.CalledProcessError as exc:
            raise AssertionError(f"{exc.stdout}\n{exc.stderr}\n{self.agent_log()}") from exc

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
            log = self.logs(p["metadata"]["name"], namespace=NAMESPACE)
        except Exception as exc:  # not started yet
            log = f"(no log: {exc})"
        return f"status: {yaml.safe_dump(p.get('status'))}\nevents: {events}\nlog:\n{log}"


@pytest.fixture(scope="module")
def world(testenv_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageWorld]:
    from tessera.testenv import TestEnv

    archive, tag = _build_image()
    # The testenv's own kube-scheduler serves the default profile only: GPU pods go to the
    # chart's kube-scheduler and its extender.
    env = TestEnv.start(tmp_path_factory.mktemp("image-cp"), binaries=testenv_binaries)
    root = Path(tempfile.mkdtemp(prefix="ts-img-", dir="/tmp"))
    root.chmod(0o755)
    w: ImageWorld | None = None
    try:
        scheduler_image = _kube_scheduler_image(testenv_binaries, root / "images")
        w = ImageWorld(env, root, [archive, scheduler_image], tag)
        w.helm_install()
        yield w
    finally:
        if w is not None:
            w.stop()
        env.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_helm_install_runs_tessera_and_a_gpu_pod_gets_its_slice(world: ImageWorld) -> None:
    w = world
    wait_for("the agent's slots on the node", w.slots_advertised, 60, 0.5, w.agent_log)
    for label in ("tessera-node-agent", "tessera-scheduler", "tessera-kube-scheduler"):
        [pod] = w.api.list(PODS, NAMESPACE, label_selector=f"app={label}").items
        assert pod["status"]["phase"] == "Running", (label, pod["status"])
        if label != "tessera-kube-scheduler":
            assert pod["spec"]["containers"][0]["image"] == f"{IMAGE}:{w.tag}"
    assert "registered with kubelet as tessera.io/gpu" in w.agent_log()
    assert agent_registered(w.metrics_port) == {"device-plugin": 1}  # the real kubelet took it
    # and the DaemonSet counts the agent ready on that, once kubelet's readiness probe
    # (every 5 s) has asked. helm --wait does not wait for it here: with one node and
    # maxUnavailable 1, helm expects 1 - 1 = 0 ready pods of a DaemonSet.
    with urlopen(f"http://127.0.0.1:{w.metrics_port}/readyz", timeout=10) as r:
        assert (r.status, r.read()) == (200, b"ok\n")
    daemonsets = Kind("apps/v1", "DaemonSet", "daemonsets", True)

    def ready() -> bool:
        ds = w.api.get(daemonsets, "tessera-node-agent", NAMESPACE)
        return bool(ds["status"].get("numberReady") == 1)

    wait_for("the agent's DaemonSet to count it ready", ready, 60, 0.5, w.agent_log)

    # No scheduler name: the chart's webhook routes the pod to the chart's kube-scheduler.
    probe = gpu_pod("helm-slice", 1500, 30, "tool_slice; echo rc=$?; sleep 600", w.devices)
    del probe["spec"]["schedulerName"]
    w.create(probe)
    assert w.wait_phase("helm-slice", ("Running", "Failed")) == "Running", w.diagnose("helm-slice")
    got = w.pod("helm-slice")
    assert got["spec"]["schedulerName"] == "tessera-scheduler"

    def sliced() -> str:
        out = w.logs("helm-slice")
        return out if "rc=" in out else ""

    out = wait_for("the probe's output", sliced, 30, 0.5)
    assert "rc=0" in out and "total_mib=1500" in out, out
    assert any(f"uuid={c.uuid}" in out for c in CARDS), out

    top = run(w.env.kubeconfig, "top", "-n", NS, "-o", "json").stdout
    held = [h for c in json.loads(top)["cards"] for h in c["holders"]]
    assert [(h["pod"], h["memoryMiB"], h["coresPercent"]) for h in held] == [
        ("helm-slice", 1500, 30)]  # fmt: skip
    with urlopen(f"http://127.0.0.1:{EXTENDER_PORT}/gpus.json", timeout=10) as r:
        page = json.load(r)
    assert [h["pod"] for n in page["nodes"] for c in n["cards"] for h in c["holders"]] == [
        "helm-slice"]  # fmt: skip
    w.delete("helm-slice")


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
