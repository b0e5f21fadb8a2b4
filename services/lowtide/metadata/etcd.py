"""A small, typed client for etcd's v3 gRPC API: the only module that talks to etcd.

Why our own thin client: the maintained Python etcd clients either pin protobuf versions older
than the project's or speak the HTTP gateway; lowtide already generates gRPC stubs, so it
generates them from the part of etcd's API it uses (protos/etcd/etcd_rpc.proto) and wraps them
here. Consensus is etcd's (Raft); this module only issues requests.

What it offers (all keys are ``str``, values ``bytes``):

* reads: ``get``, ``get_prefix`` (linearizable: etcd answers from the leader's committed state);
* writes: ``put``, ``delete``, ``delete_prefix`` and ``txn`` (compare-and-set on a key's
  ``mod_revision``/``version``/``value``, then puts and deletes, applied atomically; ``txn_op``
  nests transactions, each deciding alone, for many compare-and-sets in one write); a write returns
  only once etcd committed it (a Raft majority), with the store revision it produced;
* leases: ``grant_lease``, ``keep_alive`` (one refresh), ``revoke_lease``; keys put with a lease
  vanish when it expires (how broker liveness and the controller lease work);
* ``watch_prefix``: a thread following every change under a prefix from a revision on, that
  reconnects from the last revision it delivered; ``on_reset`` is called when history was compacted
  past it (the caller reloads);
* ``status``: one member's version, leader and revision.

Endpoints: several members may be named (``etcd://h1:p1,h2:p2,h3:p3``). A call that fails with
UNAVAILABLE or DEADLINE_EXCEEDED (a member down, stopped, or without a leader) moves to the next
member and retries within the call's deadline; the failure that outlives the deadline is raised as
``MetadataStoreUnavailable`` (Kafka's REQUEST_TIMED_OUT, retriable).

Thread-safety: an ``EtcdClient`` may be shared by threads (gRPC channels are thread-safe; the
current-member index is a plain int whose races only pick a different member).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc

from lowtide.errors import MetadataStoreUnavailable
from lowtide.tls.config import ClientTls, default_client_tls
from lowtide_pb import etcd_rpc_pb2 as pb
from lowtide_pb import etcd_rpc_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

URL_SCHEME = "etcd://"
# etcd over (mutual) TLS: the process's own certificate (lowtide.tls.config.default_client_tls)
TLS_URL_SCHEME = "etcds://"
DEFAULT_TIMEOUT_S = 5.0
_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN)


def parse_endpoints(url: str) -> list[str]:
    """``etcd://h1:p1,h2:p2`` (or ``etcds://...``, or a bare ``h1:p1,h2:p2``) -> ``["h1:p1", "h2:p2"]``."""
    rest = url
    for scheme in (URL_SCHEME, TLS_URL_SCHEME):
        if url.startswith(scheme):
            rest = url[len(scheme):]
    rest = rest.split("/", 1)[0]
    endpoints = [e.strip() for e in rest.split(",") if e.strip()]
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {url!r} (expected etcd://host:port[,host:port...])")
    return endpoints


def prefix_end(prefix: str) -> bytes:
    """The exclusive end of the key range holding every key that starts with ``prefix``."""
    raw = bytearray(prefix.encode())
    for i in range(len(raw) - 1, -1, -1):
        if raw[i] < 0xFF:
            raw[i] += 1
            return bytes(raw[:i + 1])
    return b"\0"


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it: ``mod_revision`` is the store revision of its last change."""

    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    version: int
    lease: int

    @classmethod
    def of(cls, kv: pb.KeyValue) -> KeyValue:
        return cls(key=kv.key.decode(), value=kv.value, mod_revision=kv.mod_revision,
                   create_revision=kv.create_revision, version=kv.version, lease=kv.lease)


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix: ``deleted`` for a delete (or a lease's expiry)."""

    key: str
    value: bytes
    revision: int
    deleted: bool
    lease: int = 0


@dataclass(frozen=True)
class Status:
    version: str
    leader: int
    member: int
    revision: int


# -- transaction parts: comparisons and operations (opaque to callers) ---------------------------
def if_mod_revision(key: str, revision: int) -> pb.Compare:
    """True when ``key`` was last changed at ``revision`` (0: the key does not exist)."""
    return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.MOD, key=key.encode(), mod_revision=revision)


def if_missing(key: str) -> pb.Compare:
    return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.VERSION, key=key.encode(), version=0)


def if_value(key: str, value: bytes) -> pb.Compare:
    return pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.VALUE, key=key.encode(), value=value)


def if_prefix_unchanged_since(prefix: str, revision: int) -> pb.Compare:
    """True when no key under ``prefix`` changed after ``revision`` (deletions are not seen)."""
    return pb.Compare(result=pb.Compare.LESS, target=pb.Compare.MOD, key=prefix.encode(),
                      range_end=prefix_end(prefix), mod_revision=revision + 1)


def put_op(key: str, value: bytes, *, lease: int = 0) -> pb.RequestOp:
    return pb.RequestOp(request_put=pb.PutRequest(key=key.encode(), value=value, lease=lease))


def delete_op(key: str, *, prefix: bool = False) -> pb.RequestOp:
    return pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(
        key=key.encode(), range_end=prefix_end(key) if prefix else b""))


def get_op(key: str, *, prefix: bool = False) -> pb.RequestOp:
    return pb.RequestOp(request_range=pb.RangeRequest(key=key.encode(), range_end=prefix_end(key) if prefix else b""))


def txn_op(compare: Sequence[pb.Compare], success: Sequence[pb.RequestOp],
           failure: Sequence[pb.RequestOp] = ()) -> pb.RequestOp:
    """A transaction nested in another (etcd 3.3+): its compare decides between its own success
    and failure ops, independently of its siblings, and all of them apply in the outer one's single
    revision. This is how many partitions change in one write, each under its own
    compare-and-set, and each learns whether it won (Kafka's AlterPartition answers per partition)."""
    return pb.RequestOp(request_txn=pb.TxnRequest(compare=list(compare), success=list(success),
                                                  failure=list(failure)))


# etcd refuses a transaction with more ops than its --max-txn-ops on either branch (nested
# transactions count on each level separately). 128 is etcd's default, which an external etcd may
# keep; lowtide's own members allow 100,000 (lowtide.common.procs: a topic's partitions are
# created in one transaction).
MAX_TXN_OPS = 128


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    # The key-values read by get_op parts, in order (one list per get_op).
    reads: list[list[KeyValue]]
    deleted: list[int]
    # One result per txn_op part, in order (its revision is the outer one's).
    nested: tuple[TxnResult, ...] = ()

    @classmethod
    def of(cls, resp: pb.TxnResponse, revision: int) -> TxnResult:
        reads: list[list[KeyValue]] = []
        deleted: list[int] = []
        nested: list[TxnResult] = []
        for r in resp.responses:
            kind = r.WhichOneof("response")
            if kind == "response_range":
                reads.append([KeyValue.of(kv) for kv in r.response_range.kvs])
            elif kind == "response_delete_range":
                deleted.append(r.response_delete_range.deleted)
            elif kind == "response_txn":
                nested.append(cls.of(r.response_txn, revision))
        return cls(succeeded=resp.succeeded, revision=revision, reads=reads, deleted=deleted, nested=tuple(nested))


class EtcdClient:
    """Calls etcd members (module doc: failover, errors). ``close()`` once at the end."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._credentials = credentials
        self._channels = [self._open(e) for e in self.endpoints]
        # Every stub made now: grpc crashes the process when a stub is made on a closed channel,
        # which a thread racing close() would otherwise do.
        self._stubs: dict[tuple[int, str], object] = {
            (i, service): _stub(ch, service) for i, ch in enumerate(self._channels)
            for service in ("KV", "Watch", "Lease", "Maintenance")}
        self._current = 0
        self._closed = False

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, tls: ClientTls | None = None) -> EtcdClient:
        """``etcd://`` plaintext; ``etcds://`` TLS with ``tls``, by default the process's own
        certificate as the client certificate and its CA (``default_client_tls``: a server's
        ``--tls-*``, else ``LOWTIDE_TLS_*``). ``tls`` is for a process that dials as someone else
        than its default (the local-cluster supervisor: the cluster's admin certificate)."""
        credentials = None
        if url.startswith(TLS_URL_SCHEME):
            tls = tls or default_client_tls()
            if tls is None:
                raise ValueError(f"{url!r}: etcds:// needs TLS settings (--tls-* or LOWTIDE_TLS_*)")
            credentials = tls.channel_credentials()
        return cls(parse_endpoints(url), timeout_s=timeout_s, credentials=credentials)

    @property
    def url(self) -> str:
        return (TLS_URL_SCHEME if self._credentials is not None else URL_SCHEME) + ",".join(self.endpoints)

    def _open(self, endpoint: str) -> grpc.Channel:
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.enable_retries", 0),
                   # reconnect quickly after a member restarts (the default backoff grows to 120 s)
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000),
                   # notice a member that stopped answering (SIGSTOP, a dead host) under a quiet
                   # watch; etcd refuses pings more often than every 5 s
                   ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.max_pings_without_data", 0)]
        if self._credentials is not None:
            return grpc.secure_channel(endpoint, self._credentials, options=options)
        return grpc.insecure_channel(endpoint, options=options)

    def close(self) -> None:
        self._closed = True
        for ch in self._channels:
            ch.close()

    # -- calling with failover --------------------------------------------------------------------
    def _call(self, service: str, method: str, request, *, timeout_s: float | None = None,
              consume: Callable | None = None):
        """One call with failover (module doc). ``consume(response)`` reads a streaming answer inside
        the retry, so a stream's error is retried and typed like a unary call's."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        last: grpc.RpcError | None = None
        attempts = 0
        while True:
            index = self._current % len(self._channels)
            stub = self._stub(index, service)
            remaining = deadline - time.monotonic()
            # With several members, give one at most half the time left, so a stopped member
            # (SIGSTOP: connected, never answering) leaves time to ask another.
            per_try = remaining if len(self._channels) == 1 else max(0.2, min(remaining, remaining / 2, 2.0))
            try:
                if callable(request):  # a request iterator must be fresh on every attempt
                    response = getattr(stub, method)(request(), timeout=max(0.05, per_try))
                else:
                    response = getattr(stub, method)(request, timeout=max(0.05, per_try))
                return consume(response) if consume is not None else response
            except grpc.RpcError as exc:
                if exc.code() not in _RETRY_CODES:
                    raise MetadataStoreUnavailable(f"etcd {method}: {exc.code().name}: {exc.details()}") from None
                last = exc
            attempts += 1
            if self._current % len(self._channels) == index:
                self._current = index + 1
            if time.monotonic() >= deadline:
                break
            if attempts % len(self._channels) == 0:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        detail = f"{last.code().name}: {last.details()}" if last is not None else "no answer"
        raise MetadataStoreUnavailable(f"metadata store (etcd at {','.join(self.endpoints)}) unreachable: "
                                       f"{method}: {detail}")

    def _stub(self, index: int, service: str):
        return self._stubs[(index, service)]

    # -- reads ------------------------------------------------------------------------------------
    def get(self, key: str, *, timeout_s: float | None = None) -> KeyValue | None:
        resp = self._call("KV", "Range", pb.RangeRequest(key=key.encode()), timeout_s=timeout_s)
        return KeyValue.of(resp.kvs[0]) if resp.kvs else None

    def get_prefix(self, prefix: str, *, timeout_s: float | None = None) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (sorted by key) and the store revision they were read at."""
        resp = self._call("KV", "Range", pb.RangeRequest(key=prefix.encode(), range_end=prefix_end(prefix)),
                          timeout_s=timeout_s)
        return [KeyValue.of(kv) for kv in resp.kvs], resp.header.revision

    def revision(self, *, timeout_s: float | None = None) -> int:
        """The store's current revision (a linearizable read of nothing)."""
        resp = self._call("KV", "Range", pb.RangeRequest(key=b"\0", count_only=True), timeout_s=timeout_s)
        return resp.header.revision

    def prefix_state(self, prefix: str, *, changed_after: int,
                     timeout_s: float | None = None) -> tuple[int, int, bool]:
        """``(revision, keys, changed)`` under ``prefix`` at one store revision (a linearizable
        read): how many keys it holds, and whether any was written after revision
        ``changed_after``. A copy of the prefix as of ``changed_after`` holding as many keys equals
        the store's at ``revision`` when none was (MetadataImage.sync: why not progress notices).

        Count-only ranges ignore the revision filters (etcd prunes the keys, not the count), so the
        second range asks for at most one key instead."""
        end = prefix_end(prefix)
        count = pb.RequestOp(request_range=pb.RangeRequest(key=prefix.encode(), range_end=end, count_only=True))
        newer = pb.RequestOp(request_range=pb.RangeRequest(key=prefix.encode(), range_end=end, keys_only=True,
                                                           limit=1, min_mod_revision=changed_after + 1))
        resp = self._call("KV", "Txn", pb.TxnRequest(success=[count, newer]), timeout_s=timeout_s)
        counted, changed = resp.responses[0].response_range, resp.responses[1].response_range
        return resp.header.revision, counted.count, bool(changed.kvs)

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: str, value: bytes, *, lease: int = 0, timeout_s: float | None = None) -> int:
        resp = self._call("KV", "Put", pb.PutRequest(key=key.encode(), value=value, lease=lease), timeout_s=timeout_s)
        return resp.header.revision

    def delete(self, key: str, *, timeout_s: float | None = None) -> int:
        """Delete one key; returns how many were deleted (0 or 1)."""
        return self._call("KV", "DeleteRange", pb.DeleteRangeRequest(key=key.encode()), timeout_s=timeout_s).deleted

    def delete_prefix(self, prefix: str, *, timeout_s: float | None = None) -> int:
        return self._call("KV", "DeleteRange", pb.DeleteRangeRequest(key=prefix.encode(), range_end=prefix_end(prefix)),
                          timeout_s=timeout_s).deleted

    def txn(self, compare: Sequence[pb.Compare], success: Sequence[pb.RequestOp],
            failure: Sequence[pb.RequestOp] = (), *, timeout_s: float | None = None) -> TxnResult:
        resp = self._call("KV", "Txn", pb.TxnRequest(compare=list(compare), success=list(success),
                                                     failure=list(failure)), timeout_s=timeout_s)
        return TxnResult.of(resp, resp.header.revision)

    # -- leases -----------------------------------------------------------------------------------
    def grant_lease(self, ttl_s: int, *, timeout_s: float | None = None) -> int:
        resp = self._call("Lease", "LeaseGrant", pb.LeaseGrantRequest(TTL=max(1, int(ttl_s))), timeout_s=timeout_s)
        if resp.error:
            raise MetadataStoreUnavailable(f"etcd LeaseGrant: {resp.error}")
        return resp.ID

    def keep_alive(self, lease: int, *, timeout_s: float | None = None) -> int:
        """Refresh ``lease`` once; returns its new TTL in seconds, 0 when it has expired."""
        def first_ttl(stream) -> int:
            for answer in stream:  # a stream: the first answer is ours
                return answer.TTL
            return 0

        return self._call("Lease", "LeaseKeepAlive", lambda: iter([pb.LeaseKeepAliveRequest(ID=lease)]),
                          timeout_s=timeout_s, consume=first_ttl)

    def revoke_lease(self, lease: int, *, timeout_s: float | None = None) -> None:
        try:
            self._call("Lease", "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease), timeout_s=timeout_s)
        except MetadataStoreUnavailable as exc:
            if "not found" not in str(exc):
                raise

    # -- member status ----------------------------------------------------------------------------
    def status(self, endpoint: str | None = None, *, timeout_s: float = 2.0) -> Status:
        """One member's status (``endpoint``, default: whichever member answers)."""
        if endpoint is not None:
            channel = self._channels[self.endpoints.index(endpoint)] if endpoint in self.endpoints \
                else self._open(endpoint)
            try:
                resp = _stub(channel, "Maintenance").Status(pb.StatusRequest(), timeout=timeout_s)
            except grpc.RpcError as exc:
                raise MetadataStoreUnavailable(f"etcd {endpoint}: {exc.code().name}: {exc.details()}") from None
            finally:
                if endpoint not in self.endpoints:
                    channel.close()
        else:
            resp = self._call("Maintenance", "Status", pb.StatusRequest(), timeout_s=timeout_s)
        return Status(version=resp.version, leader=resp.leader, member=resp.header.member_id,
                      revision=resp.header.revision)

    # -- watching ---------------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, *, start_revision: int,
                     on_events: Callable[[list[WatchEvent], int], None],
                     on_reset: Callable[[], int], name: str = "etcd-watch",
                     on_progress: Callable[[int], None] | None = None) -> Watch:
        """Follow every change under ``prefix`` from ``start_revision`` (inclusive) on, in a thread.

        ``on_events(events, revision)`` gets each batch of changes in revision order (one etcd
        revision's changes are never split across calls). When the history from the next revision
        was compacted away, ``on_reset()`` must reload and return the revision it read at; the
        watch resumes after it. Errors reconnect (to the next member) and resume where delivery
        stopped, so no change is missed or repeated. ``on_progress(revision)``: every change up to
        ``revision`` has been delivered (etcd's timed progress notices, which it sends only to a
        watch that has been sent everything; lowtide never requests one: etcd before 3.4.24 and
        3.5.8 may answer a request ahead of changes still queued for the watch, etcd-io/etcd#15220)."""
        watch = Watch(self, prefix=prefix, start_revision=start_revision, on_events=on_events,
                      on_reset=on_reset, name=name, on_progress=on_progress)
        watch.start()
        return watch


class Watch:
    """The thread behind ``EtcdClient.watch_prefix``; ``stop()`` ends it."""

    def __init__(self, client: EtcdClient, *, prefix: str, start_revision: int,
                 on_events: Callable[[list[WatchEvent], int], None], on_reset: Callable[[], int], name: str,
                 on_progress: Callable[[int], None] | None = None) -> None:
        self._client = client
        self._on_progress = on_progress
        self._prefix = prefix
        self.next_revision = start_revision
        self._on_events = on_events
        self._on_reset = on_reset
        self._stop = threading.Event()
        self._reload_requested = threading.Event()
        self._call: grpc.Future | None = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # Up to 10 s (it takes a moment, longer on a loaded machine): a watch thread still inside a
        # gRPC call when the client's channels are closed and the interpreter exits can hold gRPC's
        # shutdown forever (a `lowtide metadata migrate` printed its answer and then hung, once, in
        # a loaded test run, after a 2 s wait here had run out).
        deadline = time.monotonic() + 10.0
        # The stream may be made just after a look finds none: cancel until the thread has ended.
        while self._thread.is_alive() and time.monotonic() < deadline:
            call = self._call
            if call is not None:
                call.cancel()
            self._thread.join(timeout=0.02)

    def reload(self) -> None:
        """Reload (``on_reset``) and follow from there instead of resuming: for a caller that knows
        the members' history changed (a member restored from a backup, maybe already written past
        the revision delivered so far)."""
        self._reload_requested.set()
        call = self._call
        if call is not None:
            call.cancel()

    def reconnect(self) -> None:
        """Drop the stream and follow from the next member (one that stopped answering)."""
        client = self._client
        client._current += 1
        call = self._call
        if call is not None:
            call.cancel()

    def _requests(self, done: threading.Event) -> Iterator[pb.WatchRequest]:
        yield pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=self._prefix.encode(), range_end=prefix_end(self._prefix), start_revision=self.next_revision,
            progress_notify=True))
        # Keep the request side open until this connection ends (or the watch stops).
        while not done.is_set() and not self._stop.is_set():
            done.wait(0.5)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set() and not self._client._closed:
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                try:
                    self.next_revision = self._on_reset() + 1
                except Exception:  # etcd not answering yet: try again shortly
                    self._reload_requested.set()
                    self._stop.wait(0.5)
                    continue
            client = self._client
            index = client._current % len(client._channels)
            done = threading.Event()
            try:
                self._call = client._stub(index, "Watch").Watch(self._requests(done))
                for resp in self._call:
                    if resp.compact_revision and resp.canceled:
                        log.warning("etcd watch of %s: history compacted past revision %d; reloading",
                                    self._prefix, self.next_revision)
                        self.next_revision = self._on_reset() + 1
                        break
                    if resp.canceled:
                        raise RuntimeError(f"etcd watch canceled: {resp.cancel_reason}")
                    if resp.created and resp.header.revision < self.next_revision - 1:
                        # The store is behind what was delivered: another history (a member
                        # restored from a backup). A watch from the future would wait silently,
                        # so reload what the store holds now (identity.py decides whether a
                        # service may go on with it).
                        log.warning("etcd watch of %s: the store's revision %d is below %d already seen "
                                    "(restored from a backup?); reloading", self._prefix,
                                    resp.header.revision, self.next_revision - 1)
                        self.next_revision = self._on_reset() + 1
                        break
                    self.connected.set()
                    failures = 0
                    if resp.events:
                        events = [WatchEvent(key=e.kv.key.decode(), value=e.kv.value, revision=e.kv.mod_revision,
                                             deleted=e.type == pb.Event.DELETE, lease=e.kv.lease)
                                  for e in resp.events]
                        revision = events[-1].revision
                        self._on_events(events, revision)
                        self.next_revision = revision + 1
                    elif not resp.created and resp.header.revision >= self.next_revision:
                        # A progress notice: every change up to this revision has been sent.
                        self.next_revision = resp.header.revision + 1
                        if self._on_progress is not None:
                            self._on_progress(resp.header.revision)
            except grpc.RpcError as exc:
                if self._stop.is_set() or exc.code() == grpc.StatusCode.CANCELLED:
                    continue
                self.connected.clear()
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("etcd watch of %s at %s: %s %s; reconnecting", self._prefix,
                                client.endpoints[index], exc.code().name, exc.details())
                # The failed call is the exception, and its traceback's frames hold the call: drop
                # the traceback so a watch retrying a dead member leaves no cyclic garbage.
                exc.__traceback__ = None
                client._current = index + 1
                self._stop.wait(min(1.0, 0.05 * failures))
            except Exception:  # a callback failed: log, back off, resume from the same revision
                self.connected.clear()
                if self._stop.is_set() or client._closed:
                    return
                log.exception("etcd watch of %s: handling a change failed; retrying", self._prefix)
                self._stop.wait(0.5)
            finally:
                done.set()
                self._call = None


def _stub(channel: grpc.Channel, service: str):
    return {"KV": pb_grpc.KVStub, "Watch": pb_grpc.WatchStub, "Lease": pb_grpc.LeaseStub,
            "Maintenance": pb_grpc.MaintenanceStub}[service](channel)


__all__ = ["EtcdClient", "KeyValue", "Status", "TxnResult", "Watch", "WatchEvent", "delete_op", "get_op",
           "if_missing", "if_mod_revision", "if_prefix_unchanged_since", "if_value", "parse_endpoints",
           "prefix_end", "put_op"]
