"""The replica's periodic producer expiry pass (KIP-854) over the partitions it hosts."""

from __future__ import annotations

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
