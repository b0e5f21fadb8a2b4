"""A shard's request path leaves nothing for the cyclic garbage collector: every object a
CommitFile creates (its batches, results, record, waiter, group) is freed by reference counting
as soon as it is answered and applied. What the cyclic collector must find instead, it frees in
gen-1/gen-2 collections that hold the GIL for milliseconds (tens of them under load, ~350
objects per 100-batch file): every request in flight then waits, which is the CommitFile p99.

The shard runs in this test's process (so the test can ask the collector what it found) over a
real metadata log: ``__diskless_metadata-0`` on three real replica processes, a real redis-server
for the lease; no coordinator process competes for the shard (inproc.py).
"""

from __future__ import annotations

import gc

import pytest

from lowtide.errors import OutOfOrderSequenceNumber
from lowtide.record import encode_batch
from tests.integration.coordinator.inproc import commit_file, create_topic


def test_committed_files_leave_no_cyclic_garbage_in_the_shard(shard):
    topic_id = create_topic(shard, "garbage")
    for n in range(5):  # warm-up: connections, caches, the metadata partition
        commit_file(shard, topic_id, n)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage, to be looked at
    try:
        for n in range(5, 45):
            commit_file(shard, topic_id, n)
        # A read waits until every answered commit is applied: the groups are through the applier.
        assert shard.read(lambda core: core.state.count_batches()) == 45 * 100
        gc.collect()
        found = [o for o in gc.garbage if type(o).__module__.startswith("lowtide.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    kinds = sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in found})
    assert not found, f"{len(found)} lowtide objects were freed only by the cyclic collector: {kinds}"


def test_a_refused_conditional_append_leaves_no_cyclic_garbage(shard):
    """With two appends in flight the second is routinely refused (the first had not landed yet)
    and sent again: the refusal must not tie its traceback's frames, and the group they hold, into
    a cycle."""
    commit_file(shard, create_topic(shard, "refused"), 0)  # the metadata log is not empty: offset 0 is taken
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        with pytest.raises(OutOfOrderSequenceNumber):
            shard.log.append(encode_batch([b"never appended"], producer_id=1, producer_epoch=0), expected_end_offset=0)
        gc.collect()
        found = [o for o in gc.garbage if isinstance(o, BaseException) or type(o).__module__.startswith("lowtide.")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not found, f"freed only by the cyclic collector: {sorted({type(o).__qualname__ for o in found})}"
