"""Certificates for a loopback control plane: one CA, a serving cert, client certs.

Everything is ECDSA P-256 (fast to generate, accepted by every Kubernetes component) and
valid for 30 days. Identities follow Kubernetes' conventions: the user is the subject's
CN, the groups are its O values; ``system:masters`` bypasses RBAC.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertPair", "CertificateAuthority"]

_VALIDITY = dt.timedelta(days=30)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


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
        self._key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-testenv-ca")])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        _write(key_path, _key_pem(self._key), private=True)
        _write(self.cert_path, self._cert.public_bytes(serialization.Encoding.PEM))

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
        key = _key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = CertPair(cert=self.directory / f"{name}.crt", key=self.directory / f"{name}.key")
        _write(pair.key, _key_pem(key), private=True)
        _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
        return pair


def write_signing_key(directory: Path) -> CertPair:
    """An ECDSA key pair for signing service-account tokens (``sa.key``, ``sa.pub``)."""
    key = _key()
    pair = CertPair(cert=directory / "sa.pub", key=directory / "sa.key")
    _write(pair.key, _key_pem(key), private=True)
    pub = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    _write(pair.cert, pub)
    return pair
