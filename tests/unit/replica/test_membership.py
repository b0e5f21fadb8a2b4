"""lowtide.replica.membership on a real etcd: the session outlives a slow live-brokers callback."""

from __future__ import annotations

import threading
import time

from lowtide.metadata.model import BrokerInfo
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.membership import BrokerMembership
from lowtide.replica.registry import PartitionRegistry
from tests.waiting import wait_until


def test_a_live_brokers_callback_slower_than_the_session_does_not_end_our_session(metadata_store, tmp_path):
    released = threading.Event()
    calls: list[str] = []

    def slow_callback() -> None:  # the ISR of thousands of partitions, under load
        calls.append(threading.current_thread().name)
        released.wait(timeout=30)

    config = ReplicaConfig(broker_id=0, data_dir=tmp_path, session_timeout_ms=2000, heartbeat_interval_ms=300)
    membership = BrokerMembership(config=config, store=metadata_store, registry=PartitionRegistry(broker_id=0),
                                  on_live_brokers_changed=slow_callback, on_metadata_changed=lambda: None)
    membership.register()
    membership.start()
    try:
        metadata_store.register_broker(BrokerInfo(id=1, host="127.0.0.1", port=1), incarnation="other",
                                       session_timeout_ms=30000)
        wait_until(lambda: calls, timeout_s=10, what="the live-brokers callback to start")
        deadline = time.monotonic() + 5.0  # 2.5 sessions while the callback still runs
        while time.monotonic() < deadline:
            assert 0 in metadata_store.live_broker_ids(), "our session lapsed while the callback ran"
            time.sleep(0.1)
        # Neither on the heartbeat thread nor on the metadata watch's listener thread.
        assert calls == ["live-brokers"]
    finally:
        released.set()
        membership.stop()
        membership.unregister()
