"""Starting the Kafka protocol listeners inside a lowtide service (replica server, front door).

Listeners, as Kafka's broker configures them:

* ``--kafka-listener HOST:PORT`` (env ``LOWTIDE_KAFKA_LISTENER``; port 0 = any free port): the
  plain listener, named ``PLAINTEXT`` (``SASL_PLAINTEXT`` when ``--auth-enabled``, which then
  requires a SASL login on it, as before named listeners);
* ``--kafka-listeners NAME://HOST:PORT,...`` (Kafka's ``listeners``), e.g.
  ``PLAINTEXT://:9092,SSL://:9093,SASL_SSL://:9094``; a name is a security protocol or mapped to
  one by ``--kafka-listener-security-protocol-map`` (Kafka's ``listener.security.protocol.map``,
  ``NAME:PROTOCOL,...``). An empty host binds every interface. With both flags, the plain
  ``--kafka-listener`` comes first;
* ``--kafka-advertised-listeners NAME://HOST:PORT,...`` (Kafka's ``advertised.listeners``): what
  Metadata tells clients per listener; a listener left out (or port 0) is advertised as the
  service's advertised host with the bound port. A replica registers them all in its broker
  record, and Metadata/FindCoordinator/DescribeCluster answer with the endpoints of the listener
  a request arrived on (apis_admin.py).

Security protocols: ``PLAINTEXT`` and ``SASL_PLAINTEXT`` (TCP; SASL served, required with auth on);
``SSL`` (TLS; the client certificate, per ``--kafka-ssl-client-auth none|requested|required``,
Kafka's ``ssl.client.auth``, is the identity: kafka/tls_identity.py); ``SASL_SSL`` (TLS, then the
same SASL mechanisms as SASL_PLAINTEXT; no client certificate asked: Kafka too applies
``ssl.client.auth`` to a SASL listener only when set for that listener). The TLS listeners serve
the process's own certificate (``--tls-cert``/``--tls-key``, re-read when rotated; client
certificates checked against ``--tls-ca``); a TLS listener without ``--tls-cert`` stops start-up.

KIP-714 client telemetry (kafka/apis_telemetry.py, observability/client_telemetry.py):
``--client-telemetry-push-interval-ms`` (0 = off), ``--client-telemetry-metrics`` (the metric name
prefixes clients are asked for), ``--client-telemetry-max-bytes``, ``--client-telemetry-max-clients``
and ``--client-telemetry-max-series-per-client``; ``client_telemetry`` builds the process's store
and registers it with ``/metrics``.

Also ``--kafka-max-request-bytes`` (Kafka's ``socket.request.max.bytes``) and
``--kafka-connections-max-reauth-ms`` (Kafka's ``connections.max.reauth.ms``: how long a SASL/SCRAM
login's, or an SSL certificate login's, session token lasts; apis_sasl.py). A replica server also
needs ``--frontdoor-addr``: its listeners forward cluster, topic, group and DeleteRecords requests
there.

The ports are bound before the service registers (a replica advertises them in its broker record),
and the handlers are attached once the service's servicers exist; a request arriving in between
is refused by closing its connection, as a broker that is still starting does.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry

from lowtide.common.server import add_flag
from lowtide.errors import InvalidConfig
from lowtide.kafka import (
    apis_admin,
    apis_cluster,
    apis_configs,
    apis_consumer_groups,
    apis_data,
    apis_groups,
    apis_partitions,
    apis_sasl,
    apis_scram,
    apis_share,
    apis_telemetry,
    apis_txn,
)
from lowtide.kafka.broker import MAX_TRANSACTION_VERSION, Api, KafkaBroker
from lowtide.kafka.listener import Connection, KafkaListener
from lowtide.kafka.protocol import DEFAULT_MAX_REQUEST_BYTES, FrameError, RequestHead
from lowtide.kafka.tls_identity import CertificateLogin, End, Mint
from lowtide.observability.client_telemetry import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CLIENTS,
    DEFAULT_MAX_SERIES_PER_CLIENT,
    DEFAULT_PUSH_INTERVAL_MS,
    DEFAULT_REQUESTED_METRICS,
    ClientTelemetry,
    TelemetryConfig,
    parse_requested_metrics,
)
from lowtide.record.compression import Compression, readable
from lowtide.rpc.steps import Steps
from lowtide.tls.config import ServerTls

# Kafka's connections.max.reauth.ms is 0 (sessions never end) by default; lowtide's SCRAM sessions
# stand for a minted token, which must end, so they last an hour and clients re-authenticate.
DEFAULT_SESSION_LIFETIME_MS = 3_600_000


def all_apis() -> list[Api]:
    """Every API the Kafka listener serves, with its version range."""
    return [*apis_data.APIS, *apis_admin.APIS, *apis_groups.APIS, *apis_consumer_groups.APIS,
            *apis_sasl.APIS, *apis_configs.APIS, *apis_scram.APIS,
            *apis_txn.APIS, *apis_cluster.APIS, *apis_partitions.APIS, *apis_telemetry.APIS,
            *apis_share.APIS]


PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")
SSL_CLIENT_AUTH = ("none", "requested", "required")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in PROTOCOLS)


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """One Kafka listener: its name, security protocol and bind address."""

    name: str
    protocol: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS


def _split_url(item: str, flag: str) -> tuple[str, str, int]:
    name, sep, address = item.strip().partition("://")
    host, colon, port = address.rpartition(":")
    if not sep or not name or not colon or not port.isdigit():
        raise InvalidConfig(f"{flag}: {item.strip()!r} is not NAME://HOST:PORT")
    return name.strip().upper(), host.removeprefix("[").removesuffix("]"), int(port)


def parse_protocol_map(text: str) -> dict[str, str]:
    """Kafka's ``listener.security.protocol.map``: ``NAME:PROTOCOL,...``."""
    out: dict[str, str] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, _, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not name or protocol not in PROTOCOLS:
            raise InvalidConfig(f"--kafka-listener-security-protocol-map: {item!r} is not NAME:PROTOCOL with "
                                f"PROTOCOL one of {', '.join(PROTOCOLS)}")
        out[name] = protocol
    return out


def parse_listeners(text: str, protocol_map: dict[str, str]) -> list[ListenerSpec]:
    """Kafka's ``listeners``: ``NAME://HOST:PORT,...`` (an empty host binds every interface)."""
    specs: list[ListenerSpec] = []
    for item in (i for i in text.split(",") if i.strip()):
        name, host, port = _split_url(item, "--kafka-listeners")
        protocol = protocol_map.get(name)
        if protocol is None:
            raise InvalidConfig(f"--kafka-listeners: listener {name!r} has no security protocol: name it one of "
                                f"{', '.join(PROTOCOLS)} or map it with --kafka-listener-security-protocol-map")
        specs.append(ListenerSpec(name=name, protocol=protocol, host=host or "0.0.0.0", port=port))
    return specs


def parse_advertised(text: str) -> dict[str, tuple[str, int]]:
    """Kafka's ``advertised.listeners``: listener name -> (host, port); port 0 = the bound one."""
    out: dict[str, tuple[str, int]] = {}
    for item in (i for i in text.split(",") if i.strip()):
        name, host, port = _split_url(item, "--kafka-advertised-listeners")
        out[name] = (host, port)
    return out


def add_kafka_flags(parser: argparse.ArgumentParser, *, needs_frontdoor: bool) -> None:
    add_flag(parser, "--kafka-listener", default=None,
             help="HOST:PORT of the plain Kafka protocol listener, named PLAINTEXT (SASL_PLAINTEXT with "
                  "--auth-enabled) (unset = none; port 0 = any free port)")
    add_flag(parser, "--kafka-listeners", default=None,
             help="Kafka's listeners: NAME://HOST:PORT,... e.g. PLAINTEXT://:9092,SSL://:9093,SASL_SSL://:9094 "
                  "(TLS listeners serve --tls-cert)")
    add_flag(parser, "--kafka-advertised-listeners", default=None,
             help="Kafka's advertised.listeners: NAME://HOST:PORT,... what Metadata gives clients per listener "
                  "(default: the advertised host and the bound port)")
    add_flag(parser, "--kafka-listener-security-protocol-map", default=DEFAULT_PROTOCOL_MAP,
             help="Kafka's listener.security.protocol.map: NAME:PROTOCOL,... for listeners not named after "
                  "their protocol")
    add_flag(parser, "--kafka-ssl-client-auth", default="none",
             help="none | requested | required: client certificates on SSL and SASL_SSL listeners (Kafka's "
                  "ssl.client.auth); on SSL the certificate's principal is the connection's identity")
    add_flag(parser, "--kafka-max-request-bytes", default=DEFAULT_MAX_REQUEST_BYTES, type=int,
             help="largest Kafka request frame accepted (Kafka's socket.request.max.bytes)")
    add_flag(parser, "--kafka-workers", default=64, type=int, help="threads handling Kafka requests")
    add_flag(parser, "--kafka-connections-max-reauth-ms", default=DEFAULT_SESSION_LIFETIME_MS, type=int,
             help="lifetime of a SASL/SCRAM login's session (Kafka's connections.max.reauth.ms): clients "
                  "re-authenticate before it ends, else their connection is closed (at least 1000)")
    add_flag(parser, "--client-telemetry-push-interval-ms", default=DEFAULT_PUSH_INTERVAL_MS, type=int,
             help="KIP-714 client telemetry: how often clients push their metrics (0 = telemetry off: "
                  "clients are asked for no metric)")
    add_flag(parser, "--client-telemetry-metrics", default=",".join(DEFAULT_REQUESTED_METRICS),
             help="KIP-714 client telemetry: comma-separated prefixes of the metric names clients are asked "
                  "to push (* = all, empty = none)")
    add_flag(parser, "--client-telemetry-max-bytes", default=DEFAULT_MAX_BYTES, type=int,
             help="KIP-714 client telemetry: largest push accepted, as sent (Kafka's telemetry.max.bytes)")
    add_flag(parser, "--client-telemetry-max-clients", default=DEFAULT_MAX_CLIENTS, type=int,
             help="KIP-714 client telemetry: client instances kept (the least recently heard from is evicted)")
    add_flag(parser, "--client-telemetry-max-series-per-client", default=DEFAULT_MAX_SERIES_PER_CLIENT, type=int,
             help="KIP-714 client telemetry: series kept per client instance (client-wide ones first)")
    add_flag(parser, "--kafka-transaction-version", default=MAX_TRANSACTION_VERSION, type=int,
             help="the transaction.version feature level ApiVersions finalizes (Kafka's kafka-features "
                  "transaction.version): 2 = Kafka 4 producers run transactions version 2 (KIP-890: an epoch "
                  "bump per transaction, no AddPartitionsToTxn), 0 or 1 = version 1")
    if needs_frontdoor:
        add_flag(parser, "--frontdoor-addr", default=None,
                 help="gRPC address of the front door, where the Kafka listener sends admin and group requests")


class KafkaEndpoint:
    """The bound listeners of one service, whose broker is attached later (``attach``)."""

    def __init__(self, *, listeners: list[ListenerSpec], max_request_bytes: int, workers: int, name: str,
                 tls: ServerTls | None = None, ssl_client_auth: str = "none",
                 advertised: dict[str, tuple[str, int]] | None = None) -> None:
        if not listeners:
            raise InvalidConfig("no Kafka listener to start")
        names = [spec.name for spec in listeners]
        if len(set(names)) != len(names):
            raise InvalidConfig(f"Kafka listener names must be unique, got {', '.join(names)}")
        if ssl_client_auth not in SSL_CLIENT_AUTH:
            raise InvalidConfig(f"--kafka-ssl-client-auth must be one of {', '.join(SSL_CLIENT_AUTH)}, "
                                f"got {ssl_client_auth!r}")
        unknown = sorted(set(advertised or {}) - set(names))
        if unknown:
            raise InvalidConfig(f"--kafka-advertised-listeners names {', '.join(unknown)}, which "
                                f"--kafka-listeners does not have")
        tls_names = [spec.name for spec in listeners if spec.tls]
        if tls_names and tls is None:
            raise InvalidConfig(f"Kafka listener {', '.join(tls_names)} needs a certificate: set --tls-cert and "
                                "--tls-key")
        if tls is not None and ssl_client_auth != "none" and tls.config.ca is None:
            raise InvalidConfig(f"--kafka-ssl-client-auth={ssl_client_auth} needs --tls-ca: the CA client "
                                "certificates chain to")
        self.specs = list(listeners)
        self.tls = tls
        self._advertised = dict(advertised or {})
        self._broker: KafkaBroker | None = None
        self._ready = threading.Event()
        self.listeners = [
            KafkaListener(host=spec.host, port=spec.port, dispatch=self._dispatch, steps=self._dispatch_steps,
                          max_request_bytes=max_request_bytes, workers=workers, name=name,
                          listener_name=spec.name, protocol=spec.protocol,
                          ssl_context=tls.ssl_context(client_auth=ssl_client_auth if spec.protocol == "SSL" else "none")
                          if spec.tls and tls else None)
            for spec in listeners]
        self.ports: dict[str, int] = {}

    @property
    def listener(self) -> KafkaListener:
        """The first listener (the plain one when ``--kafka-listener`` is set)."""
        return self.listeners[0]

    @property
    def port(self) -> int:
        return self.listener.port

    @property
    def has_ssl(self) -> bool:
        return any(spec.protocol == "SSL" for spec in self.specs)

    @classmethod
    def from_args(cls, args: argparse.Namespace, *, name: str, tls: ServerTls | None = None) -> KafkaEndpoint | None:
        """The listeners the flags ask for (None: no Kafka listener); SystemExit for bad flags."""
        try:
            specs: list[ListenerSpec] = []
            if args.kafka_listener:
                host, _, port = args.kafka_listener.rpartition(":")
                plain = "SASL_PLAINTEXT" if getattr(args, "auth_enabled", False) else "PLAINTEXT"
                specs.append(ListenerSpec(name=plain, protocol=plain, host=host or "0.0.0.0", port=int(port)))
            if getattr(args, "kafka_listeners", None):
                specs += parse_listeners(args.kafka_listeners, parse_protocol_map(
                    getattr(args, "kafka_listener_security_protocol_map", None) or DEFAULT_PROTOCOL_MAP))
            if not specs:
                return None
            level = getattr(args, "kafka_transaction_version", MAX_TRANSACTION_VERSION)
            if not 0 <= level <= MAX_TRANSACTION_VERSION:
                raise InvalidConfig(f"--kafka-transaction-version must be 0 to {MAX_TRANSACTION_VERSION}, got {level}")
            return cls(listeners=specs, max_request_bytes=args.kafka_max_request_bytes, workers=args.kafka_workers,
                       name=name, tls=tls, ssl_client_auth=getattr(args, "kafka_ssl_client_auth", None) or "none",
                       advertised=parse_advertised(getattr(args, "kafka_advertised_listeners", None) or ""))
        except (InvalidConfig, ValueError) as exc:
            raise SystemExit(f"{name}: {getattr(exc, 'message', None) or exc}") from None

    def start(self) -> int:
        """Bind every listener; returns the first one's port."""
        for listener in self.listeners:
            self.ports[listener.listener_name] = listener.start()
        return self.port

    def advertised(self, host: str) -> dict[str, str]:
        """Listener name -> the ``host:port`` clients are told (``--kafka-advertised-listeners``,
        else ``host`` and the bound port)."""
        out = {}
        for name, port in self.ports.items():
            adv_host, adv_port = self._advertised.get(name, ("", 0))
            out[name] = f"{adv_host or host}:{adv_port or port}"
        return out

    def advertised_port(self, host: str) -> int:
        """The first listener's advertised port (a broker record's ``kafka_port``)."""
        return int(self.advertised(host)[self.listener.listener_name].rpartition(":")[2])

    @property
    def loop(self):
        """The first listener's event loop (after ``start``), for the process's other servers."""
        return self.listener.loop

    def attach(self, broker: KafkaBroker) -> None:
        self._broker = broker
        self._ready.set()

    def stop(self) -> None:
        for listener in self.listeners:
            listener.stop()

    def _dispatch_steps(self, conn: Connection, head: RequestHead, payload: bytes) -> Steps[bytes | None] | None:
        """The request as steps for the listener's loop; None until the service is ready (the
        worker path waits for it)."""
        if not self._ready.is_set():
            return None
        if conn.protocol == "SSL" and (not conn.authenticated or (
                conn.session_deadline is not None and time.monotonic() >= conn.session_deadline)):
            return None  # its certificate login may call other services: not on the loop
        return self._broker.steps(conn, head, payload)

    def _dispatch(self, conn: Connection, head: RequestHead, payload: bytes) -> bytes | None:
        if not self._ready.wait(timeout=10):
            raise FrameError("the service is still starting")
        return self._broker(conn, head, payload)


# The codecs clients may compress their telemetry with, in order of preference (they use the first).
TELEMETRY_CODECS = (Compression.ZSTD, Compression.LZ4, Compression.GZIP)


def client_telemetry(args: argparse.Namespace, *, name: str,
                     registry: CollectorRegistry | None = REGISTRY) -> ClientTelemetry:
    """The process's KIP-714 client telemetry from the ``--client-telemetry-*`` flags, its
    collector registered with ``registry`` (the process's /metrics; None: not registered).
    SystemExit for bad flags. Call once per process: a registry takes a collector's names once."""
    try:
        config = TelemetryConfig(
            push_interval_ms=args.client_telemetry_push_interval_ms,
            requested_metrics=parse_requested_metrics(args.client_telemetry_metrics or ""),
            max_bytes=args.client_telemetry_max_bytes, max_clients=args.client_telemetry_max_clients,
            max_series_per_client=args.client_telemetry_max_series_per_client)
    except InvalidConfig as exc:
        raise SystemExit(f"{name}: {exc.message}") from None
    telemetry = ClientTelemetry(config, accepted_compression_types=[c for c in TELEMETRY_CODECS if readable(c)])
    if registry is not None:
        registry.register(telemetry)
    return telemetry


def certificate_login(endpoint: KafkaEndpoint, *, mint: Mint | None, end: End | None, session_lifetime_ms: int,
                      verify: Callable[[tuple[tuple[str, str], ...]], str] | None) -> CertificateLogin | None:
    """The certificate logins of ``endpoint``'s SSL listeners (None when it has none). With
    authentication on, ``mint``/``end`` make and forget session tokens (auth/tokens.py) and
    ``verify`` is the service's own authenticator; with it off, all three are None."""
    if not endpoint.has_ssl or endpoint.tls is None:
        return None
    return CertificateLogin(mapper=endpoint.tls.mapper, mint=mint, end=end, session_lifetime_ms=session_lifetime_ms,
                            verify=verify)
