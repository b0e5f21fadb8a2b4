"""Test harness of the front door: a real in-process Admin gRPC server on a real Redis, and a small
in-test Replica servicer on a real gRPC port.

Why an in-test Replica: the replica server is being written in parallel, and these unit tests
exercise the front door's and the client's own logic (fan-out, grouping, retries, partitioning,
offset skipping) against answers they choose. The full path over real replica processes is covered
by the integration tests. Everything else here is real: gRPC on loopback ports, redis-server.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from lowtide.frontdoor.server import FrontDoorConfig, FrontDoorParts, build_front_door
from lowtide.metadata.model import BrokerInfo
from lowtide.metadata.store import MetadataStore
from lowtide.record import assign_offsets, iter_batches, validate_batches
from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide_pb import common_pb2, replica_pb2, replica_pb2_grpc

SESSION_MS = 60_000


def start_grpc_server(register: Callable[[grpc.Server], None]) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), interceptors=[ErrorInterceptor()])
    register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def register_broker(store: MetadataStore, broker_id: int, address: str = "127.0.0.1:1") -> None:
    host, _, port = address.rpartition(":")
    store.register_broker(BrokerInfo(id=broker_id, host=host, port=int(port)), incarnation=uuid.uuid4().hex,
                          session_timeout_ms=SESSION_MS)


def kill_broker(store: MetadataStore, broker_id: int) -> None:
    """Make a broker not live, as an expired session would."""
    store.redis.delete(f"lowtide:broker:{broker_id}:alive")


@dataclass
class PartitionLog:
    lso: int = 0
    next_offset: int = 0
    batches: list[bytes] = field(default_factory=list)


class StubReplica(replica_pb2_grpc.ReplicaServicer):
    """In-test Replica (see module doc). Answers chosen by the test:

    * DeleteRecords: ``delete_errors[(t, p)]`` is a list of error codes used one per call (then
      NONE); on NONE the low watermark is the requested offset (``low_watermarks`` overrides);
      ``on_delete_records(request)`` runs first (e.g. to move leadership mid-call).
    * ListOffsets: ``offsets[(t, p)]``.
    * Produce/Fetch: an in-memory log per partition with real offset assignment; Fetch returns whole
      batches from the one containing ``fetch_offset`` and OFFSET_OUT_OF_RANGE below ``lso``.
    Every request is recorded in ``calls``. Thread-safe (one lock).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, object]] = []
        self.delete_errors: dict[tuple[str, int], list[int]] = {}
        self.low_watermarks: dict[tuple[str, int], int] = {}
        self.offsets: dict[tuple[str, int], int] = {}
        self.produce_errors: dict[tuple[str, int], list[int]] = {}
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self.on_delete_records: Callable[[object], None] | None = None  # runs before answering

    def DeleteRecords(self, request, context):  # noqa: N802
        if self.on_delete_records is not None:
            self.on_delete_records(request)
        with self.lock:
            self.calls.append(("DeleteRecords", request))
            out = []
            for p in request.partitions:
                key = (p.topic, p.partition)
                errors = self.delete_errors.get(key) or []
                code = errors.pop(0) if errors else 0
                lw = -1 if code else self.low_watermarks.get(key, p.offset)
                out.append(common_pb2.DeleteRecordsResult(topic=p.topic, partition=p.partition, low_watermark=lw,
                                                          error_code=code))
        return common_pb2.DeleteRecordsResponse(partitions=out)

    def ListOffsets(self, request, context):  # noqa: N802
        with self.lock:
            self.calls.append(("ListOffsets", request))
            out = []
            for p in request.partitions:
                key = (p.topic, p.partition)
                log = self.logs.get(key)
                if key in self.offsets:
                    offset = self.offsets[key]
                elif log is not None:
                    offset = log.lso if p.timestamp == -2 else log.next_offset
                else:
                    offset = 0
                out.append(common_pb2.ListOffsetsResult(topic=p.topic, partition=p.partition, offset=offset))
        return common_pb2.ListOffsetsResponse(partitions=out)

    def Produce(self, request, context):  # noqa: N802
        with self.lock:
            self.calls.append(("Produce", request))
            out = []
            for p in request.partitions:
                key = (p.topic, p.partition)
                errors = self.produce_errors.get(key) or []
                code = errors.pop(0) if errors else 0
                if code:
                    out.append(replica_pb2.ProduceResult(topic=p.topic, partition=p.partition, error_code=code))
                    continue
                log = self.logs.setdefault(key, PartitionLog())
                buf = bytearray(p.records)
                headers = validate_batches(buf)
                base = log.next_offset
                log.next_offset = assign_offsets(buf, headers, base_offset=base, leader_epoch=0)
                log.batches.extend(bytes(buf[pos:pos + h.size_in_bytes]) for h, pos in iter_batches(buf))
                out.append(replica_pb2.ProduceResult(topic=p.topic, partition=p.partition, base_offset=base))
        return replica_pb2.ProduceResponse(partitions=out)

    def Fetch(self, request, context):  # noqa: N802
        with self.lock:
            self.calls.append(("Fetch", request))
            out = []
            for p in request.partitions:
                log = self.logs.get((p.topic, p.partition), PartitionLog())
                if p.fetch_offset < log.lso or p.fetch_offset > log.next_offset:
                    out.append(replica_pb2.FetchResult(topic=p.topic, partition=p.partition, error_code=1,
                                                       log_start_offset=log.lso, high_watermark=log.next_offset))
                    continue
                chosen = []
                for batch in log.batches:
                    header = next(iter_batches(batch))[0]
                    if header.next_offset > p.fetch_offset:
                        chosen.append(batch)
                out.append(replica_pb2.FetchResult(topic=p.topic, partition=p.partition, records=b"".join(chosen),
                                                   high_watermark=log.next_offset, log_start_offset=log.lso))
        return replica_pb2.FetchResponse(partitions=out)

    def called(self, method: str) -> list:
        with self.lock:
            return [r for m, r in self.calls if m == method]


@dataclass
class RunningFrontDoor:
    address: str
    parts: FrontDoorParts
    server: grpc.Server

    @property
    def store(self) -> MetadataStore:
        return self.parts.store

    def stop(self) -> None:
        self.server.stop(0)
        self.parts.close()


def start_front_door(redis_url: str, **config) -> RunningFrontDoor:
    parts = build_front_door(FrontDoorConfig(redis_url=redis_url, **config))
    server, address = start_grpc_server(parts.register)
    return RunningFrontDoor(address=address, parts=parts, server=server)


def start_stub_replica() -> tuple[StubReplica, grpc.Server, str]:
    stub = StubReplica()
    server, address = start_grpc_server(lambda s: replica_pb2_grpc.add_ReplicaServicer_to_server(stub, s))
    return stub, server, address
