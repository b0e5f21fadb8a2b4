"""Producer ids handed out in blocks, as Kafka's controller does (KIP-730, AllocateProducerIds).

One record in the cluster metadata (etcd, ``lowtide.metadata.sections``)::

    producer_ids/next    {"next": N}   the first id no process has claimed yet

A process claims a block of ``BLOCK_SIZE`` ids ``[N, N + BLOCK_SIZE)`` by a compare-and-set of that
record on its revision (another process that claimed meanwhile makes it fail: read again, retry),
and then serves ids from the block in memory; when the block is used up it claims the next one.
A block is claimed (committed by a majority of etcd's members) before any id of it is handed out,
so no id is handed out twice, by two processes or across restarts of any of them: what a process
had not handed out when it stopped is skipped, as in Kafka. Ids start at 1 (as Redis's ``INCR``
gave them before). Why not Redis: a Redis that forgot its counter (FLUSHALL, a lost volume) gave
the same ids again, and two idempotent producers with one id break each other's sequences.

When the store is away, or other processes keep winning the record for ``CLAIM_DEADLINE_S``, a
request needing a new block fails with COORDINATOR_LOAD_IN_PROGRESS (retriable), what Kafka's
InitProducerId answers while its next block has not arrived; ids left in the current block are
still served.

Thread-safety: thread-safe (one lock; a claim happens under it, one round trip per block).
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time

from lowtide.errors import CoordinatorLoadInProgress, MetadataStoreUnavailable
from lowtide.metadata.sections import section
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)

NEXT = "next"
BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
FIRST_PRODUCER_ID = 1
MAX_PRODUCER_ID = (1 << 63) - 1
CLAIM_DEADLINE_S = 5.0


def encode_next(next_id: int) -> bytes:
    """The value of ``producer_ids/next`` (also for a migration that carries an older counter)."""
    return json.dumps({"next": next_id}).encode()


def raise_floor(store: MetadataStore, first_free: int) -> bool:
    """Make sure no id below ``first_free`` is handed out from now on (``lowtide metadata migrate``
    carries the counter of the Redis that handed ids out before); True if the record moved."""
    ids = section(store, "producer_ids")
    for _ in range(20):
        entry = ids.get(NEXT, fresh=True)
        current = FIRST_PRODUCER_ID if entry is None else int(json.loads(entry.value)["next"])
        if current >= first_free:
            return False
        if ids.put(NEXT, encode_next(first_free), expect=entry):
            return True
    raise CoordinatorLoadInProgress("the producer-id record kept changing; retry")


class ProducerIdBlocks:
    """Producer ids from blocks claimed in the metadata store (module doc)."""

    def __init__(self, *, store: MetadataStore, block_size: int = BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be >= 1, got {block_size}")
        self._ids = section(store, "producer_ids")
        self._block_size = block_size
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0  # [next, end): what is left of this process's block

    def next_id(self) -> int:
        """A producer id no one was given before."""
        with self._lock:
            if self._next >= self._end:
                self._next, self._end = self._claim()
            pid = self._next
            self._next += 1
            return pid

    def _claim(self) -> tuple[int, int]:
        deadline = time.monotonic() + CLAIM_DEADLINE_S
        attempt = 0
        while True:
            try:
                entry = self._ids.get(NEXT, fresh=True)
                start = FIRST_PRODUCER_ID if entry is None else int(json.loads(entry.value)["next"])
                end = start + self._block_size
                if end > MAX_PRODUCER_ID:
                    raise CoordinatorLoadInProgress("producer ids are exhausted")
                # expect: unchanged since read (or still absent); False: another process claimed.
                if self._ids.put(NEXT, encode_next(end), expect=entry):
                    log.info("claimed producer ids [%d, %d)", start, end)
                    return start, end
                problem = "other processes kept claiming blocks"
            except MetadataStoreUnavailable as err:
                problem = err.message
            attempt += 1
            if time.monotonic() >= deadline:
                raise CoordinatorLoadInProgress(f"no block of producer ids could be claimed within "
                                                f"{CLAIM_DEADLINE_S:.0f} s: {problem}; retry")
            time.sleep(random.uniform(0, min(0.2, 0.005 * 2 ** attempt)))
