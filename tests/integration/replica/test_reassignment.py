"""Partition reassignment, the replica side, on real processes: 4 replica servers, a front door and
a real redis-server (docs/design/reassignment.md sections 1, 2 and 4).

One partition moves from {0,1,2} (broker 0 leading) to {1,2,3} after DeleteRecords raised its log
start offset, through ``Admin.alter_partition_reassignments``, and the controller finishes it.
The adding replica (broker 3) is paused (SIGSTOP, its session still alive) while the move starts,
so a DeleteRecords issued then must wait for it: it is live and has not reported. Checked:

* the DeleteRecords issued while broker 3 is adding is acknowledged only after broker 3 resumed,
  with broker 3's own log start offset at the acknowledged low watermark;
* no low watermark published from then on (the leaders' change events) is -1 or below the one
  acknowledged before the move: not when the leader starts counting the silent broker 3, not
  when broker 3's first fetch, at offset 0, reports log start offset 0;
* broker 3 never writes a record below the leader's log start offset: its first segment starts
  there, and a watcher that lists its segment files every few milliseconds from the start of the
  move sees no non-empty segment below it;
* broker 3 joins the ISR, the move completes (replicas {1,2,3}, nothing adding or removing,
  leadership off broker 0), broker 0's partition directory is gone, and every acknowledged record
  from the low watermark on reads back at its offset.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis as redis_lib

from lowtide.client.admin import Admin
from lowtide.localcluster import LocalCluster
from lowtide.purgatory.events import LowWatermarkSubscriber
from lowtide_pb import common_pb2
from tests.integration import support as s

TOPIC = "moving"
BATCHES, PER_BATCH = 30, 20
# On batch boundaries: a log start offset inside a batch makes a new replica take the whole batch
# (PartitionLog.append_as_follower restarts at its base, as Kafka does), as the leader keeps it.
FIRST_DELETE, SECOND_DELETE = 15 * PER_BATCH, 22 * PER_BATCH


class SegmentWatcher:
    """Lists one broker's segment files of ``TOPIC``-0 every few milliseconds (the directory may
    not exist yet) and keeps every non-empty ``.log`` file seen with a base offset below
    ``floor``. Runs on its own thread until ``stop``."""

    def __init__(self, partition_dir: Path, *, floor: int) -> None:
        self.dir, self.floor = partition_dir, floor
        self.below: set[tuple[int, int]] = set()
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="segment-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.looks += 1
            try:
                files = list(self.dir.iterdir())
            except FileNotFoundError:
                continue
            for f in files:
                if not f.name.endswith(".log"):
                    continue
                try:
                    base, size = int(f.name.split(".")[0]), f.stat().st_size
                except (FileNotFoundError, ValueError):
                    continue  # deleted between the listing and the stat: the next look sees the rest
                if base < self.floor and size > 0:
                    self.below.add((base, size))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def move_to(cluster: LocalCluster, target: tuple[int, ...]) -> None:
    with Admin(cluster.bootstrap) as admin:
        assert admin.alter_partition_reassignments({(TOPIC, 0): list(target)}) == {(TOPIC, 0): None}


def settled_on(cluster: LocalCluster, replicas: tuple[int, ...]) -> bool:
    st = s.store(cluster).partition_state(TOPIC, 0)
    return st.replicas == replicas and not st.reassigning


def test_an_adding_replica_starts_at_the_log_start_offset_and_holds_delete_records_until_it_reports_it(
        cluster_factory):
    # A long session: broker 3, paused, must stay live however slow the machine (nothing here waits
    # for a session to lapse).
    cluster = cluster_factory(replicas=4, coordinators=0, session_timeout_ms=15_000)
    # Placed on {0,1,2}, led by broker 0 (the broker the move removes): written straight into the
    # store, since CreateTopics places replicas from a random start.
    s.store(cluster).create_topic(name=TOPIC, partitions=1, replication_factor=3,
                                  config={"segment.bytes": "4096"}, assignment=[[0, 1, 2]])
    s.wait_until(lambda: [s.describe(cluster, b, TOPIC).role for b in (0, 1, 2)] == ["leader", "follower", "follower"],
                 what="the topic hosted on {0,1,2}")

    acked: dict[int, bytes] = {}
    for b in range(BATCHES):
        values = [f"rec-{b}-{i}-".encode() + b"x" * 100 for i in range(PER_BATCH)]
        r = s.produce(cluster, TOPIC, values, acks=-1, leader=0)
        assert r.error_code == 0, r
        acked.update((r.base_offset + i, v) for i, v in enumerate(values))
    assert len(acked) == BATCHES * PER_BATCH
    [first] = s.delete_records(cluster, [(TOPIC, 0, FIRST_DELETE)])
    assert (first.error_code, first.low_watermark) == (0, FIRST_DELETE)

    published: list[int] = []
    redis = redis_lib.Redis.from_url(cluster.redis_url)
    events = LowWatermarkSubscriber(redis=redis, callback=lambda t, _p, lw: t == TOPIC and published.append(lw))
    events.start()
    watcher = SegmentWatcher(Path(cluster.service("replica-3").data_dir) / f"{TOPIC}-0", floor=SECOND_DELETE)
    cluster.pause("replica-3")
    try:
        move_to(cluster, (1, 2, 3))
        st = s.store(cluster).partition_state(TOPIC, 0)
        assert (st.replicas, st.adding_replicas, st.removing_replicas) == ((1, 2, 3, 0), (3,), (0,))
        # The leader counts broker 3 now (live, not heard from): its LW is unknown, not 300.
        s.wait_until(lambda: s.describe(cluster, 0, TOPIC).low_watermark == -1, what="the leader tracking broker 3")

        deleted: list[common_pb2.DeleteRecordsResult] = []
        done_at: list[float] = []
        deleting = threading.Thread(target=lambda: (
            deleted.extend(s.delete_records(cluster, [(TOPIC, 0, SECOND_DELETE)], timeout_ms=20_000)),
            done_at.append(time.monotonic())))
        deleting.start()
        s.wait_until(lambda: s.describe(cluster, 0, TOPIC).log_start_offset == SECOND_DELETE,
                     what="the leader's log start offset raised")
        time.sleep(1.0)  # broker 3 stays live throughout (session_timeout_ms above)
        assert deleting.is_alive(), f"acknowledged without broker 3: {deleted}"
    finally:
        resumed_at = time.monotonic()
        cluster.resume("replica-3")

    deleting.join(25)
    [second] = deleted
    assert (second.error_code, second.low_watermark) == (0, SECOND_DELETE)
    assert done_at[0] > resumed_at
    assert s.describe(cluster, 3, TOPIC).log_start_offset >= SECOND_DELETE

    s.wait_until(lambda: 3 in s.store(cluster).partition_state(TOPIC, 0).isr, what="broker 3 in the ISR")
    s.wait_until(lambda: settled_on(cluster, (1, 2, 3)), what="the move completed")
    watcher.stop()
    s.wait_until(lambda: published and published[-1] == SECOND_DELETE, what="the new LW published")
    events.close()
    redis.close()
    assert published and all(FIRST_DELETE <= lw <= SECOND_DELETE for lw in published), published
    assert watcher.looks > 100
    assert watcher.below == set(), "broker 3 wrote records below the leader's log start offset"
    assert s.segment_files(cluster, 3, TOPIC)[0] == SECOND_DELETE

    st = s.store(cluster).partition_state(TOPIC, 0)
    assert st.leader in (1, 2, 3) and st.adding_replicas == () and st.removing_replicas == ()
    s.wait_until(lambda: not (Path(cluster.service("replica-0").data_dir) / f"{TOPIC}-0").exists(),
                 what="broker 0's copy deleted")
    expected = [(o, v) for o, v in sorted(acked.items()) if o >= SECOND_DELETE]
    s.wait_until(lambda: s.read_all(cluster, TOPIC, start=SECOND_DELETE) == expected,
                 what="every acknowledged record read back from the new leader")
