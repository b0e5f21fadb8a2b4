"""The Replica service on a gRPC server, with a Produce deserializer that copies the record
batches once.

``ProduceRequest.FromString`` then ``partition.records`` copies a 1 MiB request's batches twice
after gRPC hands the message over, and the leader then copied them a third time to assign
offsets. ``parse_produce_request`` lifts each partition's batches out of the wire bytes
(``lowtide.rpc.wire``) into one ``OwnedBatches`` per partition, which the log rewrites in place:
one copy instead of three. Everything else in the request is parsed by upb as before, and the
servicer sees the same attributes (``acks``, ``partitions[i].topic`` / ``.records`` /
``.HasField(...)``), so the in-process Kafka listener can keep passing it real messages.

Thread-safety: pure functions; the views are made per request.
"""

from __future__ import annotations

from typing import Any

import grpc

from lowtide.record import OwnedBatches
from lowtide.rpc.wire import split_bytes_field
from lowtide_pb import replica_pb2, replica_pb2_grpc

_PARTITIONS = replica_pb2.ProduceRequest.DESCRIPTOR.fields_by_name["partitions"].number
_RECORDS = replica_pb2.ProducePartition.DESCRIPTOR.fields_by_name["records"].number


class ProducePartitionView:
    """A ``ProducePartition`` whose ``records`` is the partition's ``OwnedBatches``."""

    __slots__ = ("_message", "records")

    def __init__(self, message: replica_pb2.ProducePartition, records: OwnedBatches) -> None:
        self._message = message
        self.records = records

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


class ProduceRequestView:
    """A ``ProduceRequest`` whose partitions are ``ProducePartitionView``s."""

    __slots__ = ("_message", "partitions")

    def __init__(self, message: replica_pb2.ProduceRequest, partitions: list[ProducePartitionView]) -> None:
        self._message = message
        self.partitions = partitions

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


def parse_produce_request(raw: bytes) -> ProduceRequestView:
    """A ProduceRequest off the wire (malformed: ``WireFormatError``, or upb's ``DecodeError``)."""
    stripped, records = split_bytes_field(raw, repeated_field=_PARTITIONS, bytes_field=_RECORDS)
    message = replica_pb2.ProduceRequest.FromString(stripped)
    return ProduceRequestView(message, [ProducePartitionView(p, OwnedBatches(r))
                                        for p, r in zip(message.partitions, records, strict=True)])


class _Captured:
    """Stands in for a server while the generated ``add_ReplicaServicer_to_server`` hands it its
    method handlers, so they can be registered with Produce's deserializer replaced."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, dict(handlers)


def add_replica_service(servicer: replica_pb2_grpc.ReplicaServicer, server: grpc.Server) -> None:
    """Register ``servicer`` on ``server`` as the generated code would, Produce excepted."""
    captured = _Captured()
    replica_pb2_grpc.add_ReplicaServicer_to_server(servicer, captured)
    if not captured.service or "Produce" not in captured.handlers:
        raise RuntimeError("the generated Replica registration changed shape; see lowtide/replica/registration.py")
    captured.handlers["Produce"] = grpc.unary_unary_rpc_method_handler(
        servicer.Produce, request_deserializer=parse_produce_request,
        response_serializer=replica_pb2.ProduceResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(captured.service, captured.handlers),))
    server.add_registered_method_handlers(captured.service, captured.handlers)
