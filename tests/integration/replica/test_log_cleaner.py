"""The log cleaner on real processes: 3 replica servers (each cleaning its own copy), a front door
and a real redis-server. Compaction keeps the latest value of every key at its offset; a tombstone
keeps its KIP-534 delete horizon and original timestamp until the horizon, then goes, on an idle
topic too; a replica killed with SIGKILL in the middle of a pass restarts to a readable log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lowtide.errors import LowtideError
from lowtide.localcluster import LocalCluster
from lowtide.record import decode_batches
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG

KEYS = 10


def partition_dir(cluster: LocalCluster, broker_id: int, topic: str) -> Path:
    return Path(cluster.service(f"replica-{broker_id}").data_dir) / f"{topic}-0"


def batches_on_disk(cluster: LocalCluster, broker_id: int, topic: str) -> list:
    """(header, records) of every batch in a replica's segment files, read straight from its disk.
    A swap between the listing and a read raises AssertionError: ``wait_until`` looks again."""
    directory = partition_dir(cluster, broker_id, topic)
    try:
        out = []
        for name in sorted(n for n in os.listdir(directory) if n.endswith(".log")):
            out.extend(decode_batches((directory / name).read_bytes()))
        return out
    except (OSError, LowtideError) as exc:
        raise AssertionError(f"segments of replica {broker_id} changed while read: {exc}") from exc


def records_on_disk(cluster: LocalCluster, broker_id: int, topic: str) -> list:
    return [r for _, records in batches_on_disk(cluster, broker_id, topic) for r in records]


def produce_keys(cluster: LocalCluster, topic: str, rounds: int, *, value_size: int = 8, keys: int = KEYS,
                 first_round: int = 0) -> dict[bytes, tuple[int, bytes]]:
    """``rounds`` batches writing every key (values name the round); returns key -> (offset, value)
    of its last write."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for r in range(first_round, first_round + rounds):
        pairs = [(b"key-%d" % k, (b"v%d-%d-" % (k, r)).ljust(value_size, b".")) for k in range(keys)]
        result = s.produce(cluster, topic, [v for _, v in pairs], keys=[k for k, _ in pairs])
        assert result.error_code == 0, result
        for i, (k, v) in enumerate(pairs):
            latest[k] = (result.base_offset + i, v)
    return latest


def cleaner_counter(cluster: LocalCluster, broker_id: int, name: str) -> float:
    return s.metric(cluster, f"replica-{broker_id}", f"lowtide_log_cleaner_{name}_total")


def test_a_compacted_topic_keeps_each_keys_latest_value_and_loses_a_tombstone_soon_after_its_horizon(
        cluster_factory):
    cluster = cluster_factory(config={**DEFAULT_REPLICA_CONFIG, "log.cleaner.backoff.ms": "500"}, coordinators=0)
    retention_ms = 4000
    s.create_topic(cluster, "compacted", partitions=1, rf=3, config={
        "cleanup.policy": "compact", "segment.bytes": "2048", "segment.ms": "1000",
        "delete.retention.ms": str(retention_ms), "min.cleanable.dirty.ratio": "0.01"})
    latest = produce_keys(cluster, "compacted", rounds=12)
    before_tombstones = time.time() * 1000
    tombstone = s.produce(cluster, "compacted", [None, None], keys=[b"key-3", b"key-7"])
    assert tombstone.error_code == 0
    expected = {k: v for k, v in latest.items() if k not in (b"key-3", b"key-7")}
    assert s.produce(cluster, "compacted", [b"no key"]).error_code == 87  # INVALID_RECORD: compacted topics need keys
    # Nothing is produced from here on: the topic is idle.

    # The three replicas are watched together: each keeps the tombstones for delete.retention.ms
    # (4 s) after its own pass, and a replica that compacted while another was still awaited must
    # not have dropped them before it is looked at.
    horizons: dict[int, int] = {}

    def tombstones_kept_with_their_horizon(broker: int) -> bool:
        batches = batches_on_disk(cluster, broker, "compacted")
        records = [r for _, rs in batches for r in rs]
        with_tombstones = [(h, rs) for h, rs in batches if any(r.value is None for r in rs)]
        if len(with_tombstones) != 1 or not with_tombstones[0][0].has_delete_horizon:
            return False  # not compacted yet (or, if it never shows, the pass was missed: the wait fails)
        [(header, kept)] = with_tombstones
        assert header.base_offset == tombstone.base_offset
        assert [(r.offset, r.key) for r in kept] == [(tombstone.base_offset, b"key-3"),
                                                   (tombstone.base_offset + 1, b"key-7")]
        # Their original (produce-time) timestamps, not the horizon set by a later pass:
        pass_time = header.delete_horizon_ms - retention_ms
        assert all(before_tombstones - 1000 <= r.timestamp <= pass_time for r in kept)
        assert pass_time <= time.time() * 1000
        if {r.key: (r.offset, r.value) for r in records if r.value is not None} != expected \
                or len(records) != len(expected) + 2:  # every superseded value gone
            return False  # a pass kept the tombstones while older segments wait for the next one
        horizons[broker] = header.delete_horizon_ms
        return True

    s.wait_until(lambda: all(b in horizons or tombstones_kept_with_their_horizon(b) for b in (0, 1, 2)),
                 timeout_s=45, interval_s=0.1, what="every replica compacted, keeping the tombstones with a horizon")

    for broker in (0, 1, 2):
        s.wait_until(lambda broker=broker: [r.key for r in records_on_disk(cluster, broker, "compacted")
                                            if r.value is None] == [],
                     timeout_s=retention_ms / 1000 + 15, interval_s=0.1, what=f"tombstones gone on {broker}")
        assert time.time() * 1000 - horizons[broker] < 10_000, "the tombstone outlived its horizon by 10 s"
        assert {r.key: (r.offset, r.value) for r in records_on_disk(cluster, broker, "compacted")} == expected
        assert cleaner_counter(cluster, broker, "tombstones_removed") >= 2
    # The consumer's view from the leader agrees, offsets included.
    assert {(o, v) for o, v in s.read_all(cluster, "compacted")} == set(expected.values())


def test_a_replica_killed_in_the_middle_of_a_cleaning_pass_restarts_with_every_latest_value_at_its_offset(
        cluster_factory):
    # A throttled cleaner (100 KB/s), so one pass over ~600 KB takes seconds and the kill lands in it.
    cluster = cluster_factory(coordinators=0, config={**DEFAULT_REPLICA_CONFIG, "log.cleaner.backoff.ms": "300",
                                      "log.cleaner.io.max.bytes.per.second": "100000"})
    s.create_topic(cluster, "kv", partitions=1, rf=3, config={"cleanup.policy": "compact", "segment.bytes": "65536"})
    leader = s.leader_of(cluster, "kv")
    victim = next(r for r in (0, 1, 2) if r != leader)
    originals: dict[int, tuple[bytes, bytes]] = {}
    latest: dict[bytes, tuple[int, bytes]] = {}
    for round_ in range(12):
        written = produce_keys(cluster, "kv", rounds=1, value_size=500, keys=100, first_round=round_)
        latest.update(written)
        originals.update({offset: (k, v) for k, (offset, v) in written.items()})
    directory = partition_dir(cluster, victim, "kv")

    def cleaning_in_progress() -> bool:
        return any(n.endswith(".cleaned") for n in os.listdir(directory))

    # On a loaded machine the passes may all have run while the rounds above were produced: keep
    # making the log dirty (one more round a second) until a pass is caught writing.
    round_ = 12
    deadline = time.monotonic() + 120
    while not cleaning_in_progress():
        assert time.monotonic() < deadline, f"no pass caught writing on replica {victim} in 120 s"
        next_round = time.monotonic() + 1.0
        while time.monotonic() < next_round:
            if cleaning_in_progress():
                break
            time.sleep(0.005)
        else:
            written = produce_keys(cluster, "kv", rounds=1, value_size=500, keys=100, first_round=round_)
            latest.update(written)
            originals.update({offset: (k, v) for k, (offset, v) in written.items()})
            round_ += 1
    cluster.kill(f"replica-{victim}", signal.SIGKILL)

    cluster.start_service(f"replica-{victim}")  # opening the log finishes or discards the swap
    leo = s.describe(cluster, leader, "kv").log_end_offset
    s.wait_until(lambda: s.describe(cluster, victim, "kv").log_end_offset == leo, what="the victim caught up")
    cluster.stop_service(f"replica-{victim}")  # read its files at rest (a clean stop abandons a pass tidily)

    assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".cleaner-swap"))]
    records = records_on_disk(cluster, victim, "kv")
    assert all(originals[r.offset] == (r.key, r.value) for r in records), "a record moved or changed"
    on_disk = {r.key: (r.offset, r.value) for r in records}
    assert on_disk == latest
