"""Folding ``__share_group_state`` (lowtide.share.persist): the latest snapshot of each
share-partition, updates over it, tombstones, and a deposed leader's late write fenced by its
leader epoch."""

from __future__ import annotations

from lowtide.record import encode_batch
from lowtide.share.codec import ShareSnapshot, ShareStateKey, encode_key, encode_snapshot
from lowtide.share.persist import KeyFold, StateRecord, decode_records
from lowtide.share.state import ACKNOWLEDGED, AVAILABLE, StateBatch

KEY = ShareStateKey(group_id="g", topic_id="cd" * 16, partition=2)


def snapshot(start: int, *, leader_epoch: int = 1, epoch: int = 0, batches=(), update: bool = False) -> ShareSnapshot:
    return ShareSnapshot(snapshot_epoch=epoch, state_epoch=0, leader_epoch=leader_epoch, start_offset=start,
                         create_timestamp_ms=0 if update else 5, write_timestamp_ms=0 if update else 6,
                         batches=tuple(batches), is_update=update)


def folded(*values: ShareSnapshot | None) -> ShareSnapshot | None:
    fold = KeyFold()
    fold.apply_all(StateRecord(key=KEY, value=v) for v in values)
    return fold.latest.get((KEY.group_id, KEY.topic_id, KEY.partition))


def test_the_latest_snapshot_of_a_share_partition_wins():
    assert folded(snapshot(10), snapshot(20, epoch=1)).start_offset == 20


def test_a_tombstone_forgets_the_share_partition():
    assert folded(snapshot(10), None) is None


def test_a_snapshot_from_an_older_leader_epoch_is_ignored():
    assert folded(snapshot(10, leader_epoch=3), snapshot(5, leader_epoch=2, epoch=9)).start_offset == 10


def test_an_update_applies_over_the_snapshot_it_follows():
    base = snapshot(10, batches=[StateBatch(10, 19, AVAILABLE, 1)])
    update = snapshot(10, epoch=1, update=True, batches=[StateBatch(12, 13, ACKNOWLEDGED, 1)])
    assert folded(base, update).batches == (StateBatch(10, 11, AVAILABLE, 1), StateBatch(12, 13, ACKNOWLEDGED, 1),
                                            StateBatch(14, 19, AVAILABLE, 1))


def test_records_are_read_back_from_the_batches_written():
    value = snapshot(10, batches=[StateBatch(10, 19, AVAILABLE, 2)])
    data = encode_batch([encode_snapshot(value), None], keys=[encode_key(KEY), encode_key(KEY)], base_offset=40)
    assert decode_records(data, 40) == [StateRecord(key=KEY, value=value), StateRecord(key=KEY, value=None)]
    assert decode_records(data, 41) == [StateRecord(key=KEY, value=None)]  # below the fold's position: skipped


def test_a_snapshot_from_before_an_admin_reset_is_ignored():
    reset = ShareSnapshot(snapshot_epoch=4, state_epoch=1, leader_epoch=3, start_offset=0, create_timestamp_ms=5,
                          write_timestamp_ms=7, batches=())
    stale = ShareSnapshot(snapshot_epoch=5, state_epoch=0, leader_epoch=3, start_offset=40, create_timestamp_ms=5,
                          write_timestamp_ms=8, batches=())
    assert folded(snapshot(30, leader_epoch=3), reset, stale) == reset
