"""Kafka transactions on real processes (redis-server, replicas, front door as the transaction
coordinator): what read_committed and read_uncommitted consumers see, fencing, the last stable
offset across a kill -9 of the leader, and ``lowtide produce --transactional-id``."""

from __future__ import annotations

import json
import signal
import time

import pytest

from lowtide.client import Consumer, Producer
from lowtide.client.admin import OffsetSpec
from lowtide.errors import InvalidProducerEpoch, ProducerFenced
from tests.integration import support as s


def values_of(cluster, topic: str, *, isolation_level: str, partitions: int = 1, until: int | None = None,
              timeout_s: float = 10.0) -> list[bytes]:
    """Every value a consumer with ``isolation_level`` reads from the start: up to where ListOffsets
    (latest, at that isolation level: the last stable offset or the high watermark) says each
    partition ends, then one more poll (nothing past that end may come); with ``until``, waits for
    that many values instead. Not "until polls come back empty": on a loaded machine the first
    polls of a new consumer can be empty while it finds the leaders."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    with Consumer(cluster.bootstrap, isolation_level=isolation_level, max_wait_ms=200) as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        if until is None:
            answers = consumer.admin.list_offsets({tp: OffsetSpec.LATEST for tp in tps},
                                                  isolation_level=consumer.isolation_level)
            ends = {tp: a.offset for tp, a in answers.items() if a.error is None}
            assert set(ends) == set(tps), answers
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                assert time.monotonic() < deadline, f"read {got} by {timeout_s}s, not up to {ends}"
                got += [r.value for r in consumer.poll(max_wait_ms=300)]
            got += [r.value for r in consumer.poll(max_wait_ms=300)]
            return got
        while len(got) < until and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(max_wait_ms=300)]
    return got


@pytest.fixture(scope="module")
def txn_cluster(request, tmp_path_factory):
    from lowtide.localcluster.config import ClusterConfig
    from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("txn"), replicas=3,
                           replica_config=dict(DEFAULT_REPLICA_CONFIG))
    yield from running_cluster(request, config)


def test_a_committed_transaction_is_visible_to_read_committed_and_an_aborted_one_only_to_read_uncommitted(
        txn_cluster):
    cluster = txn_cluster
    s.create_topic(cluster, "orders", partitions=2, rf=3)
    with Producer(cluster.bootstrap, transactional_id="tx-orders") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.produce_values("orders", [b"c1", b"c2"], partition=0)
        producer.produce_values("orders", [b"c3"], partition=1)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.produce_values("orders", [b"a1", b"a2"], partition=0)
        producer.produce_values("orders", [b"a3"], partition=1)
        producer.abort_transaction()
    with Producer(cluster.bootstrap) as plain:
        plain.produce_values("orders", [b"after"], partition=0)

    committed = values_of(cluster, "orders", isolation_level="read_committed", partitions=2, until=4)
    assert sorted(committed) == [b"after", b"c1", b"c2", b"c3"]
    uncommitted = values_of(cluster, "orders", isolation_level="read_uncommitted", partitions=2, until=7)
    assert sorted(uncommitted) == [b"a1", b"a2", b"a3", b"after", b"c1", b"c2", b"c3"]  # markers are no records


def test_a_read_committed_consumer_stops_at_the_first_offset_of_an_ongoing_transaction(txn_cluster):
    cluster = txn_cluster
    s.create_topic(cluster, "pending", partitions=1, rf=3)
    with Producer(cluster.bootstrap) as plain, Producer(cluster.bootstrap, transactional_id="tx-pending") as tx:
        plain.produce_values("pending", [b"before"], partition=0)
        tx.init_transactions()
        tx.begin_transaction()
        tx.produce_values("pending", [b"t1"], partition=0)
        plain.produce_values("pending", [b"behind"], partition=0)  # after the open transaction's start

        assert values_of(cluster, "pending", isolation_level="read_committed") == [b"before"]
        assert sorted(values_of(cluster, "pending", isolation_level="read_uncommitted", until=3)) == [
            b"before", b"behind", b"t1"]
        leader = s.leader_of(cluster, "pending")
        with Consumer(cluster.bootstrap, isolation_level="read_committed") as c:
            c.assign([("pending", 0)])
            c.seek_to(-1)  # LATEST for read_committed: the last stable offset
            assert c.position(("pending", 0)) == 1
        assert s.describe(cluster, leader, "pending").high_watermark == 3

        tx.commit_transaction()
    assert values_of(cluster, "pending", isolation_level="read_committed", until=3) == [b"before", b"t1", b"behind"]


def test_a_fenced_producer_can_neither_produce_nor_commit(txn_cluster):
    cluster = txn_cluster
    s.create_topic(cluster, "fenced", partitions=1, rf=3)
    with Producer(cluster.bootstrap, transactional_id="tx-zombie") as old, \
            Producer(cluster.bootstrap, transactional_id="tx-zombie") as new:
        old.init_transactions()
        old.begin_transaction()
        old.produce_values("fenced", [b"zombie"], partition=0)
        new.init_transactions()  # bumps the epoch and aborts the old transaction
        with pytest.raises(InvalidProducerEpoch):
            old.produce_values("fenced", [b"zombie-2"], partition=0)
        with pytest.raises(ProducerFenced):
            old.commit_transaction()
        new.begin_transaction()
        new.produce_values("fenced", [b"fresh"], partition=0)
        new.commit_transaction()
    assert values_of(cluster, "fenced", isolation_level="read_committed", until=1) == [b"fresh"]
    assert sorted(values_of(cluster, "fenced", isolation_level="read_uncommitted", until=2)) == [b"fresh", b"zombie"]


def test_after_a_kill_of_the_leader_with_an_open_transaction_the_rebuilt_state_holds_the_last_stable_offset(
        txn_cluster):
    cluster = txn_cluster
    s.create_topic(cluster, "crash", partitions=1, rf=1)  # the leader is the only replica: it restarts as leader
    leader = s.leader_of(cluster, "crash")
    with Producer(cluster.bootstrap) as plain, Producer(cluster.bootstrap, transactional_id="tx-crash") as tx:
        plain.produce_values("crash", [b"before"], partition=0)
        tx.init_transactions()
        tx.begin_transaction()
        tx.produce_values("crash", [b"open"], partition=0)
        plain.produce_values("crash", [b"behind"], partition=0)

        cluster.kill(f"replica-{leader}", signal.SIGKILL)
        cluster.start_service(f"replica-{leader}")
        plain.produce_values("crash", [b"restarted"], partition=0)  # retried until the leader is back
        assert s.describe(cluster, leader, "crash").high_watermark == 4

        # The producer state came back from the batch headers: the transaction still holds readers.
        assert values_of(cluster, "crash", isolation_level="read_committed") == [b"before"]
        tx.commit_transaction()  # the coordinator writes the marker to the restarted leader
    assert values_of(cluster, "crash", isolation_level="read_committed", until=4) == [
        b"before", b"open", b"behind", b"restarted"]


def test_lowtide_produce_with_a_transactional_id_commits_the_run_or_aborts_it(txn_cluster):
    cluster = txn_cluster
    s.create_topic(cluster, "cli-tx", partitions=1, rf=3)
    common = ("--bootstrap-server", cluster.bootstrap, "--topic", "cli-tx")
    proc = s.lowtide_cli("produce", *common, "--transactional-id", "tx-cli", "--output", "json", stdin="one\ntwo\n")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["transaction"] == "committed"
    proc = s.lowtide_cli("produce", *common, "--transactional-id", "tx-cli", "--abort", "--output", "json",
                         stdin="gone\n")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    consume = s.lowtide_cli("consume", *common, "--isolation-level", "read_committed", "--timeout-ms", "1500")
    assert consume.returncode == 0, consume.stderr
    assert consume.stdout.split() == ["one", "two"]
    consume = s.lowtide_cli("consume", *common, "--isolation-level", "read_uncommitted", "--timeout-ms", "1500")
    assert consume.stdout.split() == ["one", "two", "gone"]


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(txn_cluster):
    cluster = txn_cluster
    s.create_topic(cluster, "slow", partitions=1, rf=3)
    with Producer(cluster.bootstrap, transactional_id="tx-slow", transaction_timeout_ms=1000) as tx:
        tx.init_transactions()
        tx.begin_transaction()
        tx.produce_values("slow", [b"late"], partition=0)
        leader = s.leader_of(cluster, "slow")
        s.wait_until(lambda: s.describe(cluster, leader, "slow").log_end_offset == 2, timeout_s=15,
                     what="the coordinator's abort marker")
        with pytest.raises((ProducerFenced, InvalidProducerEpoch)):
            tx.commit_transaction()
    assert values_of(cluster, "slow", isolation_level="read_committed") == []
