"""Partition reassignment under faults, on real processes (issue 31's must-show).

A partition moves from {0,1,2} to {1,2,3} while an acks=all producer writes and DeleteRecords
raise the low watermark; the leader (broker 0, which is being removed) is killed with SIGKILL in the
middle and restarted, and so is the adding replica (broker 3). Afterwards:

* the history (every acknowledged produce and delete, and a final read) passes the chaos checker
  (tests/chaos/checker.py): nothing acknowledged is lost or changed, no offset holds two records,
  nothing below an acknowledged low watermark is served, the LW never went down;
* the move finished: replicas {1,2,3}, nothing moving, every one of them in the ISR;
* on disk, no replica of {1,2,3} keeps a segment wholly below the low watermark, broker 3's log
  never started below the batch holding the leader's log start offset at the time it joined, and
  broker 0 holds no copy (its directory is gone).

The move is kept "in the middle" without relying on timing: broker 3 is down when it starts, so the
move cannot finish before broker 3 runs and catches up, and while it copies, a replication throttle
(KIP-73) below the produce rate keeps it from catching up until the throttle is lifted.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc

from lowtide.errors import NotLeaderOrFollower
from lowtide.record import encode_batch
from lowtide_pb import admin_pb2, common_pb2, replica_pb2
from tests.chaos.checker import FinalRead, History, check, decode_id, encode_value
from tests.integration import support as s

TOPIC = "moving"
BATCH = 40
PAD = 200


class AckedProducer:
    """acks=all batches to whoever leads now; every acknowledged batch goes into ``history``."""

    def __init__(self, cluster, history: History) -> None:
        self.cluster, self.history = cluster, history
        self.stop = threading.Event()
        self.sent = 0
        self.acked = 0
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> AckedProducer:
        self._thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self.stop.is_set():
            ids = [f"p{self.sent + i}" for i in range(BATCH)]
            self.sent += BATCH
            started = self.history.now()
            try:
                leader = s.leader_of(self.cluster, TOPIC)
                if leader < 0:
                    raise NotLeaderOrFollower("no leader")
                records = encode_batch([encode_value(i, pad=PAD) for i in ids])
                resp = s.replica(self.cluster, leader).Produce(replica_pb2.ProduceRequest(
                    acks=-1, timeout_ms=5000, partitions=[replica_pb2.ProducePartition(
                        topic=TOPIC, partition=0, records=records)]), timeout=10)
                r = resp.partitions[0]
                if r.error_code == 0:
                    self.history.produce_acked(TOPIC, 0, r.base_offset, ids, started=started)
                    self.acked += 1
                else:
                    self.history.error(f"produce:{r.error_code}")
                    time.sleep(0.05)
            except (grpc.RpcError, NotLeaderOrFollower) as exc:
                self.history.error(f"produce:{type(exc).__name__}")
                time.sleep(0.1)


def delete_half(cluster, history: History) -> int:
    """DeleteRecords at half the HW; returns the acknowledged LW (or -1 when it was not acknowledged)."""
    hw = s.describe(cluster, s.leader_of(cluster, TOPIC), TOPIC).high_watermark
    offset = max(history.low_watermark_floor(TOPIC, 0), hw // 2)
    started = history.delete_started(TOPIC, 0, offset)
    result = s.delete_records(cluster, [(TOPIC, 0, offset)], timeout_ms=15000)[0]
    if result.error_code != 0:
        history.error(f"delete:{result.error_code}")
        return -1
    history.delete_acked(TOPIC, 0, offset, result.low_watermark, started=started)
    return result.low_watermark


def final_read(cluster, history: History) -> FinalRead:
    leader = s.leader_of(cluster, TOPIC)
    info = s.describe(cluster, leader, TOPIC)
    records = tuple((o, decode_id(v)) for o, v in s.read_all(cluster, TOPIC, start=info.log_start_offset))
    return FinalRead(TOPIC, 0, info.log_start_offset, info.high_watermark, records, at=history.now())


def reassign(cluster, target: tuple[int, ...]) -> None:
    resp = s.admin(cluster).AlterPartitionReassignments(admin_pb2.AlterPartitionReassignmentsRequest(
        partitions=[admin_pb2.PartitionReassignment(topic=TOPIC, partition=0, replicas=list(target))]))
    assert resp.results[0].error_code == 0, resp


def throttle(cluster, rate: int | None) -> None:
    """Every broker's replication throttled to ``rate`` bytes/s for this topic (None: lifted)."""
    def op(key: str, value: str | None) -> admin_pb2.ConfigOp:
        return (admin_pb2.ConfigOp(key=key, op=admin_pb2.CONFIG_DELETE) if value is None
                else admin_pb2.ConfigOp(key=key, op=admin_pb2.CONFIG_SET, value=value))
    rate_value, replicas_value = (None, None) if rate is None else (str(rate), "*")
    resp = s.admin(cluster).AlterConfigs(admin_pb2.AlterConfigsRequest(resources=[
        admin_pb2.AlterConfigsResource(topic="broker:", ops=[
            op("leader.replication.throttled.rate", rate_value),
            op("follower.replication.throttled.rate", rate_value)]),
        admin_pb2.AlterConfigsResource(topic=TOPIC, ops=[
            op("leader.replication.throttled.replicas", replicas_value),
            op("follower.replication.throttled.replicas", replicas_value)])]))
    assert [r.error_code for r in resp.results] == [0, 0], resp


def partition_dir(cluster, broker_id: int) -> Path:
    return Path(cluster.service(f"replica-{broker_id}").data_dir) / f"{TOPIC}-0"


def segments_wholly_below(cluster, broker_id: int, low_watermark: int) -> list[int]:
    """Base offsets of segments that end at or below ``low_watermark`` (the next one starts there)."""
    bases = s.segment_files(cluster, broker_id, TOPIC)
    return [b for b, nxt in zip(bases, bases[1:], strict=False) if nxt <= low_watermark]


def test_a_partition_moves_to_new_replicas_under_load_with_the_leader_and_the_adding_replica_killed(cluster_factory):
    cluster = cluster_factory(replicas=4, coordinators=0, session_timeout_ms=3000)
    cluster.kill("replica-3", signal.SIGKILL)  # the new broker is down when the move starts
    s.wait_until(lambda: 3 not in s.store(cluster).live_broker_ids(), what="broker 3's session over")
    s.create_topic(cluster, TOPIC, partitions=1, rf=3)
    reassign(cluster, (0, 1, 2))  # a reorder (no copy): broker 0 is the preferred replica
    s.admin(cluster).ElectLeaders(admin_pb2.ElectLeadersRequest(
        election_type=0, partitions=[common_pb2.TopicPartition(topic=TOPIC, partition=0)]))
    s.wait_until(lambda: s.leader_of(cluster, TOPIC) == 0, what="broker 0 leading")

    history = History()
    producer = AckedProducer(cluster, history).start()
    s.wait_until(lambda: producer.acked >= 40, timeout_s=30, what="some batches acknowledged")
    assert delete_half(cluster, history) > 0

    reassign(cluster, (1, 2, 3))
    st = s.store(cluster).partition_state(TOPIC, 0)
    assert (st.replicas, st.adding_replicas, st.removing_replicas) == ((1, 2, 3, 0), (3,), (0,))

    # The leader, which the move removes, dies mid-move: a replica of the target takes over.
    cluster.kill("replica-0", signal.SIGKILL)
    s.wait_until(lambda: s.leader_of(cluster, TOPIC) in (1, 2), timeout_s=30, what="a new leader in the target")
    acked_before = producer.acked
    s.wait_until(lambda: producer.acked >= acked_before + 20, timeout_s=30, what="produce resumed")
    cluster.start_service("replica-0")
    assert delete_half(cluster, history) > 0  # broker 3 is down and out of the ISR: it does not hold this up

    # The adding replica starts, copies from the leader's log start offset (throttled below the
    # produce rate, so it cannot catch up), and dies mid-copy.
    throttle(cluster, 200_000)
    lso_when_joining = s.describe(cluster, s.leader_of(cluster, TOPIC), TOPIC).log_start_offset
    cluster.start_service("replica-3")
    s.wait_until(lambda: s.describe(cluster, 3, TOPIC).log_end_offset > lso_when_joining + 2 * BATCH, timeout_s=30,
                 what="broker 3 copying")
    # Its log starts at the leader's LSO; when the LSO falls inside a batch, the file starts at that
    # batch's base offset (batches are written whole, as on the leader, and as Kafka's followers
    # do), while the LSO it keeps and reports is the leader's.
    first_base_on_3 = s.segment_files(cluster, 3, TOPIC)[0]
    assert first_base_on_3 > lso_when_joining - BATCH, "broker 3 wrote records below the leader's log start offset"
    assert s.describe(cluster, 3, TOPIC).log_start_offset >= lso_when_joining
    st = s.store(cluster).partition_state(TOPIC, 0)
    assert st.reassigning and 3 not in st.isr, f"the copy was to be under way: {st}"
    cluster.kill("replica-3", signal.SIGKILL)
    assert delete_half(cluster, history) > 0
    cluster.start_service("replica-3")
    s.wait_until(lambda: s.describe(cluster, 3, TOPIC).log_end_offset > 0, what="broker 3 copying again")
    assert s.store(cluster).partition_state(TOPIC, 0).reassigning
    assert delete_half(cluster, history) > 0  # with 3 live again, this waits for its LSO too
    throttle(cluster, None)

    def finished() -> bool:
        st = s.store(cluster).partition_state(TOPIC, 0)
        return st.replicas == (1, 2, 3) and not st.reassigning and set(st.isr) == {1, 2, 3}

    s.wait_until(finished, timeout_s=60, what="the move finished with a full ISR")
    acked_before = producer.acked
    s.wait_until(lambda: producer.acked >= acked_before + 20, timeout_s=30, what="produce after the move")
    lw = delete_half(cluster, history)
    assert lw > 0
    producer.join()

    history.final(final_read(cluster, history))
    violations = check(history)
    assert violations == [], "\n".join(map(str, violations[:20]))
    final = history.finals[(TOPIC, 0)]
    acked_ids = {i for a in history.produces for i in a.ids}
    assert len(acked_ids) >= 40 * BATCH
    assert final.log_start_offset >= lw

    # On disk: broker 0 deleted its copy; nobody keeps a segment wholly below the LW.
    s.wait_until(lambda: not partition_dir(cluster, 0).exists(), what="broker 0's copy deleted")
    for b in (1, 2, 3):
        s.wait_until(lambda b=b: s.describe(cluster, b, TOPIC).log_start_offset >= lw,
                     what=f"broker {b} at the low watermark")
        s.wait_until(lambda b=b: segments_wholly_below(cluster, b, lw) == [],
                     what=f"broker {b} without segments below the low watermark")
