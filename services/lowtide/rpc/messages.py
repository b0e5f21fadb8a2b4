"""Protobuf conversions of the ``lowtide.messages`` types that several ends of the wire share.

``DeleteRecordsResult`` is one dataclass from the replica to every door (KIP-107): the replica's
``DeleteRecordsHandler`` answers with it, the replica servicer and the front door's servicer put it
on the wire with ``delete_results_to_proto``, and ``ReplicaClient`` (the front door's fan-out),
``Admin`` (the Python client and the CLI) and the Kafka listener read it back with
``delete_results_from_proto``. A failed partition always travels with low watermark -1.

A follower's fetch is one request and one answer on three transports: ``ReplicaClient.fetch``
(a unary Fetch), ``ReplicationStream`` (the gRPC ``Replicate`` stream) and the framed replication
listener's callers (lowtide.rpc.framed.callers); ``fetch_request`` and ``parse_fetch_response``
are the one wire format all three send and read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lowtide.errors import error_or_none
from lowtide.messages.replica import DeleteRecordsResult, FetchedPartition, FetchPosition, FetchSessionRound
from lowtide.rpc.wire import split_bytes_field
from lowtide_pb import common_pb2, replica_pb2


def delete_result_to_proto(result: DeleteRecordsResult) -> common_pb2.DeleteRecordsResult:
    """One partition's answer as common.proto's ``DeleteRecordsResult``."""
    if result.error is None:
        return common_pb2.DeleteRecordsResult(topic=result.topic, partition=result.partition,
                                              low_watermark=result.low_watermark)
    return common_pb2.DeleteRecordsResult(topic=result.topic, partition=result.partition, low_watermark=-1,
                                          error_code=result.error.code, error_message=result.error.message)


def delete_results_to_proto(results: Iterable[DeleteRecordsResult]) -> list[common_pb2.DeleteRecordsResult]:
    return [delete_result_to_proto(r) for r in results]


def delete_results_from_proto(response: common_pb2.DeleteRecordsResponse) -> list[DeleteRecordsResult]:
    """The answers of a ``DeleteRecordsResponse``, in its order."""
    return [DeleteRecordsResult(topic=r.topic, partition=r.partition, low_watermark=r.low_watermark,
                                error=error_or_none(r.error_code, r.error_message))
            for r in response.partitions]


def epoch_or_none(epoch: int) -> int | None:
    # proto3 ``optional``: None leaves the field unset, which the server reads as "unchecked".
    return epoch if epoch >= 0 else None


def fetch_request(positions: Iterable[FetchPosition], *, replica_id: int, max_wait_ms: int, min_bytes: int,
                  max_bytes: int, session: FetchSessionRound | None = None) -> replica_pb2.FetchRequest:
    """replica.proto's FetchRequest for these positions (a round of a fetch ``session``, KIP-227)."""
    request = replica_pb2.FetchRequest(
        replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
        partitions=[replica_pb2.FetchPartition(
            topic=p.topic, partition=p.partition, fetch_offset=p.fetch_offset,
            log_start_offset=p.log_start_offset, partition_max_bytes=p.max_bytes,
            current_leader_epoch=epoch_or_none(p.current_leader_epoch)) for p in positions])
    if session is not None:
        request.session_id, request.session_epoch = session.session_id, session.epoch
        request.forgotten.extend(common_pb2.TopicPartition(topic=t, partition=p) for t, p in session.forgotten)
    return request


def fetched_from_proto(response: replica_pb2.FetchResponse,
                       records: Sequence[bytes | memoryview] | None = None) -> list[FetchedPartition]:
    """``records``: each partition's batches when they were lifted out of the message
    (``parse_fetch_response``), else they are read from it."""
    return [FetchedPartition(topic=r.topic, partition=r.partition, error=error_or_none(r.error_code, r.error_message),
                             high_watermark=r.high_watermark, log_start_offset=r.log_start_offset,
                             log_end_offset=r.log_end_offset, leader_epoch=r.leader_epoch,
                             records=r.records if records is None else records[i],
                             last_stable_offset=r.last_stable_offset,
                             aborted_transactions=tuple((a.producer_id, a.first_offset)
                                                        for a in r.aborted_transactions))
            for i, r in enumerate(response.partitions)]


_FETCH_PARTITIONS = replica_pb2.FetchResponse.DESCRIPTOR.fields_by_name["partitions"].number
_FETCH_RECORDS = replica_pb2.FetchResult.DESCRIPTOR.fields_by_name["records"].number


def parse_fetch_response(raw: bytes) -> list[FetchedPartition]:
    """A FetchResponse off the wire, each partition's records a view of ``raw`` (no copy:
    ``lowtide.rpc.wire``); upb parses only the rest."""
    stripped, records = split_bytes_field(raw, repeated_field=_FETCH_PARTITIONS, bytes_field=_FETCH_RECORDS)
    return fetched_from_proto(replica_pb2.FetchResponse.FromString(stripped), records)
