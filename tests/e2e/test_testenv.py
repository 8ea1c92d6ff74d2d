"""The test control plane itself: nodes go Ready, pods get scheduled and run, teardown
leaves nothing behind, a scheduler config reaches kube-scheduler, and 500 nodes come up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tessera.model.annotations import INVENTORY, decode_inventory
from tessera.model.clusterspec import synthetic_nodes
from tessera.testenv import TestEnv, extender
from tessera.testenv.process import pid_alive, port_in_use
from tests.e2e.wait import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def core(testenv: TestEnv) -> Iterator[client.CoreV1Api]:
    api = testenv.api_client()
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


def cpu_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}},
                }
            ],
            **spec,
        },
    }


def say(capsys: pytest.CaptureFixture[str], message: str) -> None:
    """Print a measurement past pytest's capture (timings are reported, never asserted)."""
    with capsys.disabled():
        print(f"\n[measured] {message}")


def test_gpu_node_goes_ready_with_capacity_labels_and_inventory(
    testenv: TestEnv, core: client.CoreV1Api
) -> None:
    (inv,) = synthetic_nodes(1, 4, "A100", prefix="ready")
    testenv.create_gpu_nodes([inv], wait_ready=False)

    def ready() -> client.V1Node | None:
        node = core.read_node(inv.name)
        conds = {c.type: c.status for c in node.status.conditions or []}
        return node if conds.get("Ready") == "True" else None

    node = wait_for("node Ready through kwok", ready)
    alloc = node.status.allocatable
    assert alloc["tessera.io/gpu"] == "4"
    assert alloc["tessera.io/gpu-memory"] == str(4 * 40960)
    assert alloc["tessera.io/gpu-cores"] == "400"
    assert alloc["cpu"] == "96"
    assert node.metadata.labels["tessera.io/gpu-model"] == "A100"
    # The annotation decodes with the core's codec to the very cards we created.
    decoded = decode_inventory(inv.name, node.metadata.annotations[INVENTORY], 0, 0)
    assert decoded.cards == inv.cards


def test_cpu_pod_is_scheduled_by_kube_scheduler_and_runs(
    testenv: TestEnv, core: client.CoreV1Api
) -> None:
    (inv,) = synthetic_nodes(1, 0, "A100", prefix="cpu")
    testenv.create_gpu_nodes([inv])
    core.create_namespaced_pod("default", cpu_pod("plain", nodeSelector={"type": "kwok"}))

    def running() -> client.V1Pod | None:
        pod = core.read_namespaced_pod("plain", "default")
        return pod if pod.status.phase == "Running" else None

    pod = wait_for("pod Running", running)
    assert pod.spec.node_name is not None
    assert pod.spec.node_name.startswith(("cpu-", "ready-"))
    events = core.list_namespaced_event(
        "default", field_selector="involvedObject.name=plain,reason=Scheduled"
    ).items
    assert events, "no Scheduled event: the pod was not bound by kube-scheduler"
    assert events[0].reporting_component == "default-scheduler" or (
        events[0].source is not None and events[0].source.component == "default-scheduler"
    )


def test_pod_that_fits_nowhere_stays_pending(testenv: TestEnv, core: client.CoreV1Api) -> None:
    big = cpu_pod("too-big")
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "100000"
    core.create_namespaced_pod("default", big)

    def unschedulable() -> bool:
        pod = core.read_namespaced_pod("too-big", "default")
        conds = {c.type: c for c in pod.status.conditions or []}
        c = conds.get("PodScheduled")
        return c is not None and c.status == "False" and c.reason == "Unschedulable"

    wait_for("PodScheduled=False/Unschedulable", unschedulable)
    assert core.read_namespaced_pod("too-big", "default").spec.node_name is None


def test_controller_manager_runs_deployments(testenv: TestEnv) -> None:
    api = testenv.api_client()
    try:
        apps = client.AppsV1Api(api)
        core = client.CoreV1Api(api)
        testenv.create_gpu_nodes(synthetic_nodes(1, 0, "A100", prefix="deploy"))
        labels = {"app": "web"}
        apps.create_namespaced_deployment(
            "default",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": cpu_pod("x")["spec"],
                    },
                },
            },
        )

        def two_running() -> bool:
            pods = core.list_namespaced_pod("default", label_selector="app=web").items
            return sum(p.status.phase == "Running" for p in pods) == 2

        wait_for("2 deployment pods Running", two_running)
    finally:
        api.close()


class _Extender(BaseHTTPRequestHandler):
    """A scheduler extender that refuses every node except the one named ``allowed``."""

    allowed = ""
    calls: list[str] = []  # noqa: RUF012

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(self.path)
        names = body.get("NodeNames") or [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        failed = {n: "refused by test extender" for n in names if n != self.allowed}
        result = {"NodeNames": [n for n in names if n == self.allowed], "FailedNodes": failed}
        data = json.dumps(result).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_scheduler_config_names_an_extender_that_kube_scheduler_calls(start_testenv: Any) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Extender)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        entry = extender(url, prioritize_verb=None, bind_verb=None, node_cache_capable=True)
        env: TestEnv = start_testenv(
            scheduler_config={"extenders": [entry]}, controller_manager=False
        )
        nodes = synthetic_nodes(3, 2, "T4", prefix="ext")
        _Extender.allowed = nodes[2].name
        _Extender.calls = []
        env.create_gpu_nodes(nodes)
        api = env.api_client()
        try:
            core = client.CoreV1Api(api)
            core.create_namespace({"metadata": {"name": "t"}})
            core.create_namespaced_service_account("t", {"metadata": {"name": "default"}})
            pod = cpu_pod("gpu-pod")
            pod["spec"]["automountServiceAccountToken"] = False
            pod["spec"]["containers"][0]["resources"]["limits"] = {"tessera.io/gpu": "1"}
            core.create_namespaced_pod("t", pod)
            bound = wait_for(
                "pod bound",
                lambda: core.read_namespaced_pod("gpu-pod", "t").spec.node_name,
            )
        finally:
            api.close()
        assert bound == nodes[2].name
        assert "/filter" in _Extender.calls
    finally:
        server.shutdown()
        server.server_close()


def test_restart_scheduler_applies_new_config(testenv: TestEnv) -> None:
    old_pid = testenv.processes["kube-scheduler"].pid
    testenv.restart_scheduler({"percentageOfNodesToScore": 50})
    assert not pid_alive(old_pid)
    assert testenv.processes["kube-scheduler"].alive()
    text = (testenv.state_dir / "scheduler-config.yaml").read_text()
    assert "percentageOfNodesToScore: 50" in text
    assert "leaderElect: false" in text


def test_stop_leaves_no_process_and_no_port(start_testenv: Any) -> None:
    env: TestEnv = start_testenv(controller_manager=False)
    pids = [p.pid for p in env.processes.values()]
    ports = list(env.ports.values())
    assert all(pid_alive(p) for p in pids)
    assert all(port_in_use(p) for p in [env.ports["apiserver"], env.ports["etcd"]])
    env.stop()
    assert not any(pid_alive(p) for p in pids)
    assert not [p for p in ports if port_in_use(p)]
    assert not (env.state_dir / "state.json").exists()


_CHILD = """
import sys, time
from tessera.testenv import TestEnv, ensure_binaries
env = TestEnv.start(sys.argv[1], controller_manager=False, binaries=ensure_binaries())
print("READY", flush=True)
time.sleep(600)
"""


def test_killed_test_process_leaves_nothing_running(tmp_path: Path, testenv_binaries: Any) -> None:
    errors = tmp_path / "child.err"
    with (
        errors.open("w") as err,
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path / "env")],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as child,
    ):
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.strip() == "READY", errors.read_text()
            state = json.loads((tmp_path / "env" / "state.json").read_text())
            pids = list(state["pids"].values())
            assert len(pids) == 4
            assert all(pid_alive(p) for p in pids)
            os.kill(child.pid, signal.SIGKILL)  # no finalizer can run
            child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    wait_for("components to die with their parent", lambda: not any(map(pid_alive, pids)), 20)
    ports = list(state["ports"].values())
    wait_for("ports to close", lambda: not any(map(port_in_use, ports)), 20)


@pytest.mark.slow
def test_500_node_cluster_comes_up(start_testenv: Any, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    env: TestEnv = start_testenv(controller_manager=False)
    t1 = time.monotonic()
    nodes = synthetic_nodes(500, 8, "A100", prefix="big")
    names = env.create_gpu_nodes(nodes, workers=32, timeout=300)
    t2 = time.monotonic()
    api = env.api_client()
    try:
        listed = client.CoreV1Api(api).list_node(label_selector="type=kwok").items
    finally:
        api.close()
    assert len(names) == 500
    assert len(listed) == 500
    assert sum(int(n.status.allocatable["tessera.io/gpu"]) for n in listed) == 4000
    say(
        capsys,
        f"control plane start {t1 - t0:.1f} s; 500 nodes created and Ready {t2 - t1:.1f} s",
    )


def test_dev_cluster_cli_up_status_down(tmp_path: Path, testenv_binaries: Any) -> None:
    state = tmp_path / "dev"
    csv = tmp_path / "nodes.csv"
    csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn-a,32000,131072,2,T4\nn-b,64000,262144,0,\n"
    )
    sched_file = tmp_path / "sched.yaml"
    sched_file.write_text("percentageOfNodesToScore: 70\n")
    sched = str(sched_file)
    cli = [sys.executable, "-m", "tessera.cli", "dev-cluster"]
    up = subprocess.run(
        [*cli, "up", "--cluster", str(csv), "--state-dir", str(state), "--scheduler-config", sched],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == str(state / "kubeconfig")
        status = subprocess.run(
            [*cli, "status", "--state-dir", str(state)], capture_output=True, text=True
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert "nodes: 2 (2 Ready)" in status.stdout
        assert "percentageOfNodesToScore: 70" in (state / "scheduler-config.yaml").read_text()
        pids = list(json.loads((state / "state.json").read_text())["pids"].values())
    finally:
        down = subprocess.run(
            [*cli, "down", "--state-dir", str(state)], capture_output=True, text=True
        )
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(p) for p in pids)
    again = subprocess.run(
        [*cli, "status", "--state-dir", str(state)], capture_output=True, text=True
    )
    assert again.returncode == 1
    assert "no dev cluster" in again.stdout
