"""The Kafka protocol front of a lowtide service: which APIs it serves, in which versions, and the
dispatch of one request to its handler.

Each API is an ``Api`` row: Kafka's API key, the version range advertised by ApiVersions, and a
handler ``(call, body) -> response entity``. Handlers live in ``lowtide.kafka.apis_*`` and only
translate: the Kafka message into ``lowtide.messages`` types for a domain handler, called by its
Python method (the replica's handlers on ``KafkaServices``, the front door's objects through
``Call.front``), and its answer into the Kafka response of the version asked (``Call.make`` drops
fields that version lacks). No protobuf and no method name is on the way
(tests/unit/kafka/test_door_path.py).

Answers to requests that are not served, as Kafka gives them:

* an API key or version outside the advertised ranges: the response of that version with every
  error code UNSUPPORTED_VERSION (ApiVersions itself answers v0 with its version list, KIP-511);
* a whole-call ``LowtideError`` (a refused identity, the front door unreachable): every error
  code of the response set to the error's code;
* bytes that do not parse: the connection is closed (``FrameError``).
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from types import GeneratorType
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from lowtide.errors import LowtideError, SaslAuthenticationFailed, UnknownServerError
from lowtide.kafka.listener import Connection
from lowtide.kafka.metadata_responses import MetadataResponses
from lowtide.kafka.protocol import (
    API_VERSIONS_KEY,
    UNSUPPORTED_VERSION,
    FrameError,
    RequestHead,
    encode_response,
    error_code,
    error_response,
    read_request,
    response_type,
)
from lowtide.messages import TopicPartition
from lowtide.messages.admin import DeleteRequestItem
from lowtide.messages.replica import (
    DeleteRecordsResult,
    EpochEndOffset,
    EpochQuery,
    FetchedPartition,
    FetchPosition,
    OffsetQuery,
    PartitionOffset,
    PartitionProducers,
    ProducedPartition,
    ProduceItem,
    TxnMarkerRequest,
    TxnMarkerResult,
)
from lowtide.messages.share import ShareFetchAnswer, ShareFetchAsk, ShareGroupOffsets
from lowtide.rpc.steps import Steps, run_blocking

log = logging.getLogger(__name__)

REQUESTS = Counter("lowtide_kafka_requests_total", "Kafka protocol requests answered, by API and outcome",
                   ["api", "outcome"])
LATENCY = Histogram("lowtide_kafka_request_duration_seconds", "Kafka protocol request handling time", ["api"],
                    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))

# APIs a connection may use before it has authenticated (with auth on): the SASL exchange itself.
SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 17, 36
_BEFORE_AUTH = {API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY}


@dataclass(frozen=True)
class Node:
    """How clients reach one Kafka listener (Kafka's broker endpoint)."""

    node_id: int
    host: str
    port: int
    rack: str = ""


class ScramSession(Protocol):
    """A successful SCRAM login (``lowtide.auth.scram_store.ScramSession``)."""

    principal: str
    server_final: bytes
    lifetime_ms: int  # 0: the session never ends (no re-authentication asked)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]: ...


class ScramLogins(Protocol):
    """The server side of SCRAM (``lowtide.auth.scram_store.ScramLogin``): credentials live where
    the auth package reads them; this package only carries the messages."""

    mechanisms: tuple[str, ...]

    def start(self, mechanism: str, client_first: bytes) -> Any: ...  # has .server_first: str

    def finish(self, exchange: Any, client_final: bytes) -> ScramSession: ...

    def end(self, session: Any) -> None: ...


class CertificateLogins(Protocol):
    """``lowtide.kafka.tls_identity.CertificateLogin``: makes (or renews) a TLS connection's
    identity from its client certificate; raises SaslAuthenticationFailed when it cannot."""

    def login(self, conn: Connection) -> None: ...


class ProduceHandler(Protocol):
    """The replica's Produce handler (``lowtide.replica.produce_handler.ProduceHandler``)."""

    def produce_steps(self, principal: str, items: Sequence[ProduceItem], *, acks: int,
                      timeout_ms: int) -> Steps[list[ProducedPartition]]: ...

    def in_transaction(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> bool: ...


class FetchHandler(Protocol):
    """The replica's Fetch handler (``lowtide.replica.fetch_handler.FetchHandler``)."""

    def fetch_steps(self, principal: str, items: Sequence[FetchPosition], *, max_wait_ms: int, min_bytes: int,
                    max_bytes: int, isolation_level: int = 0, peer: str = "",
                    on_cancel: Callable[[Callable[[], None]], object] | None = None
                    ) -> Steps[list[FetchedPartition]]: ...


class ListOffsetsHandler(Protocol):
    """The replica's ListOffsets handler (``lowtide.replica.list_offsets_handler.ListOffsetsHandler``)."""

    def list_offsets(self, principal: str, queries: Sequence[OffsetQuery], *,
                     isolation_level: int = 0) -> list[PartitionOffset]: ...


class DeleteRecordsHandler(Protocol):
    """The replica's DeleteRecords handler (``lowtide.replica.delete_records_handler``)."""

    def serves_here(self, items: Sequence[DeleteRequestItem]) -> bool: ...

    def delete_records(self, principal: str, items: Sequence[DeleteRequestItem], *,
                       timeout_ms: int) -> list[DeleteRecordsResult]: ...


class OffsetForLeaderEpochHandler(Protocol):
    """The replica's OffsetForLeaderEpoch handler (``lowtide.replica.leader_epoch_handler``)."""

    def offset_for_leader_epoch(self, principal: str, queries: Sequence[EpochQuery]) -> list[EpochEndOffset]: ...


class TxnMarkersHandler(Protocol):
    """The replica's WriteTxnMarkers handler (``lowtide.replica.txn_markers_handler``): per marker,
    its partitions' ``TxnMarkerResult``; raises CLUSTER_AUTHORIZATION_FAILED for the whole call."""

    def write_txn_markers(self, principal: str, markers: Sequence[TxnMarkerRequest], *,
                          timeout_ms: int = 0) -> list[list[TxnMarkerResult]]: ...


class DescribeProducersHandler(Protocol):
    """The replica's DescribeProducers handler (``lowtide.replica.describe_producers_handler``)."""

    def describe_producers(self, principal: str, partitions: Sequence[TopicPartition]
                           ) -> list[PartitionProducers]: ...


class ShareFetchHandler(Protocol):
    """The replica's ShareFetch/ShareAcknowledge handler (``lowtide.replica.share_handler``, KIP-932)."""

    def share_fetch(self, principal: str, ask: ShareFetchAsk) -> ShareFetchAnswer: ...

    def describe_offsets(self, principal: str, group_id: str,
                         topics: dict[str, tuple[int, ...]] | None) -> ShareGroupOffsets: ...

    def alter_offsets(self, principal: str, group_id: str,
                      targets: dict[str, dict[int, int]]) -> ShareGroupOffsets: ...


class TelemetryHandler(Protocol):
    """The process's KIP-714 client telemetry (``lowtide.observability.client_telemetry.
    ClientTelemetry``): the subscription, the push rules and the pushed metrics."""

    max_inflated_bytes: int

    def subscribe(self, client_instance_id: uuid.UUID | None) -> Any: ...

    def admit(self, client_instance_id: uuid.UUID, *, subscription_id: int, terminating: bool,
              compression_type: int, size: int) -> None: ...

    def record(self, client_instance_id: uuid.UUID, *, client_id: str, payload: bytes) -> int: ...

    def forget(self, client_instance_id: uuid.UUID) -> None: ...


class FrontDoorParts(Protocol):
    """The front door's domain objects (``lowtide.frontdoor.servicer.FrontDoor``, or its remote
    twin ``lowtide.client.frontdoor.RemoteFrontDoorView``): each takes and answers
    lowtide.messages types and the caller's principal. A part a front door does not run is None."""

    topics: Any
    deleter: Any
    configs: Any
    partitions: Any
    elections: Any
    reassigner: Any
    groups: Any
    members: Any
    consumer_groups: Any
    share_groups: Any
    transactions: Any
    acls: Any
    scram: Any


# KIP-584 features this broker advertises (ApiVersions v3+): Kafka's transaction.version, levels
# 0-2. The finalized levels never change while a process runs, so their epoch is a constant.
TRANSACTION_VERSION_FEATURE = "transaction.version"
MAX_TRANSACTION_VERSION = 2
FINALIZED_FEATURES_EPOCH = 1


@dataclass
class KafkaServices:
    """What the handlers of one listener call. ``node`` is this listener as clients see it
    (a replica: its broker id; a front door: -1, it is only a bootstrap address)."""

    node: Node
    auth_required: bool = False
    # Auth on: call metadata ("authorization: Bearer <token>") -> the principal, or raises
    # SaslAuthenticationFailed (the service's own authenticator). None = auth off: any SASL login
    # is accepted and the services see User:ANONYMOUS, as over gRPC.
    sasl_login: Callable[[tuple[tuple[str, str], ...]], str] | None = None
    # SCRAM-SHA-256/512 logins (None: only PLAIN is offered).
    scram: ScramLogins | None = None
    # SSL listeners: the client certificate as the connection's identity (kafka/tls_identity.py's
    # CertificateLogin; None: no SSL listener here).
    certificates: CertificateLogins | None = None
    extra: dict = field(default_factory=dict)
    # The replica of this process, called in process with lowtide.messages types (no protobuf,
    # no method names): the Produce, Fetch, ListOffsets and DeleteRecords handlers, and how a
    # connection's metadata names its principal (checked per request, as a gRPC call's token is).
    # Encoded Metadata answers kept while this process's view of the store is no newer.
    metadata_responses: MetadataResponses | None = None
    producer: ProduceHandler | None = None
    fetcher: FetchHandler | None = None
    offsets: ListOffsetsHandler | None = None
    deleter: DeleteRecordsHandler | None = None
    epochs: OffsetForLeaderEpochHandler | None = None
    authenticate: Callable[[Sequence[tuple[str, str]]], str] | None = None
    # The front door's domain objects for a connection's identity (Call.front): the FrontDoor of
    # this process (a front door's listener), or RemoteFrontDoor.bound (a replica's).
    front_door: Callable[[Sequence[tuple[str, str]]], FrontDoorParts] | None = None
    # The replica's WriteTxnMarkers and DescribeProducers handlers (None: no replica here, a front
    # door's listener, which answers each partition NOT_LEADER_OR_FOLLOWER).
    txn_markers: TxnMarkersHandler | None = None
    producer_states: DescribeProducersHandler | None = None
    # KIP-714 client telemetry of this process (kafka/apis_telemetry.py; None: telemetry off).
    telemetry: TelemetryHandler | None = None
    # The transaction.version feature level ApiVersions finalizes (--kafka-transaction-version): 2
    # makes a Kafka 4 producer speak transactions version 2 (KIP-890), 0 or 1 version 1.
    transaction_version: int = MAX_TRANSACTION_VERSION
    # The replica's KIP-932 share fetch handler (None: no replica here, every partition
    # NOT_LEADER_OR_FOLLOWER).
    share: ShareFetchHandler | None = None


@dataclass
class Call:
    """One request being handled."""

    conn: Connection
    head: RequestHead
    client_id: str | None
    services: KafkaServices

    @property
    def version(self) -> int:
        return self.head.api_version

    @property
    def response(self) -> type:
        return response_type(self.head.api_key, self.head.api_version)

    def make(self, entity: str | type, /, **values: Any) -> Any:
        """An entity of this version's response module (``entity`` a class name there, or the
        class), given only the fields this version has (others are dropped)."""
        cls = _entity(self.response, entity) if isinstance(entity, str) else entity
        names = _field_names(cls)
        return cls(**{k: v for k, v in values.items() if k in names})

    @property
    def front(self) -> FrontDoorParts:
        """The front door's domain objects (admin, groups, transactions), called with
        lowtide.messages types: in process in a front door, over gRPC from a replica."""
        front_door = self.services.front_door
        if front_door is None:
            raise LowtideError("the front door is not reachable from this listener")
        return front_door(self.conn.metadata)

    def principal(self) -> str:
        """The connection's principal as the in-process handlers take it: the service's own
        authenticator reads the connection's identity (metadata), per request, as it reads a
        gRPC call's token."""
        authenticate = self.services.authenticate
        if authenticate is None:
            raise UnknownServerError("this listener has no authenticator for in-process calls")
        return authenticate(self.conn.metadata)


Handler = Callable[[Call, Any], Any]


# The metrics' children, looked up once per label set: labels() takes a lock and builds a tuple on
# every call, twice per request.
@functools.cache
def _latency(api: str):
    return LATENCY.labels(api)


@functools.cache
def _requests(api: str, outcome: str):
    return REQUESTS.labels(api, outcome)


@functools.cache
def _entity(response: type, name: str) -> type:
    return getattr(sys.modules[response.__module__], name)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    """A kio entity's field names (every request builds a few entities: looked up once)."""
    return frozenset(f.name for f in fields(cls))


def _session_ended(conn: Connection) -> bool:
    return conn.session_deadline is not None and time.monotonic() >= conn.session_deadline


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler


class KafkaBroker:
    """Dispatches frames to ``apis`` (``lowtide.kafka.listener.Dispatcher``). Thread-safe."""

    def __init__(self, *, services: KafkaServices, apis: list[Api]) -> None:
        self.services = services
        self.apis = {a.key: a for a in apis}
        if API_VERSIONS_KEY not in self.apis:
            self.apis[API_VERSIONS_KEY] = Api(API_VERSIONS_KEY, "ApiVersions", 0, 4, self._api_versions)

    def __call__(self, conn: Connection, head: RequestHead, payload: bytes) -> bytes | None:
        return run_blocking(self.steps(conn, head, payload))

    def steps(self, conn: Connection, head: RequestHead, payload: bytes) -> Steps[bytes | None]:
        """One request as steps (rpc/steps.py): a handler that is a generator (Produce) yields
        its waits; any other handler runs in the first step."""
        api = self.apis.get(head.api_key)
        name = api.name if api else f"api-{head.api_key}"
        if api is None or not api.min_version <= head.api_version <= api.max_version:
            REQUESTS.labels(name, "UNSUPPORTED_VERSION").inc()
            return self._unsupported(head)
        request = read_request(payload, head)
        call = Call(conn=conn, head=head, client_id=request.client_id, services=self.services)
        started = time.perf_counter()
        try:
            if head.api_key not in _BEFORE_AUTH:
                if conn.protocol == "SSL" and self.services.certificates is not None and (
                        conn.peer_certificate is not None or self.services.auth_required) and (
                        not conn.authenticated or _session_ended(conn)):
                    self.services.certificates.login(conn)  # the client certificate is the identity
                if self.services.auth_required and not conn.authenticated:
                    raise SaslAuthenticationFailed(f"{name} before SASL authentication")
                if _session_ended(conn):
                    # KIP-368: past its session a connection may only re-authenticate; Kafka closes it.
                    raise SaslAuthenticationFailed(f"{name} after the SASL session of {conn.principal} ended")
            body = api.handler(call, request.body)
            if isinstance(body, GeneratorType):
                body = yield from body
            outcome = "ok"
        except LowtideError as err:
            outcome = err.name
            log.info("kafka %s v%d from %s answered %s: %s", name, head.api_version, conn.peer, err.name, err.message)
            body = error_response(head.api_key, head.api_version, err.code)
            if isinstance(err, SaslAuthenticationFailed):
                # Kafka closes a connection that skips authentication (after answering SASL errors).
                conn.close()
                raise FrameError(f"{conn.peer}: {err.message}") from err
        except FrameError:
            raise
        except Exception as exc:
            log.exception("kafka %s v%d failed", name, head.api_version)
            outcome = "UNKNOWN_SERVER_ERROR"
            body = error_response(head.api_key, head.api_version, -1)
            if body is None:
                raise FrameError(f"{name}: {exc}") from exc
        finally:
            _latency(name).observe(time.perf_counter() - started)
        _requests(name, outcome).inc()
        return None if body is None else encode_response(head, body)

    def _unsupported(self, head: RequestHead) -> bytes:
        if head.api_key == API_VERSIONS_KEY:
            # KIP-511: a newer client's ApiVersions is answered in v0 with our ranges, so it can
            # pick a version both sides know and ask again.
            body = self._versions_body(response_type(API_VERSIONS_KEY, 0), UNSUPPORTED_VERSION)
            return encode_response(RequestHead(API_VERSIONS_KEY, 0, head.correlation_id), body)
        body = error_response(head.api_key, head.api_version, UNSUPPORTED_VERSION)
        if body is None:
            raise FrameError(f"api {head.api_key} v{head.api_version} is not a Kafka request this broker knows")
        return encode_response(head, body)

    def _versions_body(self, entity: type, code: int) -> Any:
        module = sys.modules[entity.__module__]
        keys = tuple(module.ApiVersion(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
                     for a in sorted(self.apis.values(), key=lambda a: a.key))
        values = {"error_code": error_code(code), "api_keys": keys}
        names = {f.name for f in fields(entity)}
        if "finalized_features" in names and code == 0:
            # v3+: the one feature a client acts on here. The Java producer (4.x) speaks
            # transactions version 2 when the finalized transaction.version is 2 and the epoch
            # is >= 0 (it only takes a newer epoch than the one it saw).
            level = self.services.transaction_version
            values["supported_features"] = (module.SupportedFeatureKey(
                name=TRANSACTION_VERSION_FEATURE, min_version=0, max_version=MAX_TRANSACTION_VERSION),)
            values["finalized_features_epoch"] = FINALIZED_FEATURES_EPOCH
            values["finalized_features"] = (module.FinalizedFeatureKey(
                name=TRANSACTION_VERSION_FEATURE, max_version_level=level, min_version_level=level),)
        if "throttle_time" in names:
            import datetime

            values["throttle_time"] = datetime.timedelta(0)
        return entity(**values)

    def _api_versions(self, call: Call, body: Any) -> Any:
        return self._versions_body(call.response, 0)
