"""KIP-932 share fetching across the gRPC boundary (``rpc/convert/share``): what a share consumer
sends reads back at the replica as the Kafka listener would have built it, and the share handler's
answer reads back at the client with its records, acquired ranges and typed errors."""

from __future__ import annotations

from lowtide.errors import InvalidRecordState, NotLeaderOrFollower, ShareSessionNotFound
from lowtide.messages.share import (
    AcquiredRange,
    ShareAckBatch,
    ShareFetchAnswer,
    ShareFetchAsk,
    SharePartitionAnswer,
    SharePartitionAsk,
)
from lowtide.rpc.convert import share as convert

TOPIC_ID = "0123456789abcdef0123456789abcdef"


def test_a_share_fetch_with_acknowledgements_and_forgotten_partitions_reads_back_the_same():
    ask = ShareFetchAsk(
        group_id="g", member_id="m", session_epoch=3, max_wait_ms=400, min_bytes=1, max_bytes=1 << 20,
        max_records=100, forgotten=((TOPIC_ID, 2),),
        partitions=(SharePartitionAsk(topic_id=TOPIC_ID, partition=0, acknowledgements=(
            ShareAckBatch(first=0, last=9, types=(1,)), ShareAckBatch(first=10, last=12, types=(1, 0, 2)))),
            SharePartitionAsk(topic_id=TOPIC_ID, partition=1)))
    assert convert.fetch_from_proto(convert.fetch_to_proto(ask)) == ask


def test_a_share_fetch_leaving_sizes_at_zero_gets_kafkas_defaults():
    back = convert.fetch_from_proto(convert.fetch_to_proto(ShareFetchAsk(
        group_id="g", member_id="m", session_epoch=0, partitions=(), max_bytes=0, max_records=0)))
    assert (back.max_bytes, back.max_records) == (convert.DEFAULT_MAX_BYTES, convert.DEFAULT_MAX_RECORDS)


def test_a_share_acknowledge_reads_back_as_an_ask_that_fetches_nothing():
    ask = ShareFetchAsk(group_id="g", member_id="m", session_epoch=-1, fetch=False, partitions=(
        SharePartitionAsk(topic_id=TOPIC_ID, partition=0, acknowledgements=(ShareAckBatch(5, 5, (3,)),)),))
    back = convert.acknowledge_from_proto(convert.acknowledge_to_proto(ask))
    assert back == ask and back.fetch is False


def test_an_answer_keeps_records_acquired_ranges_and_each_kind_of_error():
    answer = ShareFetchAnswer(lock_timeout_ms=30_000, partitions=(
        SharePartitionAnswer(topic_id=TOPIC_ID, partition=0, records=b"\x00batches",
                             acquired=(AcquiredRange(0, 9, 1), AcquiredRange(10, 19, 2)), leader_id=1, leader_epoch=4),
        SharePartitionAnswer(topic_id=TOPIC_ID, partition=1, error=NotLeaderOrFollower("moved"),
                             acknowledge_error=InvalidRecordState("not held"))))
    back = convert.answer_from_proto(convert.answer_to_proto(answer))
    assert back.error is None and back.lock_timeout_ms == 30_000
    ok, failed = back.partitions
    assert ok.records == b"\x00batches" and ok.acquired == answer.partitions[0].acquired
    assert (ok.error, ok.acknowledge_error, ok.leader_id, ok.leader_epoch) == (None, None, 1, 4)
    assert isinstance(failed.error, NotLeaderOrFollower) and failed.error.message == "moved"
    assert isinstance(failed.acknowledge_error, InvalidRecordState)


def test_a_whole_request_error_comes_back_typed():
    back = convert.answer_from_proto(convert.answer_to_proto(ShareFetchAnswer(error=ShareSessionNotFound("gone"))))
    assert isinstance(back.error, ShareSessionNotFound) and back.partitions == ()
