"""Partitions of one topic hosted on three brokers, each over a real PartitionLog in tmp_path.

``Replicas`` replicates the way the follower fetch path does, minus the network: the leader
records the follower's fetch offset and LSO (``update_follower``), reads from that offset, and
the follower applies the records with the leader's HW and LSO (``apply_fetched``), or restarts
at the leader's LSO when it asked for an offset the leader already deleted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_lib

from lowtide.errors import OffsetOutOfRange
from lowtide.log.partition_log import AppendInfo, LogConfig, PartitionLog
from lowtide.metadata.model import PartitionState, TopicInfo
from lowtide.purgatory import Purgatory
from lowtide.record import encode_batch
from lowtide.replica.partition import Partition
from lowtide.replica.registry import PartitionRegistry

TOPIC = "orders"
BROKERS = (0, 1, 2)
# Small segments, so deleting records also deletes whole segments.
SMALL_SEGMENTS = {"segment.bytes": "400"}


class Replicas:
    """A leader on broker 0 and followers on brokers 1 and 2 of partition 0 of ``topic``."""

    def __init__(self, *, tmp_path, topic: str, topic_config: dict[str, str], isr: tuple[int, ...]) -> None:
        self.topic = TopicInfo(name=topic, topic_id=f"{topic}-id", partitions=1, replication_factor=len(BROKERS),
                               config={**SMALL_SEGMENTS, **topic_config})
        self.state = PartitionState(topic=topic, partition=0, leader=0, leader_epoch=1, replicas=BROKERS, isr=isr)
        self.by_broker: dict[int, Partition] = {}
        for broker in BROKERS:
            plog = PartitionLog.open(tmp_path / f"broker-{broker}" / f"{topic}-0", topic=topic, partition=0,
                                     config=LogConfig.from_topic_config(self.topic.config))
            p = Partition(topic=self.topic, partition=0, log=plog, broker_id=broker)
            p.apply_state(self.state)
            self.by_broker[broker] = p

    @property
    def leader(self) -> Partition:
        return self.by_broker[self.state.leader]

    def follower(self, broker: int) -> Partition:
        return self.by_broker[broker]

    def produce(self, count: int = 5) -> AppendInfo:
        """One batch of ``count`` records appended on the leader (acks=1); keyed on a compacted
        topic, which refuses records without a key."""
        keys = [b"key-%d" % i for i in range(count)] if self.leader.log.config.compacts else None
        return self.leader.append_as_leader(encode_batch([b"value-%d" % i for i in range(count)], keys=keys),
                                            acks=1, min_insync_replicas=1)

    def fetch_once(self, broker: int) -> None:
        """One follower fetch round from the leader, without the network: first, if the follower
        has just started following, the OffsetForLeaderEpoch truncation step (KIP-279)."""
        follower, leader = self.by_broker[broker], self.leader
        self.truncate_by_epoch(broker)
        if follower.truncation_pending:
            return
        offset = follower.log.log_end_offset
        leader.update_follower(broker, fetch_offset=offset, log_start_offset=follower.log.log_start_offset)
        try:
            records = leader.log.read(offset, max_bytes=1 << 20, max_offset=leader.log.log_end_offset)
        except OffsetOutOfRange:
            follower.handle_out_of_range(leader_lso=leader.log.log_start_offset,
                                         leader_leo=leader.log.log_end_offset)
            return
        follower.apply_fetched(records=records, leader_hw=leader.log.high_watermark,
                               leader_lso=leader.log.log_start_offset, leader_epoch=leader.leader_epoch)

    def truncate_by_epoch(self, broker: int) -> None:
        """The follower's truncation step, as the fetcher runs it before fetching."""
        follower, leader = self.by_broker[broker], self.leader
        epoch = follower.epoch_to_query()
        if epoch is None:
            return
        answer_epoch, end = leader.end_offset_for_epoch(epoch, current_leader_epoch=follower.leader_epoch)
        follower.truncate_to_epoch_end(leader_epoch=answer_epoch, asked_epoch=epoch, end_offset=end,
                                       leader_epoch_now=follower.leader_epoch)

    def replicate(self, *brokers: int) -> None:
        """Fetch rounds of ``brokers`` (default: every follower) until one changes nothing: the
        leader's data, HW and LSO have reached them and their LEO and LSO have reached the leader."""
        for _ in range(50):
            before = self._positions()
            for broker in brokers or self.followers():
                self.fetch_once(broker)
            if self._positions() == before:
                return
        raise AssertionError("replication did not settle in 50 rounds")

    def _positions(self) -> tuple:
        logs = tuple((p.log.log_start_offset, p.log.high_watermark, p.log.log_end_offset)
                     for p in self.by_broker.values())
        reported = tuple((f.log_end_offset, f.log_start_offset) for f in self.leader.followers.values())
        return logs + reported

    def followers(self) -> list[int]:
        return [b for b in BROKERS if b != self.state.leader]

    def elect(self, leader: int, *, leader_epoch: int) -> None:
        """Apply a leadership change on every replica."""
        self.state = PartitionState(topic=self.topic.name, partition=0, leader=leader, leader_epoch=leader_epoch,
                                    replicas=BROKERS, isr=self.state.isr)
        for p in self.by_broker.values():
            p.apply_state(self.state)

    def shrink_isr(self, isr: tuple[int, ...]) -> None:
        """The leader adopts an ISR the metadata store accepted (as IsrUpdater.change does)."""
        self.state = PartitionState(topic=self.topic.name, partition=0, leader=self.state.leader,
                                    leader_epoch=self.state.leader_epoch, replicas=BROKERS, isr=isr,
                                    partition_epoch=self.state.partition_epoch + 1)
        self.leader.set_isr(self.state)

    def close(self) -> None:
        for p in self.by_broker.values():
            p.log.close()


@pytest.fixture
def make_replicas(tmp_path) -> Iterator:
    """Factory: ``make_replicas(topic=..., topic_config={...}, isr=(0, 1, 2))`` -> Replicas, closed
    after the test."""
    made: list[Replicas] = []

    def build(*, topic: str = TOPIC, topic_config: dict[str, str] | None = None,
              isr: tuple[int, ...] = BROKERS) -> Replicas:
        replicas = Replicas(tmp_path=tmp_path / f"set-{len(made)}", topic=topic, topic_config=topic_config or {},
                            isr=isr)
        made.append(replicas)
        return replicas

    yield build
    for replicas in made:
        replicas.close()


@pytest.fixture
def replicas(make_replicas) -> Replicas:
    """Leader 0, followers 1 and 2 all in the ISR, 20 records replicated everywhere (HW 20)."""
    r = make_replicas()
    for _ in range(4):
        r.produce(5)
    r.replicate()
    assert (r.leader.log.high_watermark, r.follower(1).log.high_watermark, r.follower(2).log.high_watermark) == (
        20, 20, 20)
    return r


def leader_registry(replicas) -> PartitionRegistry:
    """Broker 0's registry hosting the leader of ``replicas``; every broker live."""
    reg = PartitionRegistry(broker_id=0)
    reg.apply_assignment({replicas.leader.key: replicas.state}, open_partition=lambda tp: replicas.leader)
    reg.update_live_brokers(BROKERS)
    return reg


@pytest.fixture
def registry(replicas) -> PartitionRegistry:
    return leader_registry(replicas)


@pytest.fixture
def purgatory(redis_url) -> Iterator[Purgatory]:
    """A started DeleteRecords purgatory on the session's real Redis."""
    client = redis_lib.Redis.from_url(redis_url)
    p = Purgatory(name="DeleteRecords", redis=client, owner="replica-0")
    p.start()
    yield p
    p.close()
    client.close()
