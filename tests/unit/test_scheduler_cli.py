"""``tessera scheduler``: a flag it cannot use is told at once, by name, before the
process reaches the API server (no kubeconfig is given to the flag checks, so reaching for
one would fail with another message); what it cannot start with is one line, exit 1."""

from __future__ import annotations

import socket
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from typer.testing import CliRunner

from tessera.cli import app
from tessera.model.podspec import Compat
from tessera.scheduler import cli
from tessera.scheduler.config import SchedulerConfig
from tessera.scheduler.tls import ReloadingContext, generate_serving_cert
from tests._logs import logged


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["scheduler", *args])
    return result.exit_code, " ".join(result.stderr.replace("│", " ").split())


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--policy", "tightest"], "Invalid value for --policy: placement: must be one of"),
        (["--compat", "hami,volcano"], "Invalid value for --compat: unknown ['volcano']"),
        (["--tls-cert", "tls.crt"], "give both --tls-cert and --tls-key, or neither"),
        (["--reservation-ttl", "0"], "'--reservation-ttl': Input should be greater than or"),
        (["--port", "70000"], "'--port': Input should be less than or equal to 65535"),
    ],
)
def test_a_bad_flag_is_told_by_name(args: list[str], told: str) -> None:
    code, err = _run(*args)
    assert code == 2 and told in err, err


def test_a_certificate_that_does_not_load_is_told_before_the_api(tmp_path: Path) -> None:
    first = generate_serving_cert(tmp_path / "a", ["localhost"])
    second = generate_serving_cert(tmp_path / "b", ["localhost"])
    for cert, key in [
        (tmp_path / "none.crt", first.key_file),  # a wrong path
        (first.cert_file, second.key_file),  # a key of another certificate
    ]:
        code, err = _run("--tls-cert", str(cert), "--tls-key", str(key))
        assert code == 2, err
        assert f"Invalid value for --tls-cert/--tls-key: {cert} and {key} do not load" in err


def _kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig that loads; nothing answers at its server, so a test that reached the
    API would hang in the sync rather than fail as asserted."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    return path


def test_a_kubeconfig_it_cannot_read_is_one_line(tmp_path: Path) -> None:
    code, err = _run("--kubeconfig", str(tmp_path / "none.yaml"), "--webhook-port", "0")
    assert code == 1
    assert err.startswith(f"tessera scheduler: error: kubeconfig {tmp_path / 'none.yaml'}: ")


def test_a_certificate_it_generated_goes_with_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    made: list[Path] = []
    monkeypatch.setattr(
        "tessera.scheduler.tls.generate_serving_cert",
        lambda directory, hosts, real=generate_serving_cert: (
            made.append(directory) or real(directory, hosts)
        ),
    )
    # No --tls-dir, the default --webhook-port, and a kubeconfig that does not load.
    code, err = _run("--kubeconfig", str(tmp_path / "none.yaml"))
    assert code == 1 and "kubeconfig" in err, err
    assert [d.parent for d in made] == [temp] and made[0].name.startswith("tessera-tls-")
    assert list(temp.iterdir()) == []  # generated, then removed
    kept = tmp_path / "tls"
    code, err = _run("--kubeconfig", str(tmp_path / "none.yaml"), "--tls-dir", str(kept))
    assert code == 1 and (kept / "ca.crt").is_file()  # a folder it was given is kept


def test_a_port_in_use_is_told_before_anything_starts(tmp_path: Path) -> None:
    kubeconfig = str(_kubeconfig(tmp_path))
    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        used = taken.getsockname()[1]
        spare.bind(("0.0.0.0", 0))
        free = spare.getsockname()[1]
        spare.close()
        code, err = _run("--kubeconfig", kubeconfig, "--port", str(used), "--webhook-port", "0")
        assert code == 1 and f"tessera scheduler: error: --port {used}: " in err, err
        assert "address already in use" in err
        argv = ["--kubeconfig", kubeconfig, "--port", str(free), "--webhook-port", str(used)]
        argv += ["--tls-dir", str(tmp_path / "tls")]
        code, err = _run(*argv)
        assert code == 1 and f"tessera scheduler: error: --webhook-port {used}: " in err, err
    with socket.socket() as again:  # the --port it had bound was let go
        again.bind(("0.0.0.0", free))


def _served(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Any, ...]:
    """What ``_serve`` was handed: the config the flags made, and where it listens."""
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(cli, "_serve", lambda *a: seen.append(a))
    code, err = _run(*args)
    assert code == 0, err
    [handed] = seen
    return handed


def test_the_defaults_are_the_configs_and_the_webhook_gets_a_certificate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, kubeconfig, host, port, webhook_port, tls = _served(monkeypatch)
    assert replace(config, identity="") == SchedulerConfig(identity="", freeze_heap=True)
    assert (kubeconfig, host, port, webhook_port) == (None, "0.0.0.0", 8888, 8443)
    assert isinstance(tls, ReloadingContext)


def test_each_flag_reaches_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    args = ["--kubeconfig", str(tmp_path / "kc"), "--scheduler-name", "gpus",
            "--policy", "spread", "--seed", "7", "--scored", "--compat", " hami, gpu-manager ,",
            "--host", "127.0.0.1", "--port", "9000", "--webhook-port", "0",
            "--no-leader-elect", "--lease-namespace", "ops", "--lease-name", "lease",
            "--reservation-ttl", "12.5", "--quota-status-s", "0.5", "--web",
            "--no-preemption"]  # fmt: skip
    config, kubeconfig, host, port, webhook_port, tls = _served(monkeypatch, *args)
    assert replace(config, identity="") == SchedulerConfig(
        scheduler_name="gpus", policy="spread", seed=7, narrow=False,
        compat=Compat(hami=True, gpu_manager=True), reservation_ttl_s=12.5,
        quota_status_s=0.5, web=True, preemption=False, leader_elect=False,
        lease_namespace="ops", lease_name="lease", identity="", freeze_heap=True,
    )  # fmt: skip
    assert (kubeconfig, host, port, webhook_port, tls) == (tmp_path / "kc", "127.0.0.1", 9000,
                                                           0, None)  # fmt: skip
    config = _served(monkeypatch, "--webhook-port", "0", "--compat", "hami")[0]
    assert config.compat == Compat(hami=True, gpu_manager=False)


def _names(cert_file: Path) -> tuple[list[str], list[str]]:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.DNSName), [
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    ]


def test_a_generated_certificate_names_the_hosts_given_else_this_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="tessera.scheduler")
    _served(monkeypatch, "--tls-dir", str(tmp_path / "a"))
    assert _names(tmp_path / "a" / "tls.crt") == (["localhost"], ["127.0.0.1"])
    assert logged(caplog, "tessera.scheduler") == [
        f"webhook certificate generated in {tmp_path / 'a'} (caBundle: ca.crt)"
    ]
    hosts = ["--tls-host", "tessera.kube-system.svc", "--tls-host", "10.0.0.7"]
    _served(monkeypatch, "--tls-dir", str(tmp_path / "b"), *hosts)
    assert _names(tmp_path / "b" / "tls.crt") == (["tessera.kube-system.svc"], ["10.0.0.7"])
