"""Diskless coordinator micro benchmark (domain core only, no gRPC, no metadata log replication):
``python -m tests.bench.coordinator [--files N] [--partitions P] [--lookups L] [--dir DIR]``.

CommitFile: N files of 100 batches each (the batches spread over P partitions, half of them from
idempotent producers), each file checked against committed + pending state, its FileCommitted
record encoded, then applied to SQLite (WAL, synchronous=NORMAL) in its own transaction: the
per-file latency is check + encode + apply, batches/s is 100 * N over the total. FindBatches:
L lookups of one random partition from a random live offset with a 1 MiB partition budget
(batches of 40 KiB, as in a 4 MiB WAL file of 100 batches), reporting p50/p99. Brief §11 targets:
CommitFile >= 20,000 batches/s per shard and p99 <= 20 ms for a 100-batch file; FindBatches p99
<= 5 ms. Prints a JSON line; never asserts.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from lowtide.coordinator.core import CoordinatorCore
from lowtide.coordinator.records import encode_record
from lowtide.coordinator.state import CoordinatorState
from lowtide.messages.coordinator import (
    CommitBatch,
    CommitFileRequest,
    CreatablePartitions,
    CreatePartitionsRequest,
    FindBatchesPartition,
    FindBatchesRequest,
    FindBatchesTopic,
)

BATCHES_PER_FILE = 100
BATCH_BYTES = 40 * 1024


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(*, files: int, partitions: int, lookups: int, directory: Path) -> dict:
    state = CoordinatorState(directory / "bench.sqlite", coordinator_id=0)
    core = CoordinatorCore(state)
    offset = 0

    def apply(decision) -> None:
        nonlocal offset
        for record in decision.records:
            encode_record(record)
            core.apply(record, offset)
            offset += 1

    topic = uuid.uuid4().bytes
    apply(core.create_partitions(CreatePartitionsRequest(topics=[
        CreatablePartitions(topic_id=topic, name="bench", num_partitions=partitions)])))
    rng = random.Random(1)
    sequences: dict[tuple[int, int], int] = {}
    latencies = []
    started = time.perf_counter()
    for f in range(files):
        batches = []
        for i in range(BATCHES_PER_FILE):
            p = rng.randrange(partitions)
            records = 20
            idempotent = i % 2 == 0
            pid = p if idempotent else -1
            seq = sequences.get((p, pid), 0) if idempotent else -1
            if idempotent:
                sequences[(p, pid)] = seq + records
            batches.append(CommitBatch(
                magic=2, request_id=i, topic_id=topic, partition_index=p, byte_offset=i * BATCH_BYTES,
                size=BATCH_BYTES, base_offset=0, last_offset=records - 1, batch_max_timestamp=f,
                timestamp_type=0, producer_id=pid, producer_epoch=0 if idempotent else -1,
                base_sequence=seq, last_sequence=seq + records - 1 if idempotent else -1))
        request = CommitFileRequest(object_key=f"wal/{f:08d}", object_format=1,
                                    file_size=BATCHES_PER_FILE * BATCH_BYTES, owner_ids=[0], batches=batches)
        t0 = time.perf_counter()
        decision = core.commit_file(request)
        apply(decision)
        latencies.append(time.perf_counter() - t0)
        assert all(r.error_code == 0 for r in decision.response.batches)
    commit_seconds = time.perf_counter() - started

    find_latencies = []
    for _ in range(lookups):
        p = rng.randrange(partitions)
        row = state.partition(topic, p)
        start = rng.randrange(row.log_start_offset, row.high_watermark)
        request = FindBatchesRequest(fetch_max_bytes=50 * 1024 * 1024, max_batches_per_partition=1000, topics=[
            FindBatchesTopic(topic_id=topic, partitions=[FindBatchesPartition(
                partition_index=p, offset=start, max_partition_fetch_bytes=1024 * 1024)])])
        t0 = time.perf_counter()
        response = core.find_batches(request)
        find_latencies.append(time.perf_counter() - t0)
        assert response.topics[0].partitions[0].batches
    state.close()
    return {
        "commit_files": files,
        "commit_batches_per_s": round(files * BATCHES_PER_FILE / commit_seconds),
        "commit_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "commit_p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "find_batches_lookups": lookups,
        "find_batches_p50_ms": round(statistics.median(find_latencies) * 1000, 3),
        "find_batches_p99_ms": round(percentile(find_latencies, 0.99) * 1000, 3),
        "batches_in_state": files * BATCHES_PER_FILE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--lookups", type=int, default=5_000)
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite file goes (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        print(json.dumps(run(files=args.files, partitions=args.partitions, lookups=args.lookups,
                             directory=directory)))


if __name__ == "__main__":
    main()
