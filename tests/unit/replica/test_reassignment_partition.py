"""The replica side of a reassignment (KIP-455, docs/design/reassignment.md step 2) on real
partitions over real logs in tmp_path: a leader whose replica set changes under the same epoch
tracks the new followers and forgets removed ones; an adding follower's first fetch never lowers
the low watermark; a removed replica never gets back into the ISR; an ISR change under a stale
partition epoch changes nothing; a removed leader fails its parked acks=all produces.

The first tests drive ``Replicas`` (tests/unit/replica/conftest.py: the follower fetch path
minus the network) with a fourth replica on broker 3; the others run broker 0's real reconciler,
DeleteRecords purgatory (in Redis) and ISR updater against a real etcd (``store``)."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import redis as redis_lib

from lowtide.clock import now_ms
from lowtide.errors import NotLeaderOrFollower
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.messages.replica import FetchPosition
from lowtide.metadata.model import PartitionState
from lowtide.metadata.store import MetadataStore
from lowtide.purgatory import Purgatory
from lowtide.record import encode_batch
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.delete_records import DelayedDeleteRecords, DeleteRecordsHandler
from lowtide.replica.isr import IsrUpdater
from lowtide.replica.partition import FOLLOWER, REPLICAS_CHANGED, Partition
from lowtide.replica.reconcile import PartitionReconciler, ReconcileTrigger
from lowtide.replica.registry import PartitionRegistry
from lowtide.replica.requests import ReplicaRequests
from lowtide.rpc.steps import run_blocking
from tests.unit.replica.conftest import TOPIC, Replicas

TP = (TOPIC, 0)
FOUR_LIVE = frozenset({0, 1, 2, 3})


def open_replica(r: Replicas, *, broker: int, data_dir: Path) -> Partition:
    """Broker ``broker``'s replica of ``r``'s partition over the log in ``data_dir`` (opened at
    offset 0 when new, as the reconciler opens an adding replica), with ``r.state`` applied."""
    plog = PartitionLog.open(data_dir / f"{TOPIC}-0", topic=TOPIC, partition=0,
                             config=LogConfig.from_topic_config(r.topic.config))
    p = Partition(topic=r.topic, partition=0, log=plog, broker_id=broker)
    p.apply_state(r.state)
    r.by_broker[broker] = p  # closed with the others by the fixture
    return p


def move(r: Replicas, **fields) -> list[str | None]:
    """Write the next partition record (epoch + 1) with ``fields`` changed on every replica of
    ``r``; returns what each ``apply_state`` said, in broker order."""
    r.state = dataclasses.replace(r.state, partition_epoch=r.state.partition_epoch + 1, **fields)
    return [p.apply_state(r.state) for _, p in sorted(r.by_broker.items())]


def deleted_up_to_15(replicas: Replicas) -> None:
    """DeleteRecords(15) acknowledged on {0, 1, 2}: every replica's LSO is 15, and so is the LW."""
    replicas.leader.delete_records_before(15)
    replicas.replicate()
    assert replicas.leader.low_watermark(frozenset({0, 1, 2})) == 15


def test_a_leader_whose_replica_set_grows_under_the_same_epoch_tracks_the_adding_replica_and_the_lw_waits_for_it(
        replicas, tmp_path):
    deleted_up_to_15(replicas)

    outcomes = move(replicas, replicas=(0, 1, 2, 3), adding_replicas=(3,))
    assert outcomes == [REPLICAS_CHANGED, None, None]  # leader first; the followers just copy the record
    assert replicas.leader.leader_epoch == 1 and 3 in replicas.leader.followers
    # Broker 3 is live and not heard from: nothing may be acknowledged without it.
    assert replicas.leader.low_watermark(FOUR_LIVE) == -1

    adding = open_replica(replicas, broker=3, data_dir=tmp_path / "broker-3")
    assert adding.role == FOLLOWER
    replicas.replicate(3)

    assert adding.log.log_start_offset == 15 and adding.log.log_end_offset == 20
    assert replicas.leader.followers[3].log_start_offset == 15
    assert replicas.leader.low_watermark(FOUR_LIVE) == 15
    assert replicas.leader.isr_expansion_candidate(3) == {0, 1, 2, 3}


def test_the_adding_followers_out_of_range_first_fetch_never_dips_the_low_watermark(replicas, tmp_path):
    deleted_up_to_15(replicas)
    move(replicas, replicas=(0, 1, 2, 3), adding_replicas=(3,))
    registry = PartitionRegistry(broker_id=0)
    registry.apply_assignment({TP: replicas.state}, open_partition=lambda tp: replicas.leader)
    registry.update_live_brokers(FOUR_LIVE)
    # A DeleteRecords below the acknowledged LW, waiting while broker 3 positions itself: it must
    # never be answered with less than 15.
    op = DelayedDeleteRecords(registry=registry, required={TP: (10, 1)}, deadline_ms=now_ms() + 60_000)
    seen = []

    # Killed before its first answer: the fetch at 0 reached the leader, the answer did not come
    # back; the log reopens empty at 0 after the restart and fetches at 0 again.
    adding = open_replica(replicas, broker=3, data_dir=tmp_path / "broker-3")
    replicas.leader.update_follower(3, fetch_offset=0, log_start_offset=0)
    seen.append(replicas.leader.low_watermark(FOUR_LIVE))
    assert op.run_try_complete() is False
    adding.log.close()
    adding = open_replica(replicas, broker=3, data_dir=tmp_path / "broker-3")
    assert (adding.log.log_start_offset, adding.log.log_end_offset) == (0, 0)

    replicas.fetch_once(3)  # at 0: OFFSET_OUT_OF_RANGE, restarts empty at the leader's LSO
    seen.append(replicas.leader.low_watermark(FOUR_LIVE))
    assert op.run_try_complete() is False
    assert (adding.log.log_start_offset, adding.log.log_end_offset) == (15, 15)
    replicas.fetch_once(3)
    seen.append(replicas.leader.low_watermark(FOUR_LIVE))

    assert seen == [-1, -1, 15]
    assert op.run_try_complete() is True and op.results == {TP: 15}


def test_a_lagging_follower_overtaken_by_a_delete_counts_as_not_heard_from_until_it_restarts_at_the_lso(
        make_replicas):
    r = make_replicas(isr=(0, 1))
    r.produce(10)
    r.replicate()
    r.produce(10)
    r.replicate(1)  # follower 2 stays at 10
    r.leader.delete_records_before(15)
    r.replicate(1)
    assert r.leader.followers[2].log_start_offset == 0  # true until now: it holds 0..9

    r.fetch_once(2)  # at 10 < 15: about to restart at 15, whatever it holds goes

    assert r.leader.followers[2].log_start_offset == -1
    assert r.leader.low_watermark(frozenset({0, 1, 2})) == -1
    r.fetch_once(2)
    assert r.leader.low_watermark(frozenset({0, 1, 2})) == 15


def test_a_follower_back_from_the_dead_with_an_old_log_start_offset_never_lowers_the_low_watermark(replicas):
    # Broker 2 dies: it leaves the live set and the ISR, and the LW rises past it.
    replicas.shrink_isr((0, 1))
    replicas.leader.delete_records_before(15)
    replicas.replicate(1)
    assert replicas.leader.low_watermark(frozenset({0, 1})) == 15
    assert replicas.leader.followers[2].log_start_offset == 0  # what it said before it died

    # Back (live again) with its old log: it holds 0..14 until its first answer moves it up.
    assert replicas.leader.low_watermark(frozenset({0, 1, 2})) == -1
    replicas.fetch_once(2)  # it reports 0 once more, then adopts 15 from the answer
    assert replicas.leader.low_watermark(frozenset({0, 1, 2})) == -1
    replicas.fetch_once(2)
    assert replicas.leader.low_watermark(frozenset({0, 1, 2})) == 15

    # A new leadership starts afresh: nothing it acknowledged yet.
    replicas.elect(1, leader_epoch=2)
    replicas.replicate(0, 2)
    assert replicas.by_broker[1].low_watermark(frozenset({0, 1, 2})) == 15


def test_a_removed_replica_is_forgotten_and_never_put_back_into_the_isr(replicas):
    replicas.shrink_isr((0, 1))

    assert move(replicas, replicas=(0, 1), isr=(0, 1)) == [REPLICAS_CHANGED, None, None]
    assert set(replicas.leader.followers) == {1}
    # A fetch of broker 2's still in flight, at the leader's end: changes nothing.
    assert replicas.leader.update_follower(2, fetch_offset=20, log_start_offset=0) == (False, False)
    assert replicas.leader.isr_expansion_candidate(2) is None
    # Even one the leader still tracked (the record applied later than the fetch) stays out.
    replicas.leader.followers[2] = dataclasses.replace(replicas.leader.followers[1])
    assert replicas.leader.isr_expansion_candidate(2) is None


def test_an_older_record_than_the_one_applied_under_the_same_epoch_does_not_roll_the_isr_back(replicas):
    older = replicas.state
    replicas.shrink_isr((0, 1))

    assert replicas.leader.apply_state(older) is None
    assert replicas.leader.isr == {0, 1} and replicas.leader.partition_epoch == 1
    assert replicas.leader.set_isr(older) is False and replicas.leader.isr == {0, 1}


# -- broker 0's reconciler, DeleteRecords and ISR updater over a real etcd -------------------------


class Broker0:
    """Broker 0 of a topic in etcd: its real reconciler, registry, DeleteRecords handler (on a
    real purgatory) and ISR updater; the other brokers exist only as the fetches their followers
    would send (``report``). Published LWs land in ``published``, reconciler wake-ups count in
    ``wakes``."""

    def __init__(self, *, store: MetadataStore, redis: redis_lib.Redis, data_dir: Path) -> None:
        self.store = store
        self.registry = PartitionRegistry(broker_id=0)
        self.registry.update_live_brokers(FOUR_LIVE)
        self.purgatory = Purgatory(name="DeleteRecords", redis=redis, owner="replica-0")
        self.purgatory.start()
        self.published: list[tuple[tuple[str, int], int]] = []
        self.deletes = DeleteRecordsHandler(registry=self.registry, purgatory=self.purgatory,
                                            on_low_watermark_change=self.published.extend)
        self.wakes: list[int] = []
        self.isr = IsrUpdater(store=store, registry=self.registry, wake_reconciler=lambda: self.wakes.append(1))
        self.reconciler = PartitionReconciler(
            config=ReplicaConfig(broker_id=0, data_dir=data_dir), store=store, registry=self.registry,
            trigger=ReconcileTrigger(), saved_log_start_offsets={}, saved_high_watermarks={},
            complete_waiting_deletes=self.deletes.complete_ready, on_reconciled=lambda: None,
            report_low_watermarks=self.deletes.report_low_watermarks)
        self.requests = ReplicaRequests(registry=self.registry, isr=self.isr, deletes=self.deletes,
                                        min_insync_replicas=1)

    @property
    def leader(self) -> Partition:
        return self.registry.get(*TP)

    def write(self, **fields) -> PartitionState:
        """Write the stored record with ``fields`` changed (as a reassignment step does)."""
        cur = self.store.partition_state(*TP)
        assert self.store.compare_and_set_partition(cur, dataclasses.replace(cur, **fields))
        return self.store.partition_state(*TP)

    def produce(self, count: int) -> None:
        self.leader.append_as_leader(encode_batch([b"v"] * count), acks=1, min_insync_replicas=1)

    def report(self, broker: int) -> None:
        """Broker ``broker``'s follower fetch at the leader's end, fully caught up (LEO and LSO)."""
        log = self.leader.log
        run_blocking(self.requests._record_follower_fetch(broker, [  # the fetch path's own bookkeeping (steps)
            _position(fetch_offset=log.log_end_offset, log_start_offset=log.log_start_offset)]))

    def close(self) -> None:
        self.requests.stop()
        self.purgatory.close()
        self.registry.close_logs()


def _position(*, fetch_offset: int, log_start_offset: int) -> FetchPosition:
    return FetchPosition(topic=TOPIC, partition=0, fetch_offset=fetch_offset, log_start_offset=log_start_offset)


@pytest.fixture
def broker0(store, redis_url, tmp_path):
    store.create_topic(name=TOPIC, partitions=1, replication_factor=3, config={"segment.bytes": "400"},
                       assignment=[[0, 1, 2]])
    client = redis_lib.Redis.from_url(redis_url)
    b = Broker0(store=store, redis=client, data_dir=tmp_path / "broker-0")
    b.reconciler.reconcile()
    yield b
    b.close()
    client.close()


def test_a_shrink_drops_the_follower_state_and_a_parked_delete_records_completes_on_the_recheck(broker0):
    b = broker0
    b.write(replicas=(0, 1, 2, 3), adding_replicas=(3,))
    b.reconciler.reconcile()
    assert set(b.leader.followers) == {1, 2, 3}
    b.produce(20)
    b.report(1)
    b.report(2)
    assert b.leader.log.high_watermark == 20
    b.leader.delete_records_before(15)
    b.report(1)
    b.report(2)
    # Parked: broker 3 is live and has not fetched, so the LW is -1, which is never published.
    op = DelayedDeleteRecords(registry=b.registry, required={TP: (15, b.leader.leader_epoch)},
                              deadline_ms=now_ms() + 60_000)
    assert b.purgatory.try_complete_else_watch(op, [TP]) is False
    assert b.published == []

    b.write(replicas=(0, 1, 2), adding_replicas=())  # the move is cancelled: broker 3 is gone
    b.reconciler.reconcile()

    assert set(b.leader.followers) == {1, 2}
    assert op.wait(5) and op.results == {TP: 15}  # on the recheck, not at the deadline
    assert b.published == [(TP, 15)]


def test_an_isr_change_under_a_stale_partition_epoch_leaves_the_partition_unchanged_and_retries_after_reconciling(
        broker0):
    b = broker0
    assert b.isr.change(b.leader, {0, 1}) is False  # (the HW does not move: nothing produced)
    assert b.store.partition_state(*TP).isr == (0, 1) and b.leader.isr == {0, 1}
    moved = b.write(replicas=(0, 1, 2, 3), adding_replicas=(3,))  # behind the leader's back

    b.report(2)  # broker 2 caught up: the fetch path proposes ISR {0, 1, 2} under the old epoch
    assert b.wakes == [1]
    assert b.store.partition_state(*TP) == moved
    assert b.leader.isr == {0, 1} and b.leader.partition_epoch == moved.partition_epoch - 1

    b.reconciler.reconcile()
    b.report(2)  # the next fetch retries under the adopted epoch
    assert b.store.partition_state(*TP).isr == (0, 1, 2)
    assert b.leader.isr == {0, 1, 2} and b.wakes == [1]


def test_a_removed_leaders_parked_acks_all_produce_answers_not_leader_or_follower(broker0, tmp_path):
    b = broker0
    b.isr.change(b.leader, {0, 1})
    results: list = []
    producing = threading.Thread(target=lambda: results.extend(b.requests.produce(
        [(TOPIC, 0, encode_batch([b"x"]))], acks=-1, timeout_ms=20_000)))
    producing.start()
    # Wait until the append landed (parked on broker 1's fetch), then complete a move off broker 0
    # that moves leadership in the same write, as the controller's completion step does.
    for _ in range(200):
        if b.leader.log.log_end_offset == 1:
            break
        threading.Event().wait(0.01)
    cur = b.store.partition_state(*TP)
    b.write(replicas=(1, 2, 3), isr=(1,), leader=1, leader_epoch=cur.leader_epoch + 1)
    started = now_ms()
    b.reconciler.reconcile()
    producing.join(10)

    assert not producing.is_alive() and now_ms() - started < 5_000
    [(_, _, outcome)] = results
    assert isinstance(outcome, NotLeaderOrFollower)
    assert b.registry.find(*TP) is None
    assert not (tmp_path / "broker-0" / f"{TOPIC}-0").exists()


def test_a_topic_created_again_between_two_passes_is_opened_afresh_and_its_isr_changes_go_through(broker0):
    b = broker0
    b.produce(5)
    assert b.isr.change(b.leader, {0, 1}) is False and b.leader.partition_epoch == 1
    old_id = b.leader.topic_info.topic_id
    b.store.delete_topic(TOPIC)
    b.store.create_topic(name=TOPIC, partitions=1, replication_factor=3, config={"segment.bytes": "400"},
                         assignment=[[0, 1, 2]])

    b.reconciler.reconcile()  # the old topic's partition goes, with its log
    assert b.registry.find(*TP) is None and b.reconciler.trigger.forced
    b.reconciler.reconcile()  # the next (forced) pass opens the new one

    assert b.leader.topic_info.topic_id != old_id
    assert (b.leader.log.log_end_offset, b.leader.partition_epoch, b.leader.isr) == (0, 0, {0, 1, 2})
    b.isr.change(b.leader, {0, 2})
    assert b.store.partition_state(*TP).isr == (0, 2) and b.wakes == []
