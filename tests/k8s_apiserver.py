"""A real Kubernetes API server for tests: etcd + kube-apiserver on free loopback ports.

The binaries are the local Kubernetes harness' (``make k8s-build`` builds kube-apiserver into
$LOWTIDE_K8S_HOME/bin, default ~/.cache/lowtide-k8s/bin) and Debian's etcd. Certificates are made
with openssl: a CA, the server's certificate for 127.0.0.1, and a cluster-admin client certificate
(O=system:masters) that the written kubeconfig uses.

    with KubeApiServer.start(tmp_dir) as api:
        api.kubeconfig        # path of a kubeconfig for it
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lowtide.common.procs import find_free_port

K8S_HOME = Path(os.environ.get("LOWTIDE_K8S_HOME", Path.home() / ".cache" / "lowtide-k8s"))
APISERVER = K8S_HOME / "bin" / "kube-apiserver"


def missing_binaries() -> list[str]:
    """What this module needs and the machine lacks (with how to get it)."""
    out = []
    if not APISERVER.is_file():
        out.append(f"{APISERVER} (make k8s-build)")
    if not shutil.which("etcd"):
        out.append("etcd (apt-get install etcd-server; make k8s-build does it)")
    if not shutil.which("openssl"):
        out.append("openssl")
    return out


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _make_pki(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("server", "/CN=kube-apiserver", "server.ext"),
                            ("admin", "/O=system:masters/CN=test-admin", "client.ext")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subj, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "30", "-extfile", ext, "-out", f"{name}.crt", cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass
class KubeApiServer:
    url: str
    kubeconfig: Path
    procs: list[subprocess.Popen]

    @classmethod
    def start(cls, directory: Path, *, timeout_s: float = 120.0) -> KubeApiServer:
        pki = directory / "pki"
        _make_pki(pki)
        logs = directory / "logs"
        logs.mkdir(exist_ok=True)
        client_port, peer_port, api_port = find_free_port(), find_free_port(), find_free_port()
        etcd = subprocess.Popen(
            ["etcd", "--name", "test", "--data-dir", str(directory / "etcd"), "--unsafe-no-fsync",
             "--listen-client-urls", f"http://127.0.0.1:{client_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"test=http://127.0.0.1:{peer_port}"],
            stdout=open(logs / "etcd.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        api = subprocess.Popen(
            [str(APISERVER), f"--etcd-servers=http://127.0.0.1:{client_port}",
             f"--secure-port={api_port}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
             f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
             f"--client-ca-file={pki / 'ca.crt'}", "--service-account-issuer=https://kubernetes.default.svc",
             f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
             "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC",
             "--enable-priority-and-fairness=false", "--profiling=false"],
            stdout=open(logs / "kube-apiserver.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        server = cls(url=f"https://127.0.0.1:{api_port}", kubeconfig=directory / "kubeconfig", procs=[api, etcd])
        server.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters:\n- name: test\n  cluster:\n    server: {server.url}\n"
            f"    certificate-authority: {pki / 'ca.crt'}\n"
            f"users:\n- name: admin\n  user:\n    client-certificate: {pki / 'admin.crt'}\n"
            f"    client-key: {pki / 'admin.key'}\n"
            "contexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n")
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{server.url}/readyz", context=ctx, timeout=2) as reply:
                    if reply.status == 200:
                        return server
            except OSError:
                pass
            if time.monotonic() > deadline or api.poll() is not None:
                server.stop()
                raise RuntimeError(f"kube-apiserver not ready: see {logs / 'kube-apiserver.log'}")
            time.sleep(0.5)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> KubeApiServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
