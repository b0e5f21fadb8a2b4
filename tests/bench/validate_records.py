"""Cost of the leader's batch validation, C record walker vs its pure-Python fallback.

``python -m tests.bench.validate_records [--seconds 1.0]``

In one process, no cluster: 1 MiB of 1-KiB-record batches (uncompressed, as the produce bench
sends them) cut into batches of 16 KiB, 256 KiB and 1 MiB, validated by ``validate_batches``
header-only (``verify_records=False``: what the leader did before the record walk), in full with
the C walker, and in full with the Python walker; then 1 MiB of 10-byte records, the worst case
for a per-record walk. Prints MB/s (10**6 bytes) and, for each, the share of one core a 45 MB/s
produce stream (a docs/testing.md#targets figure) would spend validating. Reports; never asserts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import lowtide.record.batch as batch_module
from lowtide.record import encode_batch, validate_batches
from lowtide.record.validate import walk_records_c, walk_records_py

MiB = 1 << 20
PRODUCE_MB_S = 45.0


def one_mib(record_size: int, batch_bytes: int) -> bytes:
    per_batch = max(1, batch_bytes // (record_size + 8))
    batches = []
    total = 0
    while total < MiB:
        raw = encode_batch([b"x" * record_size] * per_batch, timestamp_ms=1_700_000_000_000)
        batches.append(raw)
        total += len(raw)
    return b"".join(batches)


def rate(fn: Callable[[], object], nbytes: int, seconds: float) -> float:
    """MB/s of ``fn`` over ``nbytes``, best of 3 runs of ~``seconds``/3 each."""
    best = 0.0
    for _ in range(3):
        runs = 0
        began = time.perf_counter()
        while True:
            fn()
            runs += 1
            elapsed = time.perf_counter() - began
            if elapsed >= seconds / 3:
                break
        best = max(best, runs * nbytes / elapsed / 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = parser.parse_args()
    walkers = [("C", walk_records_c), ("Python", walk_records_py)] if walk_records_c else [("Python", walk_records_py)]
    print(f"{'input':<34} {'validation':<22} {'MB/s':>9} {'core share at 45 MB/s':>22}")
    for label, record_size, batch_bytes in [
        ("1 MiB, 1 KiB records, 16 KiB batches", 1024, 16 << 10),
        ("1 MiB, 1 KiB records, 256 KiB batches", 1024, 256 << 10),
        ("1 MiB, 1 KiB records, 1 MiB batch", 1024, MiB),
        ("1 MiB, 10 B records, 16 KiB batches", 10, 16 << 10),
    ]:
        buf = one_mib(record_size, batch_bytes)
        runs = [("header + CRC only", lambda b=buf: validate_batches(b, verify_records=False))]
        for name, walker in walkers:
            def full(b: bytes = buf, w=walker) -> None:
                batch_module.walk_records = w
                validate_batches(b)
            runs.append((f"full, {name} walker", full))
        saved = batch_module.walk_records
        try:
            for name, fn in runs:
                mb_s = rate(fn, len(buf), args.seconds)
                print(f"{label:<34} {name:<22} {mb_s:9.1f} {PRODUCE_MB_S / mb_s:21.2%}")
        finally:
            batch_module.walk_records = saved


if __name__ == "__main__":
    main()
