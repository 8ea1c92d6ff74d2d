"""The webhook's serving certificate: a generated one works, and given files are served
again when they change on disk (a renewal), without a restart and without ever serving a
pair that does not match."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import logging
import os
import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509

from tessera.scheduler.http import serve
from tessera.scheduler.metrics import Metrics
from tessera.scheduler.tls import RECHECK_S, ReloadingContext, ServingCert, generate_serving_cert
from tests._logs import logged
from tests.unit._scheduler_world import World, node_obj, pod_obj

HOSTS = ["localhost", "127.0.0.1"]


def _mutate(port: int, cafile: Path, host: str = "127.0.0.1") -> int:
    client = ssl.create_default_context(cafile=str(cafile))
    conn = http.client.HTTPSConnection(host, port, context=client, timeout=10)
    try:
        review = {"request": {"uid": "1", "operation": "CREATE", "object": pod_obj("p")}}
        conn.request("POST", "/mutate", body=json.dumps(review).encode())
        resp = conn.getresponse()
        assert json.loads(resp.read())["response"]["allowed"]
        return resp.status
    finally:
        conn.close()


def _trusted_by(port: int, cafile: Path) -> bool:
    try:
        return _mutate(port, cafile) == 200
    except ssl.SSLCertVerificationError:
        return False


class SecretVolume:
    """A directory kept as kubelet keeps a mounted Secret: the files are symlinks into
    ``..data``, and an update writes a new timestamped folder and swaps ``..data`` to it
    in one rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        root.mkdir(parents=True)

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        folder = self.root / f"..2026_11_27_{self.generation}"
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(folder.name)
        os.replace(tmp, self.root / "..data")

    def serving(self) -> ServingCert:
        return ServingCert(self.root / "tls.crt", self.root / "tls.key", self.root / "ca.crt")


def _issued(tmp: Path, name: str, days: int = 365) -> dict[str, bytes]:
    """A fresh CA and serving certificate, as a renewal by a self-signed issuer makes."""
    cert = generate_serving_cert(tmp / name, HOSTS, days)
    return {
        "tls.crt": cert.cert_file.read_bytes(),
        "tls.key": cert.key_file.read_bytes(),
        "ca.crt": cert.ca_pem(),
    }


def _not_after(files: dict[str, bytes]) -> float:
    return x509.load_pem_x509_certificate(files["tls.crt"]).not_valid_after_utc.timestamp()


def _ca(tmp: Path, name: str, files: dict[str, bytes]) -> Path:
    path = tmp / f"{name}-ca.pem"
    path.write_bytes(files["ca.crt"])
    return path


def test_webhook_over_generated_tls(tmp_path: Path) -> None:
    cert = generate_serving_cert(tmp_path / "tls", HOSTS)
    assert (tmp_path / "tls" / "tls.key").stat().st_mode & 0o077 == 0
    w = World([node_obj("n1", 1)])
    server = serve(w.app, "127.0.0.1", 0, ReloadingContext(cert).context)
    try:
        assert cert.ca_file is not None
        for host in HOSTS:
            assert _mutate(server.port, cert.ca_file, host) == 200
    finally:
        server.stop()
        w.close()


def test_a_generated_certificate_lasts_a_year_under_a_ca_that_signs_nothing_else(
    tmp_path: Path,
) -> None:
    """Generated again into the same directory (the next start), under a new CA."""
    first_ca = generate_serving_cert(tmp_path / "a" / "tls", HOSTS).ca_pem()
    again = generate_serving_cert(tmp_path / "a" / "tls", HOSTS)
    assert again.ca_pem() != first_ca
    leaf = x509.load_pem_x509_certificate(again.cert_file.read_bytes())
    ca = x509.load_pem_x509_certificate(again.ca_pem())
    # Valid from five minutes back, for clocks a little behind.
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert lifetime == dt.timedelta(days=365, minutes=5)
    assert leaf.issuer == ca.subject
    limits = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert limits.critical and limits.value.ca and limits.value.path_length == 0  # RFC 5280
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage_ext = ca.extensions.get_extension_for_class(x509.KeyUsage)
    usage = usage_ext.value
    assert usage_ext.critical and usage.key_cert_sign and usage.crl_sign and usage.digital_signature
    assert not (usage.content_commitment or usage.key_encipherment or usage.data_encipherment)
    assert not usage.key_agreement  # (encipher_only and decipher_only are read only with it)
    # The leaf: CA:FALSE critical; its usage and names not (the subject is not empty).
    kinds = {type(e.value): e.critical for e in leaf.extensions}
    assert kinds[x509.BasicConstraints] is True
    assert kinds[x509.ExtendedKeyUsage] is False and kinds[x509.SubjectAlternativeName] is False


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "mount")
    first, second = _issued(tmp_path, "first"), _issued(tmp_path, "second")
    volume.write(first)
    w = World([node_obj("n1", 1)])
    metrics = Metrics()
    tls = ReloadingContext(volume.serving())
    tls.on_load(metrics.webhook_cert_loaded)
    server = serve(w.app, "127.0.0.1", 0, tls.context, recheck_tls=tls.check)
    try:
        old_ca, new_ca = _ca(tmp_path, "first", first), _ca(tmp_path, "second", second)
        assert _trusted_by(server.port, old_ca) and not _trusted_by(server.port, new_ca)
        loaded_first = tls.not_after
        volume.write(second)  # what kubelet does when cert-manager renews the Secret
        deadline = time.monotonic() + RECHECK_S + 5
        while not _trusted_by(server.port, new_ca):
            assert time.monotonic() < deadline, "the renewed certificate was never served"
            time.sleep(0.2)
        assert not _trusted_by(server.port, old_ca)
        assert metrics.webhook_cert_loads._value.get() == 2
        assert metrics.webhook_cert_expiry._value.get() == tls.not_after >= loaded_first
    finally:
        server.stop()
        w.close()


def test_a_pair_that_does_not_match_is_never_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = SecretVolume(tmp_path / "mount")
    first, second = _issued(tmp_path, "first"), _issued(tmp_path, "second")
    volume.write(first)
    loads: list[float] = []
    tls = ReloadingContext(volume.serving())
    tls.on_load(loads.append)
    w = World([node_obj("n1", 1)])
    server = serve(w.app, "127.0.0.1", 0, tls.context)  # checks made by hand below
    try:
        old_ca, new_ca = _ca(tmp_path, "first", first), _ca(tmp_path, "second", second)
        # A rotation caught half done: the new certificate beside the old key. Said once
        # for these files, however often they are looked at.
        volume.write({**second, "tls.key": first["tls.key"]})
        with caplog.at_level(logging.WARNING, logger="tessera.scheduler.tls"):
            assert tls.check() is False
            assert tls.check() is False
        [refused] = logged(caplog, "tessera.scheduler.tls")
        assert refused.startswith(f"webhook certificate {volume.root / 'tls.crt'} changed but ")
        assert refused.endswith("); serving the loaded one until it does")
        assert "KEY_VALUES_MISMATCH" in refused  # OpenSSL's reason, as it gave it
        assert _trusted_by(server.port, old_ca) and len(loads) == 1
        # A file gone for a moment (a mount being replaced): nothing changes either.
        (volume.root / "..data").unlink()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tessera.scheduler.tls"):
            assert tls.check() is False
            assert _trusted_by(server.port, old_ca)
            # The rotation completes: the next check serves it, and says until when.
            volume.write(second)
            assert tls.check() is True
        until = dt.datetime.fromtimestamp(tls.not_after, dt.UTC).isoformat()
        assert logged(caplog, "tessera.scheduler.tls") == [
            "webhook certificate files unreadable, serving the loaded one: [Errno 2] No "
            f"such file or directory: '{volume.root / 'tls.crt'}'",
            f"webhook certificate reloaded from {volume.root / 'tls.crt'}, valid until {until}",
        ]
        assert _trusted_by(server.port, new_ca) and not _trusted_by(server.port, old_ca)
        assert len(loads) == 2
        assert tls.check() is False  # unchanged since: nothing loaded again
        assert len(loads) == 2
    finally:
        server.stop()
        w.close()


def test_files_that_change_while_they_are_read_are_read_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = SecretVolume(tmp_path / "mount")
    # Three lifetimes, so that which pair is served shows in its expiry.
    first, second, third = (
        _issued(tmp_path, n, d) for n, d in (("1", 300), ("2", 200), ("3", 100))
    )
    volume.write(first)
    tls = ReloadingContext(volume.serving())
    at_start = tls.not_after
    real_load = tls._load

    def load_while_rotated() -> tuple[ssl.SSLContext, float]:
        loaded = real_load()
        monkeypatch.setattr(tls, "_load", real_load)  # once
        volume.write(third)  # the next rotation lands between the read and the check
        return loaded

    monkeypatch.setattr(tls, "_load", load_while_rotated)
    volume.write(second)
    with caplog.at_level(logging.WARNING, logger="tessera.scheduler.tls"):
        assert tls.check() is False
    [refused] = logged(caplog, "tessera.scheduler.tls")
    assert "(the files changed while they were read)" in refused
    assert tls.not_after == at_start  # the first pair still served
    assert tls.check() is True  # the files as they are now
    assert tls.not_after == _not_after(third) < _not_after(second) < at_start


def test_files_that_do_not_load_at_start_are_an_error(tmp_path: Path) -> None:
    first, second = _issued(tmp_path, "first"), _issued(tmp_path, "second")
    volume = SecretVolume(tmp_path / "mount")
    volume.write({**first, "tls.key": second["tls.key"]})
    with pytest.raises(ssl.SSLError):
        ReloadingContext(volume.serving())


def test_a_load_callback_given_later_hears_of_the_pair_loaded_already(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "mount")
    volume.write(_issued(tmp_path, "first"))
    tls = ReloadingContext(volume.serving())
    loads: list[float] = []
    tls.on_load(loads.append)
    assert loads == [tls.not_after]
    volume.write(_issued(tmp_path, "second"))
    assert tls.check() is True
    assert loads == [loads[0], tls.not_after]
