"""Protobuf conversions of the ``lowtide.messages`` types that several ends of the wire share.

``DeleteRecordsResult`` is one dataclass from the replica to every door (KIP-107): the replica's
``DeleteRecordsHandler`` answers with it, the replica servicer and the front door's servicer put it
on the wire with ``delete_results_to_proto``, and ``ReplicaClient`` (the front door's fan-out),
``Admin`` (the Python client and the CLI) and the Kafka listener read it back with
``delete_results_from_proto``. A failed partition always travels with low watermark -1.
"""

from __future__ import annotations

from collections.abc import Iterable

from lowtide.errors import error_or_none
from lowtide.messages.replica import DeleteRecordsResult
from lowtide_pb import common_pb2


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
