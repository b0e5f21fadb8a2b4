"""The replica's periodic producer expiry pass (KIP-854) over the partitions it hosts."""

from __future__ import annotations

import threading

from lowtide.clock import now_ms
from lowtide.record import encode_batch
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.housekeeping import Housekeeping


def test_the_expiry_pass_forgets_idle_producers_of_every_hosted_partition(replicas, registry, tmp_path):
    now = now_ms()
    log = replicas.leader.log
    for pid, ts in ((1, now - 2 * 24 * 3600 * 1000), (2, now)):
        log.append_as_leader(encode_batch([b"v"], timestamp_ms=ts, producer_id=pid, producer_epoch=0,
                                          base_sequence=0), leader_epoch=log.latest_epoch)
    housekeeping = Housekeeping(config=ReplicaConfig(broker_id=0, data_dir=tmp_path), registry=registry,
                                isr=None, checkpoints=None, clock=lambda: now)
    assert housekeeping.config.producer_id_expiration_check_interval_ms == 600000  # Kafka's 10 minutes
    assert housekeeping.expire_producers() == 1
    assert log.producer_last_records().keys() == {2}


def test_a_woken_retention_pass_runs_without_waiting_for_the_interval(replicas, registry, tmp_path):
    passes = threading.Event()

    def clock() -> int:  # the retention pass reads the clock for each led partition
        passes.set()
        return now_ms()

    housekeeping = Housekeeping(config=ReplicaConfig(broker_id=0, data_dir=tmp_path,
                                                     retention_check_interval_ms=3_600_000),
                                registry=registry, isr=None, checkpoints=None, clock=clock)
    loop = threading.Thread(target=housekeeping._run_retention, daemon=True)  # only the retention loop
    loop.start()
    try:
        assert not passes.wait(0.3)  # an hour's interval: no pass on its own
        housekeeping.wake_retention()
        assert passes.wait(10), "a woken retention pass did not run"
    finally:
        housekeeping.stop()
        loop.join(5)
    assert not loop.is_alive()
