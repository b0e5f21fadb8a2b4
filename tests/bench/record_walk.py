"""Cost of one 16 KiB batch through each user of the record walker, C and forced pure Python.

``python -m tests.bench.record_walk [--seconds 0.5] [--only c|python]``

In one process, no cluster. One batch of ~100-byte records (keys ``key-N``, values of random-looking
bytes so lz4/zstd do not shrink it to nothing, every 10th record with a header) filling 16 KiB before
compression, built uncompressed and with each of lz4 and zstd that is installed. For each it times:

    validate   validate_batches(batch): the leader's produce check (CRC, inflate, record walk)
    columns    columnize(batch): the Spark source's and the cleaner's records -> columns
    filter     ChunkRows.of + BatchFilter.filter with every other key superseded, so the batch is
               rewritten (rewrite_batch walks its records): the cleaner's per-chunk work
    parse      decode_batch(batch): the client side's batch -> Record objects

"c" is what the process uses when the extensions are built; "python" forces every pure-Python
twin the module-level switches know of (see ``_force_python``). Prints the best of several runs in
microseconds per batch. Reports; never asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import time
from collections.abc import Callable, Iterator

import lowtide.log.cleaner.batch_filter as batch_filter
import lowtide.record.batch as batch_module
import lowtide.record.columns as columns_module
import lowtide.record.control as control_module
import lowtide.record.validate as validate_module
from lowtide.log.cleaner.batch_filter import BatchFilter, ChunkRows, OffsetMap
from lowtide.record import BatchBuilder, Compression, decode_batch, iter_batches, validate_batches
from lowtide.record.columns import columnize
from lowtide.record.compression import SUPPORTED

BATCH_BYTES = 16 << 10
RECORD_BYTES = 100


def make_batch(compression: Compression) -> bytes:
    rng = random.Random(7)
    builder = BatchBuilder(compression=compression, base_offset=1000)
    i = 0
    while builder.size_estimate < BATCH_BYTES - RECORD_BYTES:
        key = b"key-%d" % i
        # Half random, half repeated: compresses somewhat, like real payloads.
        value = rng.randbytes(40) + b"v" * (RECORD_BYTES - 40 - len(key) - 8)
        headers = [("trace", b"abc")] if i % 10 == 0 else []
        builder.append(timestamp_ms=1_700_000_000_000 + i, key=key, value=value, headers=headers)
        i += 1
    return builder.build()


@contextlib.contextmanager
def _force_python() -> Iterator[None]:
    """Point every switch between a C kernel and its Python twin at the twin, then restore."""
    saved: list[tuple[object, str, object]] = []

    def swap(module: object, name: str, value: object) -> None:
        if hasattr(module, name):
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, value)

    swap(batch_module, "walk_records", validate_module.walk_records_py)
    swap(columns_module, "KERNELS", columns_module.PYTHON_KERNELS)
    record_fields_py = getattr(validate_module, "record_fields_py", None)
    if record_fields_py is not None:
        for module in (batch_module, batch_filter, control_module):
            swap(module, "record_fields", record_fields_py)
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def best_us(fn: Callable[[], object], seconds: float) -> float:
    """Best time of one call in microseconds, over runs of ~``seconds``/5 each (min: least noise)."""
    fn()
    best = float("inf")
    for _ in range(5):
        runs = 0
        began = time.perf_counter()
        while True:
            fn()
            runs += 1
            elapsed = time.perf_counter() - began
            if elapsed >= seconds / 5:
                break
        best = min(best, elapsed / runs * 1e6)
    return best


def cases(raw: bytes) -> dict[str, Callable[[], object]]:
    view = memoryview(raw)
    batches = list(iter_batches(view))
    rows = ChunkRows.of(view)
    # Every other key superseded by a later write: the batch loses records and is rewritten.
    superseded = OffsetMap(max_bytes=1 << 30)
    for i in range(0, rows.count, 2):
        superseded._map[rows.keys[i]] = 1 << 40

    def run_filter() -> object:
        chunk_rows = ChunkRows.of(view)
        out = BatchFilter(superseded, now_ms=1_800_000_000_000, delete_retention_ms=1000).filter(
            view, batches, chunk_rows)
        assert out.stats.batches_rewritten == 1
        return out

    return {
        "validate": lambda: validate_batches(raw),
        "columns": lambda: columnize(view, min_offset=0, max_offset=1 << 62, with_headers=True),
        "filter": run_filter,
        "parse": lambda: decode_batch(raw),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per measurement")
    parser.add_argument("--only", choices=["c", "python"], help="measure one side only")
    args = parser.parse_args()
    codecs = [c for c in (Compression.NONE, Compression.LZ4, Compression.ZSTD) if c in SUPPORTED]
    print(f"walker: validate={validate_module.WALKER} columns={columns_module.KERNELS.name}; "
          f"one batch of {BATCH_BYTES // 1024} KiB, ~{RECORD_BYTES}-byte records; us per batch (best)")
    print(f"{'codec':6} {'records':>7} {'op':9} {'c':>9} {'python':>9}")
    for codec in codecs:
        raw = make_batch(codec)
        count = decode_batch(raw)[0].record_count
        for name, fn in cases(raw).items():
            c_us = best_us(fn, args.seconds) if args.only != "python" else float("nan")
            py_us = float("nan")
            if args.only != "c":
                with _force_python():
                    py_us = best_us(fn, args.seconds)
            print(f"{codec.name.lower():6} {count:7d} {name:9} {c_us:9.1f} {py_us:9.1f}", flush=True)


if __name__ == "__main__":
    main()
