"""``kubectl tessera`` when the cluster cannot be read: one sentence on stderr and exit
1, as kubectl says it, never a traceback."""

from __future__ import annotations

import gc
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

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


def _compacting(kube: FakeKube, passes: int) -> Any:
    """``kube.list`` that, on its first ``passes`` paged lists of pods, makes enough
    changes after the first page to compact that list's version away."""
    listing = kube.list
    left = [passes]

    def list_then_compact(kind: Any, namespace: Any = None, **kw: Any) -> Any:
        out = listing(kind, namespace, **kw)
        if kind == PODS and out.continue_token and not kw.get("continue_token") and left[0]:
            left[0] -= 1
            for i in range(20):
                kube.create(PODS, pod_obj(f"new{passes}-{left[0]}-{i}", gpu=None), "default")
        return out

    return list_then_compact


def _two_pages() -> FakeKube:
    kube = FakeKube(history=10)
    kube.create(NODES, node_obj("a"))
    for i in range(700):  # two pages
        kube.create(PODS, pod_obj(f"p{i}", gpu=1), "default")
    return kube


def test_a_pod_list_that_expires_twice_says_to_run_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = _two_pages()
    monkeypatch.setattr(kube, "list", _compacting(kube, passes=2))
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)
    err = run(monkeypatch, capsys, "top")
    assert err.count("note: a list expired before its end") == 1
    assert "error: a list expired before it was read to the end, twice" in err
    assert err.rstrip().endswith("run the command again")


@pytest.mark.parametrize(
    ("command", "answer"),
    [
        (["top"], "700 GPU pod(s) waiting"),  # both pages of the second listing, p0 bound
        (["why", "waits"], "pod default/waits fits now: node a"),
        (["capacity"], "all     1       2"),
    ],
)
def test_a_pod_list_that_expires_once_is_listed_again_and_said_once(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    answer: str,
) -> None:
    kube = _two_pages()
    kube.create(PODS, pod_obj("waits", gpu=1), "default")
    kube.merge_patch(PODS, "p0", {"spec": {"nodeName": "a"}}, "default")
    monkeypatch.setattr(kube, "list", _compacting(kube, passes=1))
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)
    monkeypatch.setattr(gc, "disable", lambda: None)
    monkeypatch.setattr(sys, "argv", ["kubectl-tessera", *command])
    with pytest.raises(SystemExit) as exit_:
        kubectl.main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 0, err
    assert err.count("note: a list expired before its end") == 1
    assert "error" not in err
    assert answer in out
    # The answer is printed once, from the second, whole listing.
    first = out.splitlines()[0]
    assert out.count(first) == 1, out


def test_the_namespace_is_the_flag_else_the_contexts_else_default(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: plain\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "contexts: [{name: plain, context: {cluster: c, user: u}},\n"
        "           {name: team, context: {cluster: c, user: u, namespace: team-a}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    assert common.Conn(str(path), None).namespace(None) == "default"  # the current one
    assert common.Conn(str(path), "team").namespace(None) == "team-a"
    assert common.Conn(str(path), "team").namespace("ops") == "ops"
    path.write_text(path.read_text().replace("current-context: plain", "current-context: team"))
    assert common.Conn(str(path), None).namespace(None) == "team-a"
    assert common.Conn(str(path), "plain").namespace(None) == "default"
    assert common.Conn(str(tmp_path / "none"), None).namespace(None) == "default"


def test_no_command_shows_the_commands_and_no_completion_options() -> None:
    result = CliRunner().invoke(kubectl.app, [])
    for command in ("top", "pod", "why", "quota", "capacity", "cordon", "uncordon", "drain"):
        assert f" {command} " in result.output, result.output
    assert "--install-completion" not in CliRunner().invoke(kubectl.app, ["--help"]).output
