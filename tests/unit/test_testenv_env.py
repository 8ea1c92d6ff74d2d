"""TestEnv start-up failures, with stand-in binaries (shell scripts): no Go, no cluster.

Each failure must name the component and the cause, carry the log's tail, and leave
nothing running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.testenv.build import Binaries
from tessera.testenv.env import TestEnv
from tessera.testenv.errors import StartError
from tessera.testenv.process import pid_alive

NAMES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok")


def fake_binaries(tmp_path: Path, **scripts: str) -> Binaries:
    """Binaries whose programs are the given shell scripts (default: exit 0)."""
    paths = {}
    for name in NAMES:
        path = tmp_path / "bin" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text("#!/bin/sh\n" + scripts.get(name.replace("-", "_"), "exit 0") + "\n")
        path.chmod(0o755)
        paths[name] = path
    return Binaries(paths=paths, versions={})


FAKE_ETCD = """
import http.server, sys
url = next(a for a in sys.argv if a.startswith("--listen-client-urls="))
port = int(url.rsplit(":", 1)[1])


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"health":"true"}')

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_component_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    bins = fake_binaries(tmp_path, etcd="echo 'etcdmain: bad flag --foo'; exit 2")
    with pytest.raises(StartError) as err:
        TestEnv.start(tmp_path / "env", binaries=bins, timeout=10)
    msg = str(err.value)
    assert msg.startswith("etcd: exited with code 2 before it became healthy")
    assert "etcdmain: bad flag --foo" in msg
    assert err.value.component == "etcd"
    assert not (tmp_path / "env" / "state.json").exists()


def test_port_clash_is_retried_with_new_ports_then_reported(tmp_path: Path) -> None:
    counter = tmp_path / "tries"
    bins = fake_binaries(
        tmp_path,
        etcd=f"echo x >> {counter}; echo 'listen tcp 127.0.0.1:1: bind: address already in use'; "
        "exit 1",
    )
    with pytest.raises(StartError, match="address already in use"):
        TestEnv.start(tmp_path / "env", binaries=bins, timeout=10)
    assert len(counter.read_text().splitlines()) == 3


def test_unhealthy_component_is_stopped_and_earlier_ones_too(tmp_path: Path) -> None:
    # etcd is healthy (a tiny HTTP server answers /health); the apiserver never is.
    server = tmp_path / "fake_etcd.py"
    server.write_text(FAKE_ETCD)
    etcd = f'exec "{sys.executable}" "{server}" "$@"'
    bins = fake_binaries(tmp_path, etcd=etcd, kube_apiserver="echo starting; sleep 60")
    with pytest.raises(StartError) as err:
        TestEnv.start(tmp_path / "env", binaries=bins, timeout=2)
    msg = str(err.value)
    assert msg.startswith("kube-apiserver: not healthy after 2 s at https://127.0.0.1:")
    assert "/readyz" in msg
    assert "starting" in msg
    logs = (tmp_path / "env" / "logs" / "etcd.log").read_text()
    assert "--listen-client-urls=http://127.0.0.1:" in logs
    # Everything was stopped: no process whose command line names this env survives.
    time.sleep(0.2)
    mine = [
        p
        for p in os.listdir("/proc")
        if p.isdigit() and pid_alive(int(p)) and str(tmp_path / "env").encode() in _cmdline(p)
    ]
    assert mine == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_refuses_to_start_over_a_running_env(tmp_path: Path) -> None:
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    # A live process whose command line names the state dir stands for a running env.
    code = "import time; time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", code, str(env_dir)]) as proc:
        try:
            deadline = time.monotonic() + 10
            while str(env_dir).encode() not in _cmdline(str(proc.pid)):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            state = {"pids": {"etcd": proc.pid}, "ports": {}}
            (env_dir / "state.json").write_text(json.dumps(state))
            with pytest.raises(StartError, match=r"already running in .* \(pids etcd="):
                TestEnv.start(env_dir, binaries=fake_binaries(tmp_path), timeout=2)
        finally:
            proc.kill()


def test_attach_without_state_says_so(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="no environment in"):
        TestEnv.attach(tmp_path)
