"""``tessera dev-cluster up --real-node``: the user's way to a real node, and ``down``
leaving nothing of it behind (processes, cgroups, sysctls).

Its own module: the node is named ``localhost`` like the real-node tests' one, and
pytest finishes that module's node before this one starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tessera.kube import NODES
from tessera.kube.client import KubeClient
from tessera.testenv.process import pid_alive
from tessera.testenv.realnode import CGROUP_ROOT_PREFIX, SYSCTLS, missing_prerequisites

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites())),
]


def test_dev_cluster_up_real_node_and_down(tmp_path: Path, testenv_binaries: Any) -> None:
    state = tmp_path / "dev"
    sysctls = {k: Path("/proc/sys", k).read_text() for k in SYSCTLS}
    cli = [sys.executable, "-m", "tessera.cli", "dev-cluster"]
    up = subprocess.run(
        [*cli, "up", "--nodes", "1", "--real-node", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert up.returncode == 0, up.stderr
        assert "real node localhost Ready" in up.stderr
        assert "nsenter --mount=/proc/" in up.stderr  # how to run an agent in it
        api = KubeClient.from_kubeconfig(str(state / "kubeconfig"))
        names = {n["metadata"]["name"] for n in api.list(NODES).items}
        assert names == {"localhost", "node-0000"}
        pids = json.loads((state / "real-node" / "realnode.json").read_text())["pids"]
        assert set(pids) == {"holder", "containerd", "kubelet"}
        assert {k: Path("/proc/sys", k).read_text() for k in SYSCTLS} == sysctls
    finally:
        down = subprocess.run(
            [*cli, "down", "--state-dir", str(state)], capture_output=True, text=True
        )
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(pid_alive(p) for p in pids.values())
    assert not list(Path("/sys/fs/cgroup/pids").glob(f"{CGROUP_ROOT_PREFIX}*"))
    assert {k: Path("/proc/sys", k).read_text() for k in SYSCTLS} == sysctls
