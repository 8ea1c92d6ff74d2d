"""X.509 for Tessera's own TLS: a CA and the leaf certificates it signs.

One implementation for the scheduler's generated webhook certificate and the test
control plane's certificates. Everything is ECDSA P-256: fast to generate and accepted
by every Kubernetes component. Certificates start five minutes in the past so a
slightly slow clock elsewhere does not reject them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID, ObjectIdentifier

__all__ = [
    "cert_pem",
    "common_name",
    "key_pem",
    "new_key",
    "self_signed_ca",
    "sign_leaf",
    "write_private",
]

_BACKDATE = dt.timedelta(minutes=5)


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def common_name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def write_private(path: Path, data: bytes) -> None:
    """Write a key readable by its owner only; the mode is set before any byte lands."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(data)


def self_signed_ca(
    name: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    validity: dt.timedelta,
    path_length: int | None = None,
) -> x509.Certificate:
    """A CA certificate for ``key``, valid for ``validity`` from now."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )


def _san(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return names


def sign_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    validity: dt.timedelta,
    usages: Iterable[ObjectIdentifier],
    hosts: Iterable[str] = (),
) -> x509.Certificate:
    """A leaf certificate for ``key`` with extended key ``usages`` and, when ``hosts``
    are given (IP addresses or DNS names), those as subject alternative names."""
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    )
    sans = _san(hosts)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())
