"""Transport ceiling: the produce RF 3 acks=all load over plain TCP sockets in plain Python.

What this machine can move through the same process topology as ``produce RF 3, acks=all`` when
there is no gRPC, no protobuf and no log logic at all: three server processes
(``ceiling_net.py``, standard library only), server ``i`` leading partition ``i`` and following
the other two, as the three replicas lead the three partitions of a produce topic. Each request
goes client -> the partition's leader, which appends the batch to its file of that partition
(``os.write``, ``O_APPEND``, no fsync, on the filesystem of the cluster's data directory), sends
it to both followers (each appends it to its own file and acks) and acks the client once both
have acked (acks=all). Frames are length-prefixed on loopback TCP, one thread per connection,
``recv_into`` preallocated buffers and ``sendall`` of memoryviews.

The load is the produce section's, so the two figures compare: the same pre-built RecordBatch
(``common.build_batch``, 1 KiB records) of each batch size the produce section runs for RF 3
acks=all, ``processes`` worker processes x ``threads`` threads, each thread one request in flight,
round-robin over the three leaders, the same warm-up and measured window. Bytes are the batch
bytes acknowledged in the window. The figure for 1 MiB batches is the ceiling the produce
figures are related to ("= N x the transport ceiling" in their notes).

Server CPU per MiB: utime + stime of each server process over the measured window
(``/proc/PID/stat``) per MiB acknowledged, as ``produce.py`` measures the replicas: the floor of
what moving and writing the bytes three times costs in Python here, next to what the replicas
spend.
"""

from __future__ import annotations

import json
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.bench import ceiling_net, produce
from tests.bench.common import (
    Figure,
    KiB,
    MiB,
    build_batch,
    cpu_figures,
    cpu_per_mib,
    cpu_snapshot,
    failed,
    say,
    summary_ms,
)

REPO = Path(__file__).resolve().parents[2]
SERVERS = 3  # = replicas = partitions of the produce topic, RF 3
START_TIMEOUT_S = 30.0
HEADLINE_BATCH = MiB


def batch_sizes(quick: bool) -> list[int]:
    """The batch sizes the produce section runs with RF 3, acks=all, raw batches."""
    return sorted({v.batch_bytes for v in produce.variants(quick, with_client=False)
                   if v.rf == 3 and v.acks == -1 and v.mode == "raw"})


def key(batch_bytes: int) -> str:
    return f"ceiling_rf3_acksall_b{batch_bytes // KiB}k_mbs"


def cpu_key(batch_bytes: int) -> str:
    """Key prefix of the servers' CPU per MiB figures (``{cpu_key}_{process|sum}_ms_mib``)."""
    return f"ceiling_cpu_b{batch_bytes // KiB}k"


def size_label(batch_bytes: int) -> str:
    return f"{batch_bytes // MiB} MiB" if batch_bytes >= MiB else f"{batch_bytes // KiB} KiB"


def name(batch_bytes: int) -> str:
    return f"transport ceiling: RF 3 acks=all over plain sockets (Python), batch {size_label(batch_bytes)}"


def _readline(proc: subprocess.Popen[str], timeout_s: float, log: Path) -> str:
    """One line of a server's stdout, or an error with its stderr when it died or hung."""
    assert proc.stdout is not None
    ready, _w, _x = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"ceiling server pid {proc.pid} did not answer (exit {proc.poll()}): {tail}")
    return line.strip()


def _stop(proc: subprocess.Popen[str]) -> None:
    """Close stdin (the server exits on EOF); kill it if it has not gone within 5 s."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


@contextmanager
def plain_servers(directory: Path) -> Iterator[tuple[dict[str, int], list[int]]]:
    """Start the ``SERVERS`` plain-socket server processes with their files in ``directory``;
    yield (``{name: pid}``, ports by server index). Always stops them and removes ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, directory, ignore_errors=True)
        procs: list[tuple[subprocess.Popen[str], Path]] = []
        for i in range(SERVERS):
            log = directory / f"ceiling-{i}.stderr"
            with open(log, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tests.bench.ceiling_net", "serve", "--index", str(i),
                     "--dir", str(directory / f"ceiling-{i}"), "--partitions", str(SERVERS)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=REPO, text=True)
            stack.callback(_stop, proc)  # callbacks run last-in first-out: every started one is stopped
            procs.append((proc, log))
        ports = [int(_readline(proc, START_TIMEOUT_S, log)) for proc, log in procs]
        for proc, _log in procs:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(ports) + "\n")
            proc.stdin.flush()
        for proc, log in procs:
            if (line := _readline(proc, START_TIMEOUT_S, log)) != "ready":
                raise RuntimeError(f"ceiling server pid {proc.pid} said {line!r}, not 'ready'")
        yield {f"ceiling-{i}": proc.pid for i, (proc, _log) in enumerate(procs)}, ports


def _run_size(directory: Path, pool: Executor, batch_bytes: int, *, processes: int, threads: int,
              warmup_s: float, duration_s: float) -> dict[str, Any]:
    batch, count = build_batch(batch_bytes, produce.RECORD_SIZE)
    with plain_servers(directory) as (pids, ports):
        targets = [(p, p) for p in range(SERVERS)]  # (leader server index, partition): server p leads p
        start_at = time.time() + 0.3  # the pool's workers are already up: this only aligns them
        specs = [{"ports": ports, "targets": targets[k:] + targets[:k], "batch": batch, "records_per_batch": count,
                  "threads": threads, "start_at": start_at, "warmup_s": warmup_s, "duration_s": duration_s}
                 for k in range(processes)]
        futures = [pool.submit(ceiling_net.client, s) for s in specs]
        win_start = start_at + warmup_s
        time.sleep(max(0.0, win_start - time.time()))
        cpu_before = cpu_snapshot(pids)
        time.sleep(max(0.0, win_start + duration_s - time.time()))
        cpu_after = cpu_snapshot(pids)
        results = [f.result(timeout=warmup_s + duration_s + 60) for f in futures]
    nbytes = sum(r["bytes"] for r in results)
    return {"bytes": nbytes, "records": sum(r["records"] for r in results),
            "errors": sum(r["errors"] for r in results),
            "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
            "latency": summary_ms([x for r in results for x in r["latencies"]]),
            "cpu": cpu_per_mib(cpu_before, cpu_after, nbytes), "batch_bytes": len(batch), "records_per_batch": count}


def transport_ceiling(directory: Path, pool: Executor, *, quick: bool, processes: int, threads: int,
                      disk_write_mbs: float | None = None) -> list[Figure]:
    """One MB/s figure per RF 3 acks=all batch size of the produce section, and the servers' CPU
    per MiB for 1 MiB batches. ``directory`` must be on the cluster data directory's filesystem."""
    ref = disk_write_mbs / 3 if disk_write_mbs else None
    figures: list[Figure] = []
    cpu_figs: list[Figure] = []
    try:
        for size in batch_sizes(quick):
            cpu_figs += _one_size(directory, pool, size, figures, quick=quick, processes=processes, threads=threads,
                                  ref=ref)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    headline = [f for f in figures if f.key == key(HEADLINE_BATCH)]
    rest = [f for f in figures if f.key != key(HEADLINE_BATCH)]
    return [*headline, *rest, *cpu_figs]


def _one_size(directory: Path, pool: Executor, size: int, figures: list[Figure], *, quick: bool, processes: int,
              threads: int, ref: float | None) -> list[Figure]:
    """Run one batch size and append its MB/s figure to ``figures``; return the servers' CPU
    figures when ``size`` is the headline batch (else none)."""
    # Full: the produce section's warm-up and window. Quick: shorter, so the whole section takes seconds.
    warmup_s, duration_s = (0.5, 1.0) if quick else (2.0, 8.0)
    label = size_label(size)
    say(f"ceiling: batch {label}: {SERVERS} plain-socket servers, {processes} processes x {threads} threads, "
        f"{warmup_s:g}s warm-up + {duration_s:g}s")
    try:
        out = _run_size(directory / f"b{size // KiB}k", pool, size, processes=processes, threads=threads,
                        warmup_s=warmup_s, duration_s=duration_s)
    except Exception as exc:  # noqa: BLE001 - one size failing must not stop the others
        say(f"ceiling: batch {label} failed: {exc!r}")
        figures.append(failed(key(size), name(size), "MB/s", None, exc))
        return []
    mbs = out["bytes"] / duration_s / 1e6
    lat, cpu = out["latency"], out["cpu"]
    say(f"ceiling: batch {label}: {mbs:.1f} MB/s, request p50 {lat.get('p50_ms', float('nan')):.1f} ms "
        f"p99 {lat.get('p99_ms', float('nan')):.1f} ms, errors {out['errors']}{out['first_error'] and ' '}"
        f"{out['first_error']}; server CPU "
        + (", ".join(f"{n} {ms:.1f}" for n, ms in cpu.items()) + " ms/MiB" if cpu else "unknown"))
    params = {"rf": 3, "acks": -1, "batch_bytes": size, "record_bytes": produce.RECORD_SIZE,
              "records_per_batch": out["records_per_batch"], "partitions": SERVERS, "server_processes": SERVERS,
              "processes": processes, "threads_per_process": threads, "in_flight": processes * threads,
              "warmup_s": warmup_s, "duration_s": duration_s,
              "transport": "TCP loopback, length-prefixed frames, plain Python, one thread per connection",
              "disk": "os.write O_APPEND of every batch on every server, no fsync",
              "records_per_s": out["records"] / duration_s, "errors": out["errors"],
              "first_error": out["first_error"], "request_latency": lat, "server_cpu_ms_per_mib": cpu}
    fig = Figure(key=key(size), name=name(size), value=mbs if out["bytes"] else None, unit="MB/s",
                 params=params, note=f"errors: {out['first_error']}" if out["errors"] else "")
    if ref and fig.value is not None:
        fig.ratio, fig.ratio_of = mbs / ref, "disk write bandwidth / 3"
    figures.append(fig.judge())
    if size != HEADLINE_BATCH:
        return []
    cpu_name = f"transport ceiling server CPU per MiB (RF 3 acks=all, batch {label})"
    if not cpu:
        return [failed(f"{cpu_key(size)}_sum_ms_mib", f"{cpu_name}: sum", "ms/MiB", None,
                       "no CPU reading (no bytes acknowledged or a server process gone)")]
    return cpu_figures(cpu_key(size), cpu_name, cpu, {
        "see": fig.key, "batch_bytes": size, "window_s": duration_s, "produced_mib": out["bytes"] / MiB,
        "source": "utime+stime of each server pid from /proc/PID/stat over the measured window"})
