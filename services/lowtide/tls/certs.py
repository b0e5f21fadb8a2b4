"""Making certificates: a self-signed CA and the certificates it signs, as PEM files.

``lowtide cluster up --tls`` and the tests use this to give every service its own certificate
(docs/design/tls.md). The chart does the same with Helm's ``genCA``/``genSignedCert`` or takes
the Secrets cert-manager writes; nothing here runs in production pods.

Files written (the layout cert-manager writes into a ``kubernetes.io/tls`` Secret, so the same
flags point at either)::

    DIR/ca.crt                 the CA certificate (PEM), what clients trust
    DIR/ca.key                 the CA's private key (PKCS#8 PEM, 0600), kept to sign more
    DIR/<name>/tls.crt         the certificate (PEM), signed by the CA
    DIR/<name>/tls.key         its private key (PKCS#8 PEM, unencrypted, 0600)
    DIR/<name>/ca.crt          a copy of the CA certificate

Keys are EC P-256: cheap handshakes, and every peer (gRPC's BoringSSL, Python's OpenSSL, Java,
librdkafka) accepts them. PKCS#8 because Java's PEM keystore (KIP-651) reads only that.
Certificates carry both serverAuth and clientAuth: a service's certificate is also the client
certificate it presents to the services it calls (mutual TLS), as a Kafka broker's keystore is.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ORGANIZATION = "lowtide"
DEFAULT_DAYS = 825  # what browsers and most TLS stacks accept as a leaf's longest validity


@dataclass(frozen=True, slots=True)
class CertFiles:
    """Where one certificate, its key and the CA that signed it are."""

    cert: Path
    key: Path
    ca: Path


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    # .tmp, fsync, rename: a service reloading a rotated certificate never reads half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> dt.datetime:
    # Back-dated a minute: a peer whose clock is slightly behind must not see "not yet valid".
    return dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)


class CertificateAuthority:
    """A CA key and certificate that issue service and client certificates.

    ``create(dir)`` makes a new CA (or loads the one already in ``dir``: a restarted local cluster
    keeps its certificates); ``issue(...)`` writes a signed certificate. Not thread-safe.
    """

    def __init__(self, *, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.directory = directory
        self._key = key
        self.cert = cert

    @property
    def ca_path(self) -> Path:
        return self.directory / "ca.crt"

    @classmethod
    def create(cls, directory: Path | str, *, common_name: str = "lowtide local CA",
               days: int = 3650) -> CertificateAuthority:
        directory = Path(directory)
        cert_path, key_path = directory / "ca.crt", directory / "ca.key"
        if cert_path.exists() and key_path.exists():
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
            assert isinstance(key, ec.EllipticCurvePrivateKey), f"{key_path}: not an EC key"
            return cls(directory=directory, key=key, cert=x509.load_pem_x509_certificate(cert_path.read_bytes()))
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name(common_name)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(_now())
                .not_valid_after(_now() + dt.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        _write(key_path, _key_pem(key), secret=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), secret=False)
        return cls(directory=directory, key=key, cert=cert)

    def issue(self, name: str, *, common_name: str | None = None, hosts: Sequence[str] = ("localhost", "127.0.0.1"),
              days: int = DEFAULT_DAYS, directory: Path | None = None) -> CertFiles:
        """Write ``<dir>/<name>/tls.crt|tls.key|ca.crt``: a certificate for subject
        ``CN=<common_name or name>,O=lowtide`` valid for ``hosts`` (DNS names or IP addresses,
        the names clients check), overwriting an older one (a rotation)."""
        target = directory or self.directory / name
        key = ec.generate_private_key(ec.SECP256R1())
        alt_names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt_names.append(x509.DNSName(host))
        builder = (x509.CertificateBuilder().subject_name(_name(common_name or name)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(_now()).not_valid_after(_now() + dt.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                                  critical=False))
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        files = CertFiles(cert=target / "tls.crt", key=target / "tls.key", ca=target / "ca.crt")
        # Key first: a reader that sees the new certificate must find its key already there.
        _write(files.key, _key_pem(key), secret=True)
        _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), secret=False)
        _write(files.ca, self.cert.public_bytes(serialization.Encoding.PEM), secret=False)
        return files


def write_pkcs12(files: CertFiles, path: Path, *, password: str) -> Path:
    """The certificate and key of ``files`` as a PKCS#12 keystore (Java's default keystore type),
    for Kafka's Java tools when a PEM keystore is not wanted."""
    from cryptography.hazmat.primitives.serialization import pkcs12

    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    data = pkcs12.serialize_key_and_certificates(
        b"lowtide", key, cert, [x509.load_pem_x509_certificate(files.ca.read_bytes())],  # type: ignore[arg-type]
        serialization.BestAvailableEncryption(password.encode()))
    _write(path, data, secret=True)
    return path
