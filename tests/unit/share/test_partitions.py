"""A replica's share-partitions (lowtide.share.partitions): share sessions, acquisition from the
log's bytes, and durability: an acknowledgement is in the state log before it returns, a failed
write changes nothing, and a restarted (or newly elected) leader continues from the log."""

from __future__ import annotations

import pytest

from lowtide.errors import (
    CoordinatorNotAvailable,
    InvalidShareSessionEpoch,
    ShareSessionLimitReached,
    ShareSessionNotFound,
)
from lowtide.messages.share import MAX_SESSION_EPOCH, AcquiredRange, ShareAckBatch, next_session_epoch
from lowtide.record import encode_batch
from lowtide.share.codec import ShareSnapshot, ShareStateKey
from lowtide.share.partitions import EARLIEST, LATEST, SESSION_IDLE_MS, LeaderLog, ShareConfig, SharePartitions
from lowtide.share.state import ACCEPT, RELEASE, SharePartitionConfig

KEY = ShareStateKey(group_id="g", topic_id="ab" * 16, partition=0)
CONFIG = ShareConfig(partition=SharePartitionConfig(lock_duration_ms=1000, delivery_count_limit=5),
                     auto_offset_reset=EARLIEST)
# The log: batches of 10 records at 0, 10 and 20 (30 records, all below the high watermark).
LOG = b"".join(encode_batch([b"v%d" % i for i in range(10)], base_offset=base) for base in (0, 10, 20))


class MemoryStateLog:
    """A state log kept in memory, with a switch to make its writes fail (the leader of
    ``__share_group_state`` unreachable)."""

    def __init__(self) -> None:
        self.latest: dict[ShareStateKey, ShareSnapshot] = {}
        self.failing = False
        self.writes = 0

    def write(self, key: ShareStateKey, value: ShareSnapshot) -> None:
        if self.failing:
            raise CoordinatorNotAvailable("__share_group_state-0 did not take the share state")
        self.latest[key] = value
        self.writes += 1

    def read(self, key: ShareStateKey) -> ShareSnapshot | None:
        return self.latest.get(key)

    def read_group(self, group_id: str) -> dict[tuple[str, int], ShareSnapshot]:
        return {(k.topic_id, k.partition): v for k, v in self.latest.items() if k.group_id == group_id}


def leader(epoch: int = 1, *, hw: int = 30) -> LeaderLog:
    return LeaderLog(leader_epoch=epoch, log_start_offset=0, high_watermark=hw,
                     read=lambda offset, max_bytes: LOG[(offset // 10) * len(LOG) // 3:])


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def shares(log: MemoryStateLog, clock: Clock | None = None, config: ShareConfig = CONFIG) -> SharePartitions:
    return SharePartitions(config=config, state_log=log, clock=clock or Clock())


def test_a_share_session_opens_at_epoch_zero_and_counts_up():
    sp = shares(MemoryStateLog())
    assert sp.open_session(group_id="g", member_id="m", epoch=0, add=[("t", 0)]) == {("t", 0)}
    assert sp.open_session(group_id="g", member_id="m", epoch=1, add=[("t", 1)], forget=[("t", 0)]) == {("t", 1)}
    with pytest.raises(InvalidShareSessionEpoch):
        sp.open_session(group_id="g", member_id="m", epoch=1, add=[])
    with pytest.raises(ShareSessionNotFound):
        sp.open_session(group_id="g", member_id="other", epoch=3, add=[])
    assert sp.close_session(group_id="g", member_id="m") == {("t", 1)}


def test_a_share_session_epoch_wraps_from_the_largest_int32_to_one_not_zero():
    # The member (client/share_consumer.py) counts with the same function: both sides agree.
    assert [next_session_epoch(e) for e in (0, 1, MAX_SESSION_EPOCH - 1, MAX_SESSION_EPOCH)] == \
        [1, 2, MAX_SESSION_EPOCH, 1]
    sp = shares(MemoryStateLog())
    sp.open_session(group_id="g", member_id="m", epoch=0, add=[("t", 0)])
    sp._sessions[("g", "m")].next_epoch = MAX_SESSION_EPOCH
    sp.open_session(group_id="g", member_id="m", epoch=MAX_SESSION_EPOCH, add=[])
    assert sp.open_session(group_id="g", member_id="m", epoch=1, add=[]) == {("t", 0)}


def test_a_fetch_acquires_whole_batches_and_answers_the_bytes_of_those_batches_only():
    sp = shares(MemoryStateLog())
    ranges, data = sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=15, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1), AcquiredRange(10, 19, 1)]
    assert data == LOG[:2 * len(LOG) // 3]  # the third batch was read, not acquired: not sent


def test_a_new_share_partition_starts_at_the_high_watermark_by_default():
    log = MemoryStateLog()
    sp = shares(log, config=ShareConfig(auto_offset_reset=LATEST))
    assert sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=100, max_bytes=1 << 20) == ([], b"")
    # A leader elected next starts there too, not at its own high watermark.
    assert sp.read_start_offsets("g") == {(KEY.topic_id, 0): log.latest[KEY]} and log.latest[KEY].start_offset == 30


def test_a_share_partition_whose_first_state_cannot_be_written_serves_nothing():
    log = MemoryStateLog()
    log.failing = True
    sp = shares(log)
    with pytest.raises(CoordinatorNotAvailable):
        sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    log.failing = False
    ranges, _ = sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1)]


def test_an_acknowledgement_is_in_the_state_log_when_it_returns():
    log = MemoryStateLog()
    sp = shares(log)
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert log.writes == 1 and log.latest[KEY].start_offset == 0  # the share-partition's first state
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert log.writes == 1  # acquiring writes nothing
    sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    assert log.latest[KEY].start_offset == 10 and log.latest[KEY].snapshot_epoch == 1


def test_an_acknowledgement_whose_write_fails_changes_nothing():
    log = MemoryStateLog()
    sp = shares(log)
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    log.failing = True
    with pytest.raises(CoordinatorNotAvailable):
        sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    assert sp.describe(KEY).start_offset == 0
    log.failing = False  # the client sends it again: the records are still its own
    sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    assert log.latest[KEY].start_offset == 10


def test_a_restarted_leader_continues_from_the_state_log():
    log = MemoryStateLog()
    before = shares(log)
    before.acquire(key=KEY, member_id="m", leader=leader(), max_records=30, max_bytes=1 << 20)
    before.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[
        ShareAckBatch(0, 9, (ACCEPT,)), ShareAckBatch(20, 24, (ACCEPT,)), ShareAckBatch(25, 29, (RELEASE,))])
    after = shares(log)  # kill -9 and restart: only the state log is left
    ranges, _ = after.acquire(key=KEY, member_id="n", leader=leader(), max_records=100, max_bytes=1 << 20)
    # 10-19 were out with m (written as available, counted once): delivered a second time; 20-24
    # acknowledged: never again; 25-29 released: a second delivery.
    assert ranges == [AcquiredRange(10, 19, 2), AcquiredRange(25, 29, 2)]


def test_a_new_leader_epoch_reloads_the_share_partition():
    log = MemoryStateLog()
    old_leader = shares(log)
    old_leader.acquire(key=KEY, member_id="m", leader=leader(1), max_records=10, max_bytes=1 << 20)
    old_leader.acknowledge(key=KEY, member_id="m", leader=leader(1), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    # Meanwhile another replica led (epoch 2) and acknowledged 10-19 as well.
    elsewhere = shares(log)
    elsewhere.acquire(key=KEY, member_id="n", leader=leader(2), max_records=10, max_bytes=1 << 20)
    elsewhere.acknowledge(key=KEY, member_id="n", leader=leader(2), batches=[ShareAckBatch(10, 19, (ACCEPT,))])
    ranges, _ = old_leader.acquire(key=KEY, member_id="m", leader=leader(3), max_records=100, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(20, 29, 1)]


def test_a_closed_session_releases_what_its_member_held():
    log = MemoryStateLog()
    clock = Clock()
    sp = shares(log, clock)
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    sp.release(key=KEY, member_id="m", leader=leader())
    ranges, _ = sp.acquire(key=KEY, member_id="n", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 2)]


def test_records_whose_lock_ran_out_are_acquired_by_the_next_fetch():
    clock = Clock()
    sp = shares(MemoryStateLog(), clock)
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    clock.now = 1000
    ranges, _ = sp.acquire(key=KEY, member_id="n", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 2)]


def test_a_share_session_left_idle_by_a_dead_member_is_forgotten():
    clock = Clock()
    sp = shares(MemoryStateLog(), clock)
    sp.open_session(group_id="g", member_id="dead", epoch=0, add=[("t", 0)])
    clock.now = SESSION_IDLE_MS
    sp.open_session(group_id="g", member_id="alive", epoch=0, add=[("t", 0)])
    assert sp.count_sessions() == 2  # not idle for longer than the limit yet
    clock.now = SESSION_IDLE_MS + 1
    sp.open_session(group_id="g", member_id="alive", epoch=1, add=[])
    assert sp.count_sessions() == 1
    with pytest.raises(ShareSessionNotFound):
        sp.open_session(group_id="g", member_id="dead", epoch=1, add=[])


def test_an_acknowledgement_that_moves_the_start_offset_says_so_after_it_is_durable():
    log = MemoryStateLog()
    sp = shares(log)
    moved: list[tuple[ShareStateKey, int, int]] = []
    sp.on_start_offset_moved = lambda key, offset: moved.append((key, offset, log.latest[key].start_offset))
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=20, max_bytes=1 << 20)
    sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(10, 19, (ACCEPT,))])
    assert moved == []  # 0-9 still out: the start offset did not move
    sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    assert moved == [(KEY, 20, 20)]  # and it was in the state log when said


def test_an_admin_reset_is_taken_up_when_a_member_next_opens_a_session():
    log = MemoryStateLog()
    sp = shares(log)
    sp.open_session(group_id="g", member_id="m", epoch=0, add=[(KEY.topic_id, 0)])
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    sp.close_session(group_id="g", member_id="m")
    sp.reset(KEY, 0)  # the group is empty: an admin moves it back to the start
    assert (log.latest[KEY].start_offset, log.latest[KEY].state_epoch) == (0, 1)
    sp.open_session(group_id="g", member_id="n", epoch=0, add=[(KEY.topic_id, 0)])
    ranges, _ = sp.acquire(key=KEY, member_id="n", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1)]  # delivered again, as new
    sp.acknowledge(key=KEY, member_id="n", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    assert (log.latest[KEY].start_offset, log.latest[KEY].state_epoch) == (10, 1)  # written in the new epoch


def test_a_deleted_groups_state_is_started_afresh_when_a_member_next_opens_a_session():
    log = MemoryStateLog()
    sp = shares(log)
    sp.open_session(group_id="g", member_id="m", epoch=0, add=[(KEY.topic_id, 0)])
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    sp.acknowledge(key=KEY, member_id="m", leader=leader(), batches=[ShareAckBatch(0, 9, (ACCEPT,))])
    sp.close_session(group_id="g", member_id="m")
    del log.latest[KEY]  # DeleteGroups tombstoned it
    sp.open_session(group_id="g", member_id="n", epoch=0, add=[(KEY.topic_id, 0)])
    ranges, _ = sp.acquire(key=KEY, member_id="n", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1)]  # from share.auto.offset.reset again (earliest here)


def test_a_groups_share_auto_offset_reset_overrides_the_replicas_default():
    log = MemoryStateLog()
    configs = {"g": {"share.auto.offset.reset": "earliest"}}
    sp = SharePartitions(config=ShareConfig(auto_offset_reset=LATEST), state_log=log, clock=Clock(),
                         group_configs=lambda group: configs.get(group, {}))
    ranges, _ = sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1)]
    other = ShareStateKey(group_id="other", topic_id=KEY.topic_id, partition=0)
    assert sp.acquire(key=other, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20) == ([], b"")
    assert log.latest[other].start_offset == 30


def test_a_groups_lock_duration_applies_from_its_next_share_session():
    clock = Clock()
    configs: dict[str, dict[str, str]] = {"g": {"share.record.lock.duration.ms": "5000"}}
    sp = SharePartitions(config=CONFIG, state_log=MemoryStateLog(), clock=clock,
                         group_configs=lambda group: configs.get(group, {}))
    assert sp.partition_config("g").lock_duration_ms == 5000
    assert sp.partition_config("other").lock_duration_ms == 1000
    sp.acquire(key=KEY, member_id="m", leader=leader(), max_records=10, max_bytes=1 << 20)
    clock.now = 1000  # the replica's 1 s lock would have run out; the group's 5 s has not
    assert sp.acquire(key=KEY, member_id="n", leader=leader(), max_records=10, max_bytes=1 << 20)[0] == [
        AcquiredRange(10, 19, 1)]
    configs["g"] = {}
    sp.open_session(group_id="g", member_id="n", epoch=0, add=[("t", 0)])
    sp.acquire(key=KEY, member_id="n", leader=leader(), max_records=10, max_bytes=1 << 20)  # 20..29, 1 s lock
    clock.now = 2000
    assert sp.acquire(key=KEY, member_id="o", leader=leader(), max_records=10, max_bytes=1 << 20)[0] == [
        AcquiredRange(20, 29, 2)]


def test_a_new_share_session_past_the_limit_is_refused_and_a_reopened_one_is_not():
    sp = SharePartitions(config=ShareConfig(max_sessions=2), state_log=MemoryStateLog(), clock=Clock())
    sp.open_session(group_id="g", member_id="a", epoch=0, add=[("t", 0)])
    sp.open_session(group_id="g", member_id="b", epoch=0, add=[("t", 0)])
    with pytest.raises(ShareSessionLimitReached):
        sp.open_session(group_id="g", member_id="c", epoch=0, add=[("t", 0)])
    assert sp.open_session(group_id="g", member_id="a", epoch=0, add=[("t", 1)]) == {("t", 1)}  # replaces its own
    sp.close_session(group_id="g", member_id="b")
    assert sp.open_session(group_id="g", member_id="c", epoch=0, add=[("t", 0)]) == {("t", 0)}


def test_a_read_committed_acquisition_archives_the_records_of_aborted_transactions():
    # Batches at 0 (not transactional), 10 (producer 7's transaction, aborted by a marker at 30)
    # and 20 (producer 8's, committed).
    log_bytes = b"".join([encode_batch([b"v%d" % i for i in range(10)], base_offset=0),
                          encode_batch([b"a%d" % i for i in range(10)], base_offset=10, producer_id=7,
                                       producer_epoch=0, base_sequence=0, is_transactional=True),
                          encode_batch([b"c%d" % i for i in range(10)], base_offset=20, producer_id=8,
                                       producer_epoch=0, base_sequence=0, is_transactional=True)])
    asked: list[tuple[int, int]] = []

    def aborted(start: int, end: int) -> list[tuple[int, int, int]]:
        asked.append((start, end))
        return [(7, 10, 30)]

    committed = LeaderLog(leader_epoch=1, log_start_offset=0, high_watermark=30, aborted=aborted,
                          read=lambda offset, max_bytes: log_bytes[(offset // 10) * len(log_bytes) // 3:])
    log = MemoryStateLog()
    sp = shares(log)
    ranges, data = sp.acquire(key=KEY, member_id="m", leader=committed, max_records=30, max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1), AcquiredRange(20, 29, 1)]
    assert data == log_bytes and asked == [(0, 30)]
    assert sp.acquire(key=KEY, member_id="n", leader=committed, max_records=30, max_bytes=1 << 20) == ([], b"")
    sp.acknowledge(key=KEY, member_id="m", leader=committed,
                   batches=[ShareAckBatch(0, 9, (ACCEPT,)), ShareAckBatch(20, 29, (ACCEPT,))])
    assert log.latest[KEY].start_offset == 30  # the aborted records are done with too: archived


def test_a_read_uncommitted_acquisition_hands_out_aborted_records_like_any_other():
    log_bytes = encode_batch([b"a%d" % i for i in range(10)], base_offset=0, producer_id=7, producer_epoch=0,
                             base_sequence=0, is_transactional=True)
    uncommitted = LeaderLog(leader_epoch=1, log_start_offset=0, high_watermark=10,
                            read=lambda offset, max_bytes: log_bytes)
    ranges, _ = shares(MemoryStateLog()).acquire(key=KEY, member_id="m", leader=uncommitted, max_records=30,
                                                  max_bytes=1 << 20)
    assert ranges == [AcquiredRange(0, 9, 1)]
