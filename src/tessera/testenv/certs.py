"""Certificates for a loopback control plane: one CA, a serving cert, client certs.

Everything is ECDSA P-256 (fast to generate, accepted by every Kubernetes component) and
valid for 30 days. Identities follow Kubernetes' conventions: the user is the subject's
CN, the groups are its O values; ``system:masters`` bypasses RBAC.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera import pki

__all__ = ["CertPair", "CertificateAuthority"]

_VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class CertPair:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


class CertificateAuthority:
    """A CA kept as ``ca.crt``/``ca.key`` in ``directory``; issues leaf certs beside it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.cert_path = directory / "ca.crt"
        key_path = directory / "ca.key"
        if self.cert_path.exists() and key_path.exists():
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            assert isinstance(loaded, ec.EllipticCurvePrivateKey)
            self._key = loaded
            return
        self._key = pki.new_key()
        self._cert = pki.self_signed_ca(pki.common_name("tessera-testenv-ca"), self._key, _VALIDITY)
        pki.write_private(key_path, pki.key_pem(self._key))
        self.cert_path.write_bytes(pki.cert_pem(self._cert))

    @property
    def pem(self) -> bytes:
        """The CA certificate in PEM (for a webhook's ``caBundle``)."""
        return self.cert_path.read_bytes()

    def issue(
        self,
        name: str,
        common_name: str,
        groups: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        client: bool = True,
        server: bool = False,
    ) -> CertPair:
        """Issue ``name.crt``/``name.key``: a client cert for ``common_name`` in ``groups``,
        and/or a serving cert for ``hosts`` (IP addresses or DNS names)."""
        key = pki.new_key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        cert = pki.sign_leaf(self._cert, self._key, x509.Name(attrs), key, _VALIDITY, usages, hosts)
        pair = CertPair(cert=self.directory / f"{name}.crt", key=self.directory / f"{name}.key")
        pki.write_private(pair.key, pki.key_pem(key))
        pair.cert.write_bytes(pki.cert_pem(cert))
        return pair


def write_signing_key(directory: Path) -> CertPair:
    """An ECDSA key pair for signing service-account tokens (``sa.key``, ``sa.pub``)."""
    key = pki.new_key()
    pair = CertPair(cert=directory / "sa.pub", key=directory / "sa.key")
    pki.write_private(pair.key, pki.key_pem(key))
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pair.cert.write_bytes(pub)
    return pair
