"""Where replica CPU goes per produced MiB, kernel included: ``perf`` on the three replicas.

``python -m tests.bench.profile_perf [--seconds 10] [--batch-kib 1024] [--out DIR]``

The load of ``tests.bench.profile_produce.produce_load`` (RF 3 topic of 3 partitions, raw
``Replica.Produce`` of pre-built batches, acks=all, 3 producer processes x 4 threads), but sampled
with ``perf record -p <replicas>`` (on-CPU samples of every thread, native and kernel frames) and
``/proc/PID/stat`` user/system time over the same window. py-spy sees Python frames only, and
under this load most replica CPU is in the kernel and in C memory copies, which it files under
whichever Python line called them. Writes ``PROFILE-perf.md`` (default next to this file): CPU
per produced MiB by replica (user/system), by area (page-cache writes, socket and file copies,
user-space memcpy, page faults, scheduler, Python, SQLite...) and the top symbols.

Needs ``perf`` (Debian ``linux-perf``; root, or kernel.perf_event_paranoid <= 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.common import MiB, say
from tests.bench.profile_produce import produce_load

BENCH_DIR = Path(__file__).resolve().parent
RATE_HZ = 499

# (label, symbol prefixes or substrings): first match wins, in this order.
AREAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kernel: copy into the page cache (file writes)", ("copy_folio_from_iter",)),
    ("kernel: copy to/from user (socket send/receive, file reads)", ("_copy_to_iter", "_copy_from_iter",
                                                                     "copy_page_to_iter")),
    ("kernel: page faults and zeroing new pages", ("clear_page", "exc_page_fault", "do_anonymous_page",
                                                    "handle_mm_fault", "__handle_mm_fault", "alloc_pages",
                                                    "get_page_from_freelist", "__alloc_frozen_pages")),
    ("kernel: scheduler and futex (thread hand-offs)", ("finish_task_switch", "__schedule", "schedule",
                                                        "_raw_spin_unlock_irqrestore", "futex", "try_to_wake_up")),
    ("user: memcpy/memmove (gRPC buffers, protobuf, bytes)", ("__memmove", "__memcpy", "memcpy")),
    ("user: CRC-32C", ("_crc32c", "crc32c")),
)


def _replica_cpu(pid: int) -> tuple[float, float]:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _area(symbol: str, dso: str) -> str:
    for label, markers in AREAS:
        if any(m in symbol for m in markers):
            return label
    if "kernel" in dso:
        return "kernel: other (TCP/IP, ext4, syscalls)"
    if "libpython" in dso or dso.endswith("python3.11") or symbol.startswith(("_Py", "Py")):
        return "user: Python interpreter"
    if "cygrpc" in dso:
        return "user: gRPC core"
    if "_message" in dso or "upb" in symbol:
        return "user: protobuf (upb)"
    return "user: other native"


def _perf_symbols(data: Path) -> list[tuple[float, str, str]]:
    """(share %, symbol, dso) per symbol from ``perf report``."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "sym,dso", "-g", "none",
                          "--stdio", "--percent-limit", "0.01"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "%" not in line:
            continue
        share, rest = line.split("%", 1)
        parts = rest.split()
        # "[k] symbol   [kernel.kallsyms]" or "[.] symbol   libfoo.so"
        if len(parts) < 3:
            continue
        rows.append((float(share), " ".join(parts[1:-1]), parts[-1]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.profile_perf", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch-kib", type=int, default=1024)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--out", type=Path, default=BENCH_DIR)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    if not shutil.which("perf"):
        raise SystemExit("perf not found: apt-get install linux-perf")
    perf_data = BENCH_DIR / "out" / "profile" / "replicas.perf.data"
    perf_data.parent.mkdir(parents=True, exist_ok=True)
    with produce_load(name="perf", batch_kib=args.batch_kib, acks=-1, processes=args.processes,
                      threads=args.threads, seconds=args.seconds) as (bench, futures):
        pids = {s.name: s.pid for s in bench.replicas.values()}
        before = {name: _replica_cpu(pid) for name, pid in pids.items()}
        say(f"perf on {len(pids)} replicas for {args.seconds:.0f}s under produce load ({args.batch_kib} KiB)")
        perf = subprocess.Popen(["perf", "record", "-F", str(RATE_HZ), "-p", ",".join(map(str, pids.values())),
                                 "-o", str(perf_data), "--", "sleep", str(max(1.0, args.seconds - 1))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        results = [f.result(timeout=args.seconds + 120) for f in futures]
        after = {name: _replica_cpu(pid) for name, pid in pids.items()}
        _out, err = perf.communicate(timeout=60)
        if perf.returncode:
            raise SystemExit(f"perf record exited {perf.returncode}: {err.decode(errors='replace')[-500:]}")
    mib = max(sum(r["bytes"] for r in results) / MiB, 1e-9)
    cpu = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in pids}
    total_ms = sum(u + s for u, s in cpu.values()) * 1000 / mib
    symbols = _perf_symbols(perf_data)
    areas: dict[str, float] = {}
    for share, symbol, dso in symbols:
        label = _area(symbol, dso)
        areas[label] = areas.get(label, 0.0) + share
    rows = [
        "# Where replica CPU goes per produced MiB, kernel included (perf)",
        "",
        f"`python -m tests.bench.profile_perf --seconds {args.seconds:g} --batch-kib {args.batch_kib}` — "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        f"RF 3 topic, 3 partitions (each replica leads one, follows two), raw `Replica.Produce` of "
        f"{args.batch_kib} KiB batches of 1 KiB records, acks=all, {args.processes} producer processes x "
        f"{args.threads} threads; `perf record -F {RATE_HZ}` on the three replica processes, CPU time from "
        "`/proc/PID/stat` over the same window.",
        "",
        f"* produced: **{mib * MiB / 1e6 / args.seconds:.0f} MB/s**; replica CPU **{total_ms:.1f} ms per produced "
        "MiB** (sum of the three)",
        *[f"* {n}: user {u * 1000 / mib:.2f}, system {s * 1000 / mib:.2f} ms/MiB" for n, (u, s) in sorted(cpu.items())],
        "",
        "## By area (share of the replicas' samples; ms/MiB = share x the CPU above)",
        "",
        "| area | share | ms / MiB |",
        "|---|---|---|",
        *[f"| {label} | {share:.1f}% | {share / 100 * total_ms:.2f} |"
          for label, share in sorted(areas.items(), key=lambda kv: -kv[1])],
        "",
        "## Top symbols",
        "",
        "| symbol | object | share |",
        "|---|---|---|",
        *[f"| `{symbol}` | {Path(dso).name} | {share:.1f}% |" for share, symbol, dso in symbols[:args.top]],
        "",
        f"Raw samples: `{perf_data.relative_to(BENCH_DIR.parent.parent)}` (`perf report -i ...`).",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "PROFILE-perf.md").write_text("\n".join(rows))
    say(f"{total_ms:.1f} ms/MiB of replica CPU at {mib * MiB / 1e6 / args.seconds:.0f} MB/s; "
        f"wrote {args.out / 'PROFILE-perf.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
