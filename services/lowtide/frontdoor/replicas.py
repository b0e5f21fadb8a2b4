"""The front door's gRPC client of the replica servers (the leaders it fans out to).

The adapter between domain code and the generated ``lowtide.v1.Replica`` stubs: domain modules
(``admin``, ``delete_records``) hand it plain tuples and get ``results`` dataclasses back, so they
never import protobuf code.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import grpc

from lowtide.frontdoor.results import DeleteAnswer, OffsetAnswer
from lowtide.rpc.channels import CHANNEL_OPTIONS as GRPC_OPTIONS
from lowtide.rpc.status import error_from_rpc
from lowtide_pb import common_pb2, replica_pb2_grpc

# Slack added to the gRPC deadline over the timeout the leader itself honours, so the leader's own
# REQUEST_TIMED_OUT answer (with per-partition detail) arrives before our deadline cuts it off.
DEADLINE_SLACK_S = 1.0


class ReplicaGateway:
    """Calls Replica RPCs on leaders by address, with one cached channel per address.

    Contract: a failed call raises the ``LowtideError`` it carried (``error_from_rpc``; an
    unreachable leader becomes NETWORK_EXCEPTION, a deadline REQUEST_TIMED_OUT). Thread-safe:
    channels are created under a lock and gRPC channels are safe to share.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, replica_pb2_grpc.ReplicaStub] = {}

    def _stub(self, address: str) -> replica_pb2_grpc.ReplicaStub:
        stub = self._stubs.get(address)
        if stub is None:
            with self._lock:
                stub = self._stubs.get(address)
                if stub is None:
                    channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
                    self._channels[address] = channel
                    stub = self._stubs[address] = replica_pb2_grpc.ReplicaStub(channel)
        return stub

    def delete_records(self, address: str, items: Sequence[tuple[str, int, int]], *,
                       timeout_ms: int) -> list[DeleteAnswer]:
        """Send one DeleteRecords for ``(topic, partition, offset)`` items to the leader at ``address``."""
        request = common_pb2.DeleteRecordsRequest(
            partitions=[common_pb2.DeleteRecordsPartition(topic=t, partition=p, offset=o) for t, p, o in items],
            timeout_ms=max(1, timeout_ms))
        try:
            response = self._stub(address).DeleteRecords(request, timeout=timeout_ms / 1000 + DEADLINE_SLACK_S)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return [DeleteAnswer(topic=r.topic, partition=r.partition, low_watermark=r.low_watermark,
                             error_code=int(r.error_code), error_message=r.error_message)
                for r in response.partitions]

    def list_offsets(self, address: str, items: Sequence[tuple[str, int, int]], *,
                     timeout_s: float) -> list[OffsetAnswer]:
        """Send one ListOffsets for ``(topic, partition, timestamp)`` items to the leader at ``address``."""
        request = common_pb2.ListOffsetsRequest(
            partitions=[common_pb2.ListOffsetsPartition(topic=t, partition=p, timestamp=ts) for t, p, ts in items])
        try:
            response = self._stub(address).ListOffsets(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return [OffsetAnswer(topic=r.topic, partition=r.partition, error_code=int(r.error_code),
                             error_message=r.error_message, offset=r.offset, timestamp=r.timestamp,
                             leader_epoch=r.leader_epoch)
                for r in response.partitions]

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()
