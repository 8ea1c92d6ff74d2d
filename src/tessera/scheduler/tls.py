"""The webhook's serving certificate: given (cert + key files) or generated at start.

A generated certificate is self-signed by a throw-away CA whose PEM is written beside
it (``ca.crt``) so the operator -- or the e2e test -- can put it in the webhook
configuration's ``caBundle``. Its SANs are the DNS names and IPs it is told to serve.

Given files are read again when they change (``ReloadingContext``): cert-manager renews
its certificates a third of their life before they expire, and with a self-signed
issuer the webhook configurations' ``caBundle`` moves to the new certificate at once. A
server still presenting the old one would fail every admission call until restarted.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tessera.pki import (
    cert_pem,
    common_name,
    key_pem,
    new_key,
    self_signed_ca,
    sign_leaf,
    write_private,
)

__all__ = ["ReloadingContext", "ServingCert", "generate_serving_cert"]

log = logging.getLogger(__name__)

# How often the files are looked at. kubelet updates a mounted Secret within about a
# minute of its change; cert-manager renews weeks before expiry.
RECHECK_S = 10.0


@dataclass(frozen=True, slots=True)
class ServingCert:
    cert_file: Path
    key_file: Path
    ca_file: Path | None = None

    def ca_pem(self) -> bytes:
        return (self.ca_file or self.cert_file).read_bytes()


def generate_serving_cert(
    directory: Path, hosts: list[str], days: int = 365, cn: str = "tessera-scheduler"
) -> ServingCert:
    """A CA and a serving certificate for ``hosts`` (DNS names or IPs), as PEM files.
    The CA's key is not kept: the next generation makes a new CA."""
    directory.mkdir(parents=True, exist_ok=True)
    validity = dt.timedelta(days=days)
    ca_key = new_key()
    ca = self_signed_ca(common_name(f"{cn}-ca"), ca_key, validity, path_length=0)
    key = new_key()
    cert = sign_leaf(
        ca, ca_key, common_name(cn), key, validity, [ExtendedKeyUsageOID.SERVER_AUTH], hosts
    )
    ca_file = directory / "ca.crt"
    out = ServingCert(directory / "tls.crt", directory / "tls.key", ca_file)
    out.cert_file.write_bytes(cert_pem(cert))
    write_private(out.key_file, key_pem(key))
    ca_file.write_bytes(cert_pem(ca))
    return out


def _new_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _stamp(path: Path) -> tuple[int, int, int]:
    # A mounted Secret changes by a symlink swap to a new file: a new inode.
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class ReloadingContext:
    """The serving ``context``, serving ``cert``'s files as they are on disk now.

    ``check()`` (the server calls it every ``RECHECK_S``) compares the files' identity,
    and when they changed loads them into a context of their own: new connections get
    the new certificate, open ones keep theirs. The live ``context`` hands each
    handshake to the newest good context from its SNI callback (called for every
    ClientHello, with a server name or without, as Go's client sends none for an IP).
    So a load never touches a context in use: a rotation caught half-written (a key
    that does not match its certificate, refused by OpenSSL) is refused with a warning,
    the old pair keeps serving, and the next check tries again. Nothing is written to
    disk (the chart's root filesystem is read-only). A callback given to ``on_load``
    hears of every load with the certificate's expiry (unix seconds).
    """

    def __init__(self, cert: ServingCert):
        self.cert = cert
        self._on_load: Callable[[float], None] | None = None
        self._seen = self._stamps()
        self._refused: tuple[tuple[int, int, int], ...] = ()
        # Files that do not load at start: an error, raised here. The first context is
        # the served one; its callback hands each handshake to the newest.
        self._current, self.not_after = self._load()
        self.context = self._current
        self.context.sni_callback = self._pick

    def on_load(self, callback: Callable[[float], None]) -> None:
        """Call ``callback(not_after)`` after every load from now on, and at once for
        the pair loaded already (the metrics exist only after the certificate is read)."""
        self._on_load = callback
        callback(self.not_after)

    def _pick(self, conn: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        conn.context = self._current

    def _stamps(self) -> tuple[tuple[int, int, int], ...]:
        return (_stamp(self.cert.cert_file), _stamp(self.cert.key_file))

    def check(self) -> bool:
        """Load the files again if they changed; True when the new pair is now served."""
        try:
            stamps = self._stamps()
        except OSError as exc:  # between a rotation's steps, or a mount gone
            log.warning("webhook certificate files unreadable, serving the loaded one: %s", exc)
            return False
        if stamps == self._seen:
            return False
        try:
            loaded, not_after = self._load()
            if self._stamps() != stamps:
                raise ValueError("the files changed while they were read")
        except (OSError, ssl.SSLError, ValueError) as exc:
            if stamps != self._refused:  # said once for each version of the files
                self._refused = stamps
                log.warning(
                    "webhook certificate %s changed but does not load (%s); serving the "
                    "loaded one until it does",
                    self.cert.cert_file,
                    exc,
                )
            return False
        self._current, self.not_after, self._seen = loaded, not_after, stamps
        self._loaded(not_after)
        log.info(
            "webhook certificate reloaded from %s, valid until %s",
            self.cert.cert_file,
            dt.datetime.fromtimestamp(not_after, dt.UTC).isoformat(),
        )
        return True

    def _load(self) -> tuple[ssl.SSLContext, float]:
        ctx = _new_context()
        ctx.load_cert_chain(str(self.cert.cert_file), str(self.cert.key_file))
        leaf = x509.load_pem_x509_certificate(self.cert.cert_file.read_bytes())
        return ctx, leaf.not_valid_after_utc.timestamp()

    def _loaded(self, not_after: float) -> None:
        if self._on_load is not None:
            self._on_load(not_after)
