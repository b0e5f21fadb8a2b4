"""Follower fetch sessions (KIP-227, lowtide/replica/fetch_session.py) against a real leader: a
session round answers only what changed, wakes on the one partition that changed, learns a new
log start offset at once, forgets what it was told to, refuses rounds out of turn in Kafka's
words; and the real followers, whose rounds now list nothing at rest, keep every ISR full past
``replica.lag.time.max.ms``.

The rounds here are sent as replica 7, which follows nothing: the leader keeps its session apart
from those of the real followers (one per replica id) and records no progress for it.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from lowtide.client.replica import ReplicaClient
from lowtide.errors import FetchSessionIdNotFound, InvalidFetchSessionEpoch
from lowtide.messages.replica import FetchPosition, FetchSessionRound
from lowtide.rpc.channels import ChannelPool
from tests.integration import support as s

PROBE = 7
WAIT_MS = 400


@pytest.fixture
def leader_client(shared_cluster):
    client = ReplicaClient(channels=ChannelPool())
    yield client
    client.channels.close()


def _round(client, address, positions, session, *, wait_ms=WAIT_MS):
    t = time.monotonic()
    fetched = client.fetch(address, positions, replica_id=PROBE, max_wait_ms=wait_ms, min_bytes=1,
                           deadline_s=10, session=session)
    return {(f.topic, f.partition): f for f in fetched}, time.monotonic() - t


def _positions(topic, offsets, *, epoch, lso=None):
    return [FetchPosition(topic=topic, partition=p, fetch_offset=o, log_start_offset=(lso or {}).get(p, 0),
                          current_leader_epoch=epoch) for p, o in offsets.items()]


def test_a_session_round_answers_only_the_partitions_that_changed(shared_cluster, leader_client):
    cluster = shared_cluster
    topic = "fs-changed"
    s.create_topic(cluster, topic, partitions=3, rf=3)
    store = s.store(cluster)
    s.wait_until(lambda: all(store.partition_state(topic, p).leader >= 0 for p in range(3)))
    # A session is with one leader: the partitions led by partition 0's.
    lid = store.partition_state(topic, 0).leader
    mine = [p for p in range(3) if store.partition_state(topic, p).leader == lid]
    epoch = store.partition_state(topic, 0).leader_epoch
    for p in mine:
        s.wait_until(lambda p=p: s.produce(cluster, topic, [b"a", b"b"], partition=p).error_code == 0)
    address = cluster.service(f"replica-{lid}").grpc
    sid = 4242

    # Open: every partition listed has records, so every one is answered, at once.
    got, _ = _round(leader_client, address, _positions(topic, dict.fromkeys(mine, 0), epoch=epoch),
                    FetchSessionRound(session_id=sid, epoch=1))
    assert sorted(got) == [(topic, p) for p in mine]
    assert all(f.records and f.error is None for f in got.values())
    ends = {p: got[(topic, p)].log_end_offset for p in mine}

    # Listed at their ends, nothing changed: the long poll runs out and nothing is answered.
    got, took = _round(leader_client, address, _positions(topic, ends, epoch=epoch),
                       FetchSessionRound(session_id=sid, epoch=2))
    assert got == {} and took >= WAIT_MS / 1000 * 0.8

    # A produce to one partition wakes the round, which lists nothing, and carries only that one.
    target = mine[-1]
    before = time.monotonic()

    def produce_later():
        time.sleep(0.1)
        assert s.produce(cluster, topic, [b"c"], partition=target, acks=1).error_code == 0

    producer = threading.Thread(target=produce_later)
    producer.start()
    got, _ = _round(leader_client, address, [], FetchSessionRound(session_id=sid, epoch=3), wait_ms=5000)
    producer.join()
    assert list(got) == [(topic, target)], got
    assert got[(topic, target)].records
    assert time.monotonic() - before < 4, "woken by the append, not by the end of the long poll"

    # The same epoch again, and a session the leader never opened: refused in Kafka's words.
    with pytest.raises(InvalidFetchSessionEpoch):
        _round(leader_client, address, [], FetchSessionRound(session_id=sid, epoch=3))
    with pytest.raises(FetchSessionIdNotFound):
        _round(leader_client, address, [], FetchSessionRound(session_id=sid + 1, epoch=4))


def test_a_session_learns_a_new_log_start_offset_at_once_and_forgets_what_it_is_told(shared_cluster,
                                                                                     leader_client):
    cluster = shared_cluster
    topic = "fs-lso"
    s.create_topic(cluster, topic, partitions=1, rf=3)
    s.wait_until(lambda: s.produce(cluster, topic, [b"r"] * 10).error_code == 0)
    store = s.store(cluster)
    lid, epoch = store.partition_state(topic, 0).leader, store.partition_state(topic, 0).leader_epoch
    address = cluster.service(f"replica-{lid}").grpc
    sid = 77
    got, _ = _round(leader_client, address, _positions(topic, {0: 10}, epoch=epoch),
                    FetchSessionRound(session_id=sid, epoch=1))
    assert got[(topic, 0)].high_watermark == 10 and got[(topic, 0)].log_start_offset == 0

    # The round parks with nothing listed; a DeleteRecords moves the leader's LSO past the
    # session's (0), which answers at once with the new one (KIP-107's fast path).
    deleter = threading.Thread(target=lambda: (time.sleep(0.2), s.delete_records(cluster, [(topic, 0, 4)])))
    deleter.start()
    got, took = _round(leader_client, address, [], FetchSessionRound(session_id=sid, epoch=2), wait_ms=8000)
    deleter.join()
    assert got[(topic, 0)].log_start_offset == 4, got
    assert took < 6

    # Forgotten: a later append to it is not answered.
    got, _ = _round(leader_client, address, [], FetchSessionRound(session_id=sid, epoch=3, forgotten=((topic, 0),)))
    assert s.produce(cluster, topic, [b"later"], acks=1).error_code == 0
    got, took = _round(leader_client, address, [], FetchSessionRound(session_id=sid, epoch=4))
    assert got == {} and took >= WAIT_MS / 1000 * 0.8


def test_followers_in_sessions_keep_every_isr_full_at_rest_past_the_lag_time(shared_cluster):
    cluster = shared_cluster  # replica.lag.time.max.ms = 3000 (conftest)
    topic = "fs-rest"
    s.create_topic(cluster, topic, partitions=4, rf=3)
    store = s.store(cluster)
    for p in range(4):
        s.wait_until(lambda p=p: s.produce(cluster, topic, [b"x"], partition=p).error_code == 0)
    s.wait_until(lambda: all(len(store.partition_state(topic, p).isr) == 3 for p in range(4)))
    epochs = {p: store.partition_state(topic, p).partition_epoch for p in range(4)}
    # Past the lag time plus one ISR check period (lag / 2) with nothing produced: a follower the
    # leader saw as lagging would be out of the ISR by now.
    time.sleep(5.0)
    for p in range(4):
        st = store.partition_state(topic, p)
        assert len(st.isr) == 3 and st.partition_epoch == epochs[p], (p, st)
    # ... and they still replicate: an acks=all produce to each is acknowledged by the full ISR.
    for p in range(4):
        assert s.produce(cluster, topic, [b"y"], partition=p, acks=-1).error_code == 0


def test_replicas_whose_sessions_lapse_while_paused_are_back_in_the_isrs_of_idle_partitions(cluster_factory):
    # A replica paused past its session is dropped from every ISR, often just as it resumes, while
    # its fetch sessions go on. The partitions, which do not move, are in none of its rounds: the
    # leader must still offer them to it again (fetch_session.py, IsrUpdater ``left_isr``). It
    # did not when etcd's watch made the reconciler adopt the shrink before the write's answer
    # did (the shrink then looked like a no-op): 3 of 3 runs of this loop stuck within 4 pauses.
    cluster = cluster_factory(session_timeout_ms=2000)
    topic = "fs-idle-isr"
    s.create_topic(cluster, topic, partitions=12, rf=3)
    store = s.store(cluster)
    for p in range(12):
        s.wait_until(lambda p=p: s.produce(cluster, topic, [b"x"] * 3, partition=p, acks=-1).error_code == 0,
                     timeout_s=30)

    def full() -> bool:
        return all(len(store.partition_state(topic, p).isr) == 3 for p in range(12))

    s.wait_until(full, timeout_s=30, what="full ISRs")
    rng = random.Random()
    dropped = 0
    for i in range(5):
        victim = f"replica-{rng.randrange(3)}"
        cluster.pause(victim)
        time.sleep(rng.uniform(1.9, 2.6))  # about the 2 s session: dropped as it resumes, often
        cluster.resume(victim)
        try:
            s.wait_until(lambda: not full(), timeout_s=5)
            dropped += 1
        except AssertionError:
            pass  # etcd kept the lease a little longer: this pause proves nothing, the next may
        s.wait_until(full, timeout_s=20,
                     what=f"pause {i}: {victim} back in the ISR of every partition (nothing was written)")
    assert dropped >= 2, f"only {dropped} of 5 pauses took a replica out of an ISR: the test proved little"
