"""``kubectl tessera`` when the cluster cannot be read: one sentence on stderr and exit
1, as kubectl says it, never a traceback."""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from tessera.kube.fake import FakeKube
from tessera.kube.kinds import NODES, PODS
from tessera.view import kubectl
from tessera.view.kubectl import common
from tests.unit._scheduler_world import node_obj, pod_obj


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The executable's entry point with ``args``; its stderr. Exits 1."""
    monkeypatch.setattr(gc, "disable", lambda: None)  # the test process keeps its collector
    monkeypatch.setattr(sys, "argv", ["kubectl-tessera", *args])
    with pytest.raises(SystemExit) as exit_:
        kubectl.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 1, err
    assert "Traceback" not in err
    return err


def kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "config"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    return str(path)


def test_an_api_server_that_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = kubeconfig(tmp_path, f"http://127.0.0.1:{port}")
    err = run(monkeypatch, capsys, "why", "waits", "--kubeconfig", config)
    assert err.startswith("error: the API server did not answer: GET /api/v1/namespaces/default/")
    assert "Connection refused" in err


def test_a_kubeconfig_that_does_not_load_or_lacks_the_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere")
    err = run(monkeypatch, capsys, "top", "--kubeconfig", missing)
    assert err.startswith(f"error: kubeconfig {missing}: ")
    config = kubeconfig(tmp_path, "http://127.0.0.1:1")
    err = run(monkeypatch, capsys, "top", "--kubeconfig", config, "--context", "nope")
    assert err.startswith(f"error: kubeconfig {config}: ") and "nope" in err


def test_a_pod_list_that_expires_between_pages_says_to_run_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = FakeKube(history=10)
    kube.create(NODES, node_obj("a"))
    for i in range(700):  # two pages
        kube.create(PODS, pod_obj(f"p{i}", gpu=1), "default")
    listing = kube.list

    def list_then_compact(kind: Any, namespace: Any = None, **kw: Any) -> Any:
        out = listing(kind, namespace, **kw)
        if kind == PODS and out.continue_token:  # changes enough to compact its version
            for i in range(20):
                kube.create(PODS, pod_obj(f"new{i}", gpu=1), "default")
        return out

    monkeypatch.setattr(kube, "list", list_then_compact)
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)
    err = run(monkeypatch, capsys, "top")
    assert err.startswith("error: a list expired before it was read to the end")
    assert err.rstrip().endswith("run the command again")
