"""The test CA issues certs that verify against it, with the identities asked for."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.testenv.certs import CertificateAuthority


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_client_cert_carries_user_and_groups(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    pair = ca.issue("admin", "alice", ("system:masters", "devs"))
    cert = _load(pair.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters", "devs"]
    cert.verify_directly_issued_by(_load(ca.cert_path))
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert oct(pair.key.stat().st_mode & 0o777) == "0o600"


def test_serving_cert_names_ip_and_dns(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    cert = _load(
        ca.issue("srv", "srv", hosts=("127.0.0.1", "localhost"), client=False, server=True).cert
    )
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_ca_is_reused_from_its_directory(tmp_path: Path) -> None:
    first = CertificateAuthority(tmp_path).pem
    assert CertificateAuthority(tmp_path).pem == first
