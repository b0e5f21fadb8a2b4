"""Renew a certificate Secret of the chart as cert-manager would: same subject and names, a new key
and serial, signed by the release's CA (tests/k8s/test.sh, phase "certificate rotation").

    kubectl get secret lt-lowtide-frontdoor-tls -o json > leaf.json
    kubectl get secret lt-lowtide-ca -o json > ca.json
    python rotate_cert.py leaf.json ca.json > renewed.json   # prints the new serial (hex) on stderr
    kubectl replace -f renewed.json

Runs with the repository's .venv (the cryptography package).
"""

import base64
import datetime as dt
import json
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def pem(secret: dict, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def main() -> None:
    leaf = json.load(open(sys.argv[1]))
    ca = json.load(open(sys.argv[2]))
    ca_cert = x509.load_pem_x509_certificate(pem(ca, "tls.crt"))
    ca_key = serialization.load_pem_private_key(pem(ca, "tls.key"), password=None)
    old = x509.load_pem_x509_certificate(pem(leaf, "tls.crt"))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(old.subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=30)))
    for ext in old.extensions:  # names, key usages, EKU (serverAuth + clientAuth), basic constraints
        if not isinstance(ext.value, (x509.SubjectKeyIdentifier, x509.AuthorityKeyIdentifier)):
            builder = builder.add_extension(ext.value, critical=ext.critical)
    cert = builder.sign(ca_key, hashes.SHA256())
    leaf["data"]["tls.crt"] = base64.b64encode(cert.public_bytes(serialization.Encoding.PEM)).decode()
    leaf["data"]["tls.key"] = base64.b64encode(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())).decode()
    for field in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
        leaf["metadata"].pop(field, None)
    json.dump(leaf, sys.stdout)
    print(f"{cert.serial_number:x}", file=sys.stderr)


if __name__ == "__main__":
    main()
