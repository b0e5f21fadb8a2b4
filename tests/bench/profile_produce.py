"""Profile the replicas under a produce load: where replica CPU goes per produced MiB.

``python -m tests.bench.profile_produce [--seconds 15] [--acks -1] [--batch-kib 256] [--out DIR]``

Starts a local cluster (3 replicas), creates an RF 3 topic of 3 partitions (each replica leads one
and follows two), runs the raw produce load of ``tests.bench.produce`` from worker processes, and
samples every replica process with py-spy (``py-spy record --format raw``: collapsed stacks of
threads that are running, idle threads excluded) for the same window. Samples are summed over the
three replicas and divided by the MiB acknowledged in the window, so the table reads "replica CPU
milliseconds per produced MiB" by function: self time (the function was the leaf frame) and
inclusive time (anywhere on the stack). Writes ``PROFILE.md`` (default next to this file) and the
raw collapsed stacks next to it under ``out/``.

Needs py-spy (``pip install py-spy``; it attaches with ptrace, so root or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.bench import workers
from tests.bench.common import KiB, MiB, build_batch, running_cluster, say

BENCH_DIR = Path(__file__).resolve().parent
RATE_HZ = 200


def _py_spy() -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")
    return exe


def _parse(path: Path) -> tuple[collections.Counter, collections.Counter, int]:
    """Self and inclusive sample counts per frame from a py-spy raw (collapsed) file."""
    self_c: collections.Counter = collections.Counter()
    incl_c: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    return self_c, incl_c, total


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``func (module.py)``: one row per function, not per line."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    file = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "services/", "lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{name} ({file})"


AREAS = (("lowtide/log/", "lowtide/log (segments, records)"), ("lowtide/", "lowtide services (replica, purgatory)"),
         ("grpc", "gRPC runtime"), ("redis/", "Redis client"), ("threading.py", "threads (Condition/locks)"),
         ("concurrent/", "threads (executor)"))


def _areas(self_c: collections.Counter) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for frame, n in self_c.items():
        out[next((label for marker, label in AREAS if marker in frame), "other")] += n
    return out


@contextmanager
def produce_load(*, name: str, batch_kib: int, acks: int, processes: int, threads: int,
                 seconds: float) -> Iterator[tuple[Any, list[Future]]]:
    """A local cluster (3 replicas) under the raw produce load of an RF 3 topic of 3 partitions
    (each replica leads one and follows two): yields (the cluster, the producer workers' futures)
    once their 2 s warm-up is over, so the caller samples the window and collects the futures
    inside the block. The cluster, its data and the worker processes go when the block ends."""
    data_dir = (BENCH_DIR / "out" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    pool = ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn"))
    try:
        for f in [pool.submit(workers.noop) for _ in range(processes)]:
            f.result(timeout=120)
        with running_cluster(data_dir / "cluster") as bench:
            topic = f"bench-{name}"
            bench.create_topic(topic, 3, 3)
            leaders = bench.leaders(topic)
            batch, count = build_batch(batch_kib * KiB)
            targets = [(leaders[p], topic, p) for p in sorted(leaders)]
            warmup = 2.0
            start_at = time.time() + 0.5
            specs = [{"targets": targets[k:] + targets[:k], "batch": batch, "records_per_batch": count,
                      "acks": acks, "threads": threads, "start_at": start_at, "warmup_s": warmup,
                      "duration_s": seconds} for k in range(processes)]
            futures = [pool.submit(workers.produce_raw, s) for s in specs]
            time.sleep(max(0.0, start_at + warmup - time.time()))
            yield bench, futures
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(data_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.profile_produce", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--acks", type=int, default=-1)
    parser.add_argument("--batch-kib", type=int, default=256)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    py_spy = _py_spy()
    raw_dir = BENCH_DIR / "out" / "profile"
    raw_dir.mkdir(parents=True, exist_ok=True)
    with produce_load(name="profile", batch_kib=args.batch_kib, acks=args.acks, processes=args.processes,
                      threads=args.threads, seconds=args.seconds) as (bench, futures):
        spies = []
        for name, entry in sorted((s.name, s) for s in bench.replicas.values()):
            path = raw_dir / f"{name}.txt"
            spies.append((name, path, subprocess.Popen(
                [py_spy, "record", "--pid", str(entry.pid), "--rate", str(RATE_HZ), "--format", "raw",
                 "--duration", str(int(args.seconds)), "--output", str(path), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
        say(f"profiling {len(spies)} replicas for {args.seconds:.0f}s under produce load "
            f"(acks={args.acks}, {args.batch_kib} KiB batches)")
        results = [f.result(timeout=args.seconds + 120) for f in futures]
        for name, _path, proc in spies:
            _out, err = proc.communicate(timeout=60)
            if proc.returncode:
                say(f"py-spy on {name} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    produced = sum(r["bytes"] for r in results)
    mib = produced / MiB
    self_c: collections.Counter = collections.Counter()
    incl_c: collections.Counter = collections.Counter()
    total = 0
    per_replica = {}
    for name, path, _proc in spies:
        if not path.exists():
            continue
        s, i, t = _parse(path)
        self_c += s
        incl_c += i
        total += t
        per_replica[name] = t
    ms_per_sample = 1000.0 / RATE_HZ
    write_profile(args, produced, total, per_replica, self_c, incl_c, ms_per_sample)
    say(f"produced {mib:.0f} MiB; {total} samples; wrote {args.out / 'PROFILE.md'}")
    return 0


def write_profile(args: argparse.Namespace, produced: int, total: int, per_replica: dict[str, int],
                  self_c: collections.Counter, incl_c: collections.Counter, ms_per_sample: float) -> None:
    mib = max(produced / MiB, 1e-9)
    cpu_ms = total * ms_per_sample
    rows = [
        "# Where replica time goes per produced MiB",
        "",
        f"`python -m tests.bench.profile_produce --seconds {args.seconds:g} --acks {args.acks} "
        f"--batch-kib {args.batch_kib}` — {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        f"RF 3 topic, 3 partitions (each replica leads one, follows two), raw `Replica.Produce` of "
        f"{args.batch_kib} KiB RecordBatch v2 batches of 1 KiB records, acks={args.acks}, "
        f"{args.processes} producer processes x {args.threads} threads. py-spy sampled all three replica "
        f"processes at {RATE_HZ} Hz for {args.seconds:g} s (running threads only; threads waiting on a "
        "lock, a condition or the network are not counted).",
        "",
        f"* produced in the window: **{produced / 1e6:.0f} MB** ({produced / 1e6 / args.seconds:.1f} MB/s)",
        f"* replica CPU (all threads, 3 replicas): **{cpu_ms / 1000:.1f} s** "
        f"= **{cpu_ms / mib:.1f} ms per produced MiB** "
        f"({', '.join(f'{n}: {c * ms_per_sample / 1000:.1f} s' for n, c in sorted(per_replica.items()))})",
        "",
        "## Self time by area per produced MiB",
        "",
        "| area | ms / MiB | share |",
        "|---|---|---|",
        *[f"| {area} | {n * ms_per_sample / mib:.2f} | {n / max(total, 1):.1%} |"
          for area, n in _areas(self_c).most_common()],
        "",
        "`lowtide/log` + `lowtide/replica` is the produce/replicate path itself (per batch: header "
        "`struct`, C CRC-32C, offset rewrite, file write); the rest is the gRPC runtime, Redis calls and "
        "thread hand-offs (a `Condition.wait` leaf is a thread being woken and going back to wait).",
        "",
        "## Self time (leaf frame) per produced MiB",
        "",
        "| function | ms / MiB | share |",
        "|---|---|---|",
    ]
    for frame, n in self_c.most_common(args.top):
        rows.append(f"| `{frame}` | {n * ms_per_sample / mib:.2f} | {n / max(total, 1):.1%} |")
    rows += ["", "## Inclusive time (on the stack) per produced MiB", "", "| function | ms / MiB | share |",
             "|---|---|---|"]
    for frame, n in incl_c.most_common(args.top + 15):
        rows.append(f"| `{frame}` | {n * ms_per_sample / mib:.2f} | {n / max(total, 1):.1%} |")
    rows += ["", "Raw collapsed stacks: `tests/bench/out/profile/replica-N.txt` (open in speedscope.app).", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "PROFILE.md").write_text("\n".join(rows))


if __name__ == "__main__":
    sys.exit(main())
