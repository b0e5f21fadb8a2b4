"""The certificates lowtide makes for a local cluster: what is in them, and where they are written."""

from __future__ import annotations

import ipaddress
import stat

from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID

from lowtide.tls.certs import CertificateAuthority, write_pkcs12
from lowtide.tls.principal import LOWTIDE_RULES, PrincipalMapper


def test_an_issued_certificate_names_its_principal_and_hosts_and_chains_to_the_ca(tmp_path):
    ca = CertificateAuthority.create(tmp_path)
    files = ca.issue("replica-1", common_name="broker-1", hosts=["localhost", "127.0.0.1", "r1.lowtide.svc"])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert PrincipalMapper(LOWTIDE_RULES).principal_of_pem(files.cert.read_bytes()) == "User:broker-1"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "r1.lowtide.svc"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # a service's certificate is also the client certificate it calls other services with
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    cert.verify_directly_issued_by(ca.cert)
    assert files.ca.read_bytes() == ca.ca_path.read_bytes()


def test_private_keys_are_pkcs8_and_readable_by_their_owner_only(tmp_path):
    ca = CertificateAuthority.create(tmp_path)
    files = ca.issue("admin")
    for key in (files.key, tmp_path / "ca.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, what Java's PEM keystore reads
    assert not list(tmp_path.rglob("*.tmp"))


def test_creating_the_ca_again_loads_the_existing_one(tmp_path):
    first = CertificateAuthority.create(tmp_path)
    again = CertificateAuthority.create(tmp_path)
    assert again.cert == first.cert
    files = again.issue("frontdoor")
    x509.load_pem_x509_certificate(files.cert.read_bytes()).verify_directly_issued_by(first.cert)


def test_reissuing_rotates_the_key_and_serial_but_keeps_the_subject(tmp_path):
    ca = CertificateAuthority.create(tmp_path)
    old = ca.issue("frontdoor")
    old_cert, old_key = old.cert.read_bytes(), old.key.read_bytes()
    new = ca.issue("frontdoor")
    assert new.key.read_bytes() != old_key
    a, b = (x509.load_pem_x509_certificate(pem) for pem in (old_cert, new.cert.read_bytes()))
    assert a.subject == b.subject and a.serial_number != b.serial_number


def test_a_pkcs12_keystore_holds_the_key_the_certificate_and_the_ca(tmp_path):
    ca = CertificateAuthority.create(tmp_path)
    files = ca.issue("client")
    store = write_pkcs12(files, tmp_path / "client.p12", password="changeit")
    key, cert, extra = pkcs12.load_key_and_certificates(store.read_bytes(), b"changeit")
    assert cert == x509.load_pem_x509_certificate(files.cert.read_bytes())
    assert extra == [x509.load_pem_x509_certificate(files.ca.read_bytes())]
    assert key.public_key() == cert.public_key()
