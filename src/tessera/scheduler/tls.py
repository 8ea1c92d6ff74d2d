"""The webhook's serving certificate: given (cert + key files) or generated at start.

A generated certificate is self-signed by a throw-away CA whose PEM is written beside
it (``ca.crt``) so the operator -- or the e2e test -- can put it in the webhook
configuration's ``caBundle``. Its SANs are the DNS names and IPs it is told to serve.
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

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

__all__ = ["ServingCert", "generate_serving_cert", "server_context"]


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


def server_context(cert: ServingCert) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert.cert_file), str(cert.key_file))
    return ctx
