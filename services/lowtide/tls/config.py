"""TLS settings of servers and clients, and certificates reloaded from disk without a restart.

Server side (every gRPC server, flags of ``add_tls_flags``; docs/design/tls.md)::

    --tls-cert / --tls-key     the server's certificate chain and private key (PEM)
    --tls-ca                   the CA bundle client certificates must chain to (and that this
                               service trusts when it calls other services)
    --tls-client-auth          none | required   (Kafka's ssl.client.auth; gRPC has no "requested")
    --tls-principal-mapping-rules   Kafka's ssl.principal.mapping.rules (tls/principal.py)

Client side (``ClientTls``): the CA to verify servers with, and optionally a client certificate
and key; from a properties file with librdkafka's key names (``ssl.ca.location``,
``ssl.certificate.location``, ``ssl.key.location``, ``ssl.endpoint.identification.name``-like
``lowtide.ssl.server.name``), or from ``LOWTIDE_TLS_CA``/``_CERT``/``_KEY``/``_SERVER_NAME``.

Reloading: ``CertificateWatcher`` polls the three files' (inode, size, mtime) once a second; a
changed set that loads as a matching key and certificate becomes current, a half-written one is
skipped until it is whole (the old certificate keeps serving). gRPC asks for the current
configuration at every new handshake (``dynamic_ssl_server_credentials``), Python ``ssl`` contexts
are reloaded in place (``load_cert_chain`` affects later handshakes only), so new connections get
the new certificate and existing ones keep theirs.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from lowtide.errors import InvalidConfig

# Kafka's default ssl.principal.mapping.rules. principal.py (and the cryptography package it needs)
# is imported only by servers: a client that merely dials TLS does not load it.
DEFAULT_RULES = "DEFAULT"

log = logging.getLogger(__name__)

CLIENT_AUTH_CHOICES = ("none", "required")
POLL_INTERVAL_S = 1.0

# Properties keys (librdkafka's names, so one file serves lowtide and Kafka clients).
CA_KEY = "ssl.ca.location"
CERT_KEY = "ssl.certificate.location"
KEY_KEY = "ssl.key.location"
SERVER_NAME_KEY = "lowtide.ssl.server.name"
PROTOCOL_KEY = "security.protocol"


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidConfig(f"cannot read TLS {what} {str(path)!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise InvalidConfig(f"TLS {what} {str(path)!r} is not PEM")
    return data


@dataclass(frozen=True, slots=True)
class PemSet:
    """One consistent reading of a certificate, its key and the CA bundle (PEM bytes)."""

    cert: bytes
    key: bytes
    ca: bytes | None


class CertificateWatcher:
    """The current ``PemSet`` of three files, re-read when they change.

    ``current`` is the newest set that loaded whole; ``generation`` counts changes; ``on_change``
    callbacks run (on the watcher thread) after each. ``start()`` starts the polling thread (a
    daemon). Thread-safe.
    """

    def __init__(self, *, cert: Path, key: Path, ca: Path | None, interval_s: float = POLL_INTERVAL_S) -> None:
        self.cert_path, self.key_path, self.ca_path = Path(cert), Path(key), Path(ca) if ca else None
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[PemSet], None]] = []
        self._stamp = self._stat()
        self.current = self._load()  # the first load's errors go to the caller: a bad flag stops start-up
        self.generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _paths(self) -> list[Path]:
        return [p for p in (self.cert_path, self.key_path, self.ca_path) if p is not None]

    def _stat(self) -> tuple:
        stamp = []
        for path in self._paths():
            try:
                st = path.stat()
                stamp.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                stamp.append(None)
        return tuple(stamp)

    def _load(self) -> PemSet:
        pems = PemSet(cert=_read(self.cert_path, "certificate"), key=_read(self.key_path, "private key"),
                      ca=_read(self.ca_path, "CA bundle") if self.ca_path else None)
        # A key that does not match its certificate (caught mid-rotation) fails here, not in a handshake.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            _load_chain(context, self.cert_path, self.key_path)
        except ssl.SSLError as exc:
            raise InvalidConfig(f"TLS certificate {str(self.cert_path)!r} and key {str(self.key_path)!r} do not "
                                f"load together: {exc}") from None
        return pems

    def on_change(self, callback: Callable[[PemSet], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)

    def check(self) -> bool:
        """Re-read the files if they changed; True when a new set became current."""
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        try:
            pems = self._load()
        except InvalidConfig as exc:
            log.warning("TLS files changed but do not load yet; still serving the previous certificate: %s", exc)
            return False
        if self._stat() != stamp:
            return False  # changed again while reading: take it on the next poll
        with self._lock:
            self._stamp, self.current = stamp, pems
            self.generation += 1
            callbacks = list(self._callbacks)
        log.info("TLS certificate reloaded", extra={"fields": {"cert": str(self.cert_path),
                                                               "generation": self.generation}})
        for callback in callbacks:
            try:
                callback(pems)
            except Exception:  # one consumer's failure must not stop the others' reload
                log.exception("TLS reload callback failed")
        return True

    def start(self) -> CertificateWatcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tls-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.check()

    def stop(self) -> None:
        self._stop.set()


def _load_chain(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    context.load_cert_chain(certfile=str(cert), keyfile=str(key))


@dataclass(frozen=True, slots=True)
class ServerTlsConfig:
    """A server's TLS flags, checked (``validate``)."""

    cert: Path
    key: Path
    ca: Path | None = None
    client_auth: str = "none"
    principal_rules: str = DEFAULT_RULES

    def validate(self) -> ServerTlsConfig:
        if self.client_auth not in CLIENT_AUTH_CHOICES:
            raise InvalidConfig(f"--tls-client-auth must be one of {', '.join(CLIENT_AUTH_CHOICES)}, "
                                f"got {self.client_auth!r}")
        if self.client_auth == "required" and self.ca is None:
            raise InvalidConfig("--tls-client-auth=required needs --tls-ca: the CA client certificates chain to")
        from lowtide.tls.principal import parse_rules

        parse_rules(self.principal_rules)  # raises InvalidConfig for bad rules
        return self

    @property
    def mutual(self) -> bool:
        return self.client_auth == "required"


class ServerTls:
    """A server's TLS: gRPC server credentials and ``ssl`` contexts that follow rotated files.

    Thread-safe; ``close()`` stops the watcher.
    """

    def __init__(self, config: ServerTlsConfig, *, watch: bool = True) -> None:
        self.config = config.validate()
        from lowtide.tls.principal import PrincipalMapper

        self.watcher = CertificateWatcher(cert=config.cert, key=config.key, ca=config.ca)
        self.mapper = PrincipalMapper(config.principal_rules)
        if watch:
            self.watcher.start()

    @property
    def mutual(self) -> bool:
        return self.config.mutual

    def grpc_credentials(self) -> grpc.ServerCredentials:
        def configuration(pems: PemSet) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration([(pems.key, pems.cert)], root_certificates=pems.ca)

        served = [self.watcher.generation]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # Called by gRPC at every new handshake: None keeps the configuration it has.
            generation = self.watcher.generation
            if generation == served[0]:
                return None
            served[0] = generation
            return configuration(self.watcher.current)

        return grpc.dynamic_ssl_server_credentials(configuration(self.watcher.current), fetch,
                                                   require_client_authentication=self.mutual)

    def ssl_context(self, *, client_auth: str | None = None) -> ssl.SSLContext:
        """A server ``SSLContext`` (TLS 1.2+) reloaded in place when the files change.
        ``client_auth`` overrides the server's setting (a Kafka listener has its own)."""
        mode = client_auth or self.config.client_auth
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(context, self.config.cert, self.config.key)
        if self.config.ca is not None:
            context.load_verify_locations(cafile=str(self.config.ca))
        if mode == "required":
            context.verify_mode = ssl.CERT_REQUIRED
        elif mode == "requested":
            context.verify_mode = ssl.CERT_OPTIONAL
        self.watcher.on_change(lambda _pems: _reload_context(context, self.config))
        return context

    def client(self) -> ClientTls:
        """What this service presents when it calls other services: its own certificate as the
        client certificate, the same CA to verify them."""
        return ClientTls(ca=self.config.ca, cert=self.config.cert, key=self.config.key)

    def close(self) -> None:
        self.watcher.stop()


def _reload_context(context: ssl.SSLContext, config: ServerTlsConfig) -> None:
    _load_chain(context, config.cert, config.key)
    if config.ca is not None:
        context.load_verify_locations(cafile=str(config.ca))


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client connects over TLS: the CA it trusts (None: the system's roots), an optional
    client certificate and key (mutual TLS), and an optional name to verify the server as
    (default: the host of the address dialled)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidConfig("a TLS client certificate needs its key, and a key its certificate")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "CA bundle") if self.ca else None,
            private_key=_read(self.key, "private key") if self.key else None,
            certificate_chain=_read(self.cert, "certificate") if self.cert else None)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []

    def ssl_context(self) -> ssl.SSLContext:
        """A client ``SSLContext`` verifying the server (for Kafka-protocol and Redis clients)."""
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.cert is not None and self.key is not None:
            _load_chain(context, self.cert, self.key)
        return context

    @classmethod
    def from_properties(cls, props: Mapping[str, str], *, base: Path | None = None) -> ClientTls | None:
        """From ``--command-config`` keys; None when the file asks for no TLS (no ``ssl.*`` key
        and no SSL ``security.protocol``). Relative paths are relative to ``base``."""
        protocol = props.get(PROTOCOL_KEY, "").strip().upper()
        keys = (CA_KEY, CERT_KEY, KEY_KEY)
        if not any(props.get(k) for k in keys) and protocol not in ("SSL", "SASL_SSL"):
            return None
        if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
            return None

        def path(key: str) -> Path | None:
            value = props.get(key, "").strip()
            if not value:
                return None
            p = Path(value).expanduser()
            return p if p.is_absolute() or base is None else base / p

        return cls(ca=path(CA_KEY), cert=path(CERT_KEY), key=path(KEY_KEY),
                   server_name=props.get(SERVER_NAME_KEY, "").strip() or None)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientTls | None:
        """From ``LOWTIDE_TLS_CA``/``_CERT``/``_KEY``/``_SERVER_NAME``; None when none is set."""
        env = os.environ if env is None else env
        ca, cert, key = (env.get(f"LOWTIDE_TLS_{n}", "").strip() for n in ("CA", "CERT", "KEY"))
        if not (ca or cert or key):
            return None
        return cls(ca=Path(ca) if ca else None, cert=Path(cert) if cert else None, key=Path(key) if key else None,
                   server_name=env.get("LOWTIDE_TLS_SERVER_NAME", "").strip() or None)

    def to_properties(self) -> dict[str, str]:
        out = {PROTOCOL_KEY: "SSL"}
        for key, value in ((CA_KEY, self.ca), (CERT_KEY, self.cert), (KEY_KEY, self.key)):
            if value is not None:
                out[key] = str(value)
        if self.server_name:
            out[SERVER_NAME_KEY] = self.server_name
        return out


_default_lock = threading.Lock()
_default: list[ClientTls | None] = []


def default_client_tls() -> ClientTls | None:
    """The process's TLS for channels opened without an explicit setting: what a server set
    with ``set_default_client_tls`` (its own certificate), else ``LOWTIDE_TLS_*``, else None."""
    if not _default:
        with _default_lock:
            if not _default:
                _default.append(ClientTls.from_env())
    return _default[0]


def set_default_client_tls(tls: ClientTls | None) -> None:
    with _default_lock:
        _default[:] = [tls]


# -- flags ------------------------------------------------------------------------------------------


def add_tls_flags(parser: argparse.ArgumentParser, add_flag: Callable[..., None]) -> None:
    """The server TLS flags (``add_flag`` gives each its LOWTIDE_* environment fallback)."""
    add_flag(parser, "--tls-cert", default=None, help="server certificate chain (PEM); set with --tls-key to serve TLS")
    add_flag(parser, "--tls-key", default=None, help="private key of --tls-cert (PEM)")
    add_flag(parser, "--tls-ca", default=None,
             help="CA bundle (PEM) that client certificates chain to and that this service trusts when it calls others")
    add_flag(parser, "--tls-client-auth", default="none",
             help="none | required: require a client certificate signed by --tls-ca (Kafka's ssl.client.auth)")
    add_flag(parser, "--tls-principal-mapping-rules", default=DEFAULT_RULES,
             help="Kafka's ssl.principal.mapping.rules: certificate subject -> principal name")


def server_tls_from_args(args: argparse.Namespace) -> ServerTlsConfig | None:
    """The flags as a config; None without --tls-cert/--tls-key; InvalidConfig when half set."""
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    if not cert and not key:
        if getattr(args, "tls_ca", None) or getattr(args, "tls_client_auth", "none") != "none":
            raise InvalidConfig("--tls-ca and --tls-client-auth need --tls-cert and --tls-key")
        return None
    if not cert or not key:
        raise InvalidConfig("--tls-cert and --tls-key go together")
    return ServerTlsConfig(cert=Path(cert), key=Path(key), ca=Path(args.tls_ca) if args.tls_ca else None,
                           client_auth=args.tls_client_auth,
                           principal_rules=args.tls_principal_mapping_rules).validate()
