"""Folding internal topics to the high watermark (lowtide/internal_topics/read.py)."""

from __future__ import annotations

import time

import pytest

from lowtide.errors import CorruptMessage, LeaderNotAvailable, NetworkException, OffsetOutOfRange
from lowtide.internal_topics import Fetched, FoldReader, RetryPolicy, call_leader
from lowtide.record import encode_batch
from tests.unit.internal_topics.fakes import FakeRouter


class ListFold:
    """A fold that keeps every record value it was given."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.position = 0
        self.values: list[bytes] = []

    def apply_all(self, records) -> None:
        self.values.extend(records)

    def advance(self, position: int) -> None:
        self.position = max(self.position, position)

    def reset(self, position: int) -> None:
        self.position, self.values = position, []


def decode(records: bytes, from_offset: int) -> list[bytes]:
    from lowtide.record import decode_batches

    return [r.value for _, rs in decode_batches(records) for r in rs if r.offset >= from_offset]


def batch(base: int, *values: bytes) -> bytes:
    return encode_batch(list(values), base_offset=base, timestamp_ms=0)


class Log:
    """One leader's partitions: ``{partition: (log start, [values])}``, HW = log end."""

    def __init__(self, parts: dict[int, tuple[int, list[bytes]]]) -> None:
        self.parts = parts
        self.fetches = 0

    def fetch(self, address: str, asks: list[tuple[int, int]]) -> list[Fetched]:
        self.fetches += 1
        out = []
        for p, offset in asks:
            start, values = self.parts[p]
            hw = start + len(values)
            if offset < start or offset > hw:
                out.append(Fetched(partition=p, log_start_offset=start, error=OffsetOutOfRange("gone")))
                continue
            # one record per fetch: the reader has to come back while the position moves
            records = batch(offset, values[offset - start]) if offset < hw else b""
            out.append(Fetched(partition=p, records=records, high_watermark=hw, log_start_offset=start))
        return out


def reader() -> FoldReader:
    return FoldReader(new_fold=ListFold, decode=decode)


def route_all(partitions):
    return {"a:1": list(partitions)}, {}


def test_partitions_are_folded_up_to_the_high_watermark_fetch_after_fetch():
    log = Log({0: (0, [b"a", b"b", b"c"]), 1: (0, [])})
    r = reader()
    assert r.read_to_high_watermark([0, 1], route=route_all, fetch=log.fetch) == {}
    assert r.positions() == {0: 3, 1: 0} and r._folds[0].values == [b"a", b"b", b"c"]
    log.parts[0][1].append(b"d")  # the tail's next round reads only what is new
    assert r.read_to_high_watermark([0], route=route_all, fetch=log.fetch) == {}
    assert r._folds[0].values == [b"a", b"b", b"c", b"d"]


def test_a_position_out_of_range_restarts_the_partition_from_the_log_start_with_an_empty_fold():
    r = reader()
    r.apply(0, [b"stale"])
    r._folds[0].advance(2)
    log = Log({0: (5, [b"x"])})
    assert r.read_to_high_watermark([0], route=route_all, fetch=log.fetch) == {}
    assert r.positions() == {0: 6} and r._folds[0].values == [b"x"]


def test_what_cannot_be_read_is_reported_per_partition():
    log = Log({0: (0, [b"a"])})

    def route(partitions):
        return {"a:1": [0]}, {1: "LEADER_NOT_AVAILABLE: no leader"}

    def failing(address, asks):
        raise NetworkException("down")

    r = reader()
    assert r.read_to_high_watermark([0, 1], route=route, fetch=log.fetch) == {1: "LEADER_NOT_AVAILABLE: no leader"}
    failures = reader().read_to_high_watermark([0], route=route_all, fetch=failing)
    assert failures == {0: "fetch from a:1: NETWORK_EXCEPTION: down"}


def test_an_error_answer_and_a_record_that_cannot_be_decoded_are_failures():
    def fetch(address, asks):
        return [Fetched(partition=0, error=CorruptMessage("big")), Fetched(partition=1, records=batch(0, b"x"),
                                                                            high_watermark=1)]

    def bad(records, from_offset):
        raise CorruptMessage("undecodable")

    r = FoldReader(new_fold=ListFold, decode=bad)
    assert r.read_to_high_watermark([0, 1], route=route_all, fetch=fetch) == {
        0: "CORRUPT_MESSAGE: big", 1: "at offset 0: CORRUPT_MESSAGE: undecodable"}


def test_a_partition_whose_leader_has_not_settled_its_high_watermark_is_not_read_at_all():
    log = Log({0: (0, [b"a"]), 1: (0, [b"b"])})
    asked = []

    def settled(address, partitions):
        asked.append((address, partitions))
        return {1: "OFFSET_NOT_AVAILABLE: not yet"}

    r = reader()
    failures = r.read_to_high_watermark([0, 1], route=route_all, fetch=log.fetch, settled=settled)
    assert failures == {1: "OFFSET_NOT_AVAILABLE: not yet"}
    assert r.positions() == {0: 1} and asked == [("a:1", [0, 1])]

    def unreachable(address, partitions):
        raise NetworkException("down")

    failures = reader().read_to_high_watermark([0], route=route_all, fetch=log.fetch, settled=unreachable)
    assert failures == {0: "at a:1: NETWORK_EXCEPTION: down"}


def test_call_leader_retries_while_leadership_moves_then_raises():
    router = FakeRouter(LeaderNotAvailable("none"), "b:1", cached="a:1")
    calls = []

    def call(address):
        calls.append(address)
        if address == "a:1":
            raise LeaderNotAvailable("moved")
        return address

    assert call_leader(call, router=router, partition=0, deadline=time.monotonic() + 5,
                       retry=RetryPolicy(step_s=0.001)) == "b:1"
    assert calls == ["a:1", "b:1"] and router.lookups == [True, True]
    with pytest.raises(OffsetOutOfRange):  # not retriable: raised at once, the leader kept
        router = FakeRouter("a:1", cached="a:1")
        call_leader(lambda a: (_ for _ in ()).throw(OffsetOutOfRange("below")), router=router, partition=0,
                    deadline=time.monotonic() + 5)
    assert router.cached == "a:1"
    with pytest.raises(LeaderNotAvailable):  # past the deadline: the last error
        call_leader(call, router=FakeRouter("a:1"), partition=0, deadline=time.monotonic() + 0.01,
                    retry=RetryPolicy(step_s=0.005))
