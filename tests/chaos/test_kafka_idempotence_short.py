"""A 45-second fault run (longer, on a loaded machine, until two kills and two pauses happened) with
idempotent Kafka producers (issue 34, docs/design/idempotence.md): Kafka's own VerifiableProducer
and confluent-kafka, each with idempotence on and acks=all, produce through the Kafka listeners of
3 replicas (RF 3, min.insync.replicas=2) while leaders and followers are killed -9 and restarted,
and SIGSTOPped and resumed. Every partition is then read in full from offset 0: every
acknowledged value is there, at the offset it was acknowledged at, and no value is stored twice.

Before idempotence was enforced (be7470c~1) this run stored values twice through both clients (figures in
tests/chaos/RESULTS.md). The long run is ``make chaos-kafka`` (tests/chaos/kafka_idempotence.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tests.chaos.harness import redis_available
from tests.chaos.kafka_idempotence import CLIENTS, KafkaRunResult, run_kafka_idempotence
from tests.kafka_tools import kafka_tool

pytestmark = pytest.mark.integration

# Its first faults: kill -9 of a replica (each leads a partition), another, a leader SIGSTOPped while a
# follower is killed -9, a leader SIGSTOPped, ... (tests/chaos/nemesis.py draws them from the seed).
SEED = 25
MINUTES = 0.75


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> KafkaRunResult:
    if not redis_available():
        pytest.skip("redis-server is not installed (apt-get install redis-server; `make setup` does it)")
    tool = kafka_tool("kafka-verifiable-producer")  # skips naming `make kafka-tools` when missing
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed (make setup installs it)")
    run = run_kafka_idempotence(minutes=MINUTES, seed=SEED, data_dir=tmp_path_factory.mktemp("kafka-idem"),
                                tool=tool, enough=enough_faults)
    print(run.table())
    print("\n".join(run.fault_log))
    return run


def enough_faults(faults: Mapping[str, int]) -> bool:
    """At least two replicas killed and two paused (a leader SIGSTOPped with a follower killed is both)."""
    kills = faults.get("kill_restart", 0) + faults.get("leader_pause_follower_restart", 0)
    pauses = sum(faults.get(k, 0) for k in ("pause_resume", "pause_leader", "leader_pause_follower_restart"))
    return kills >= 2 and pauses >= 2


def test_leaders_and_followers_were_killed_and_paused_while_both_producers_were_acknowledged(result):
    assert not result.harness_errors, result.table()
    assert enough_faults(result.faults), f"too few faults (seed {SEED}): {result.faults}"
    for client in CLIENTS:
        assert len(result.producers[client].acked) >= 5000, result.table()


@pytest.mark.parametrize("client", CLIENTS)
def test_every_acknowledged_value_is_stored_once_at_its_acknowledged_offset(result, client):
    check = result.checks.get(client)
    assert check is not None, result.table()
    assert not check.duplicated, (f"{client}: {len(check.duplicated)} values stored twice or more "
                                  f"(seed {SEED}):\n{result.table()}")
    assert not check.lost, f"{client}: {len(check.lost)} acknowledged values lost:\n{result.table()}"
    assert not check.misplaced, f"{client}: acknowledged offsets hold other values:\n{result.table()}"
    assert not check.foreign, result.table()
