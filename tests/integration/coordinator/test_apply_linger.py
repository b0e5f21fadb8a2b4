"""The apply linger (ShardPipeline._apply_loop) on a real shard: replicated groups wait for
company in one SQLite transaction, yet no answer waits for it (commits are answered when
replicated), a read that needs the apply ends it at once, and so does a barrier (a refused
commit, answered only once what it was checked against is applied).

The shard runs in this test's process over a real metadata log on three real replica processes
and a real redis-server (inproc.py), so the test reads its apply metrics directly."""

from __future__ import annotations

import time

import pytest
from prometheus_client import REGISTRY

from tests.integration.coordinator.inproc import commit_file, create_topic

LINGER_MS = 30_000
# Far above what two commits or a read take even on a loaded machine (an append round trip is
# ~10 ms), far below the linger: what took less did not wait the linger out.
PROMPT_S = 10.0


def applies() -> float:
    return REGISTRY.get_sample_value("lowtide_coordinator_apply_duration_seconds_count", {"shard": "0"}) or 0.0


def high_watermark(topic_id: bytes):
    return lambda core: core.state.partition(topic_id, 0).high_watermark


@pytest.mark.parametrize("shard", [{"apply_linger_ms": LINGER_MS}], indirect=True)
def test_commits_share_one_apply_and_a_read_or_a_duplicate_ends_the_linger_at_once(shard, replicas_only):
    topic_id = create_topic(shard, "apply-linger")
    assert shard.read(high_watermark(topic_id)) == 0  # applies the topic now: the count starts clean
    before = applies()

    began = time.monotonic()
    commit_file(shard, topic_id, 0)
    commit_file(shard, topic_id, 1)
    assert time.monotonic() - began < PROMPT_S, "a commit waited for its apply"
    assert applies() == before, "applied before the linger ended and before anyone read"

    began = time.monotonic()
    assert shard.read(high_watermark(topic_id)) == 2 * 5 * 10  # 2 files x 5 batches of partition 0 x 10 records
    assert time.monotonic() - began < PROMPT_S, "the read waited the linger out"
    assert applies() == before + 1, "two commits, one transaction"

    commit_file(shard, topic_id, 2)
    began = time.monotonic()
    with pytest.raises(AssertionError, match="is already committed"):
        commit_file(shard, topic_id, 2)  # the same object key again: refused, a barrier behind file 2
    assert time.monotonic() - began < PROMPT_S, "the refusal waited the linger out"
    assert applies() == before + 2
    assert shard.read(high_watermark(topic_id)) == 3 * 5 * 10
