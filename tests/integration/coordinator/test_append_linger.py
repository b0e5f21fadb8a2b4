"""The append linger (coordinator.pipeline.seconds_until_send) on a real shard: an idle shard
appends at once, a request close behind another waits the linger; requests that queue while an
append is in flight ride the next one together.

The shard runs in this test's process over a real metadata log on three real replica processes
and a real redis-server (inproc.py), so the test reads its append metrics directly."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import REGISTRY

from tests.integration.coordinator.inproc import commit_file, create_topic

LINGER_MS = 1_000


def appends() -> float:
    return REGISTRY.get_sample_value("lowtide_coordinator_append_decisions_count", {"shard": "0"}) or 0.0


@pytest.mark.parametrize("shard", [{"append_linger_ms": LINGER_MS}], indirect=True)
def test_a_lone_commit_is_appended_at_once_and_commits_queued_together_ride_one_append(
        shard, replicas_only):
    topic_id = create_topic(shard, "linger")
    # Nothing in flight and nothing queued within twice the linger before: the linger does not
    # apply. An append round trip is ~10 ms; under half the linger shows it even on a loaded machine.
    time.sleep(2 * LINGER_MS / 1000 + 0.05)
    began = time.monotonic()
    commit_file(shard, topic_id, 0)
    took = time.monotonic() - began
    assert took < LINGER_MS / 1000 / 2, took
    # Close behind the one before (a busy shard): it waits the linger for company.
    began = time.monotonic()
    commit_file(shard, topic_id, 1)
    assert time.monotonic() - began >= LINGER_MS / 1000 * 0.9

    before = appends()
    errors: list[BaseException] = []

    def commit(n: int) -> None:
        try:
            commit_file(shard, topic_id, n)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # The replicas stopped for 0.6 s hold the first append in flight (acks=all; it goes at once,
    # after a quiet spell) while 11 more commits queue: the second slot stays shut for the linger
    # (1 s), so the 11 go in one append. Without the linger one of them would take the second slot
    # at once.
    time.sleep(2 * LINGER_MS / 1000 + 0.05)
    threads = [threading.Thread(target=commit, args=(n,)) for n in range(2, 14)]
    replicas = [s.name for s in replicas_only.services("replica")]
    for name in replicas:
        replicas_only.pause(name)
    try:
        threads[0].start()
        time.sleep(0.2)  # the scenario: the first append goes out to the stopped replicas
        for t in threads[1:]:
            t.start()
        time.sleep(0.4)
    finally:
        for name in replicas:
            replicas_only.resume(name)
    for t in threads:
        t.join(60)
    assert not errors, errors[0]
    assert appends() - before == 2, appends() - before

    def high_watermark(core):
        return core.state.partition(topic_id, 0).high_watermark

    assert shard.read(high_watermark) == 14 * 5 * 10  # 14 files x 5 batches of partition 0 x 10 records
