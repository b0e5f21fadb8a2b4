"""DeleteRecords figures (docs/design/kip-107-delete-records.md "Why it is fast", docs/testing.md#targets).

* Idle latency: an RF 3, one-partition topic with data and no traffic (followers parked in their
  long-poll fetch). ``Admin/DeleteRecords`` through the front door, ``n`` times, each advancing the
  offset by ``step`` records; the latency is the client-observed call time, which includes waiting
  until every live replica's LSO reached the offset (the low watermark). Then the same directly on
  the leader's ``Replica/DeleteRecords``, to separate the front door's share.
* Busy latency: the same while a worker process produces to the same partition (acks=all, 64 KiB
  batches); each delete targets a little below the current high watermark.
* 1,000 partitions: one ``Admin/DeleteRecords`` naming all partitions of a 1,000-partition RF 3
  topic (leaders spread over the replicas), after a small batch was produced to each.
* Space freed: a topic with small segments (64 KiB); a few MB produced; one DeleteRecords to the
  base offset of a late segment; then the replica directories (``<data_dir>/<topic>-0``) of all
  replicas are polled every 2 ms until no ``*.log*`` file of a wholly deleted segment is left. The
  figure is the time from the call's return until then (0 when already gone at return).
"""

from __future__ import annotations

import re
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from tests.bench import workers
from tests.bench.common import (
    Bench,
    Figure,
    KiB,
    MiB,
    build_batch,
    check_delete,
    dir_log_bytes,
    failed,
    percentile,
    say,
    summary_ms,
)

SEGMENT_FILE = re.compile(r"^(\d{20})\.log")


def _prepare_topic(bench: Bench, topic: str, records: int, config: dict[str, str] | None = None,
                   batch_records: int = 20, request_bytes: int = 4 * MiB) -> str:
    """Create an RF 3 one-partition topic with ``records`` 1 KiB records in batches of
    ``batch_records``, up to ``request_bytes`` per Produce; returns the leader address."""
    bench.create_topic(topic, 1, 3, config)
    leader = bench.leaders(topic)[0]
    batch, count = build_batch(batch_records * (KiB + 8))
    group = max(1, request_bytes // len(batch))
    sent = 0
    while sent < records:
        bench.produce_once(leader, topic, {0: b"".join([batch] * group)}, acks=-1)
        sent += group * count
    bench.wait_replicated(topic)
    return leader


def _latency_loop(call, offsets: list[int], warmup: int, gap_s: float) -> tuple[list[float], list[str]]:
    samples: list[float] = []
    errors: list[str] = []
    for i, offset in enumerate(offsets):
        began = time.perf_counter()
        try:
            check_delete(call(offset))
        except Exception as exc:  # noqa: BLE001 - count and keep going
            errors.append(repr(exc)[:200])
            continue
        elapsed = time.perf_counter() - began
        if i >= warmup:
            samples.append(elapsed)
        if gap_s:
            time.sleep(gap_s)
    return samples, errors


def _latency_figures(prefix: str, label: str, samples: list[float], errors: list[str], target_ms: float | None,
                     params: dict[str, Any]) -> list[Figure]:
    stats = summary_ms(samples)
    say(f"delete: {label}: p50 {stats.get('p50_ms', float('nan')):.2f} ms, p99 "
        f"{stats.get('p99_ms', float('nan')):.2f} ms, max {stats.get('max_ms', float('nan')):.2f} ms "
        f"(n={len(samples)}, errors={len(errors)})")
    params = {**params, **stats, "errors": len(errors), "first_error": errors[0] if errors else ""}
    if not samples:
        return [failed(f"{prefix}_p99_ms", f"{label} p99", "ms", None, errors[0] if errors else "no samples")]
    p99 = Figure(key=f"{prefix}_p99_ms", name=f"{label} p99", value=percentile(samples, 99) * 1e3, unit="ms",
                 params=params)
    if target_ms is not None:
        p99.target, p99.target_value, p99.better = f"p99 <= {target_ms:g} ms", target_ms, "lower"
    return [Figure(key=f"{prefix}_p50_ms", name=f"{label} p50", value=percentile(samples, 50) * 1e3, unit="ms",
                   params={"see": p99.key}), p99.judge()]


def idle_latency(bench: Bench, n: int, step: int = 5, warmup: int = 10) -> list[Figure]:
    """Front door and direct-to-leader DeleteRecords latency on an idle RF 3 partition."""
    topic = "bench-delete-idle"
    gap_s = 0.02
    try:
        total = 2 * (n + warmup) * step + 100
        leader = _prepare_topic(bench, topic, total)
    except Exception as exc:  # noqa: BLE001
        return [failed("delete_idle_frontdoor_p99_ms", "DeleteRecords idle RF 3 (front door) p99", "ms",
                       "p99 <= 10 ms", exc)]
    say(f"delete: idle RF 3 partition, {n} calls via the front door then {n} on the leader ({leader})")
    params = {"rf": 3, "partitions": 1, "calls": n, "warmup_calls": warmup, "step_records": step,
              "gap_between_calls_ms": gap_s * 1e3, "follower_long_poll": "default (replica.fetch.wait.max.ms)"}
    offsets = [step * (i + 1) for i in range(n + warmup)]
    fd, fd_err = _latency_loop(lambda o: bench.delete_records_frontdoor([(topic, 0, o)]), offsets, warmup, gap_s)
    base = offsets[-1]
    offsets = [base + step * (i + 1) for i in range(n + warmup)]
    direct, d_err = _latency_loop(lambda o: bench.delete_records_replica(leader, [(topic, 0, o)]), offsets,
                                  warmup, gap_s)
    bench.delete_topic(topic)
    figs = _latency_figures("delete_idle_frontdoor", "DeleteRecords idle RF 3 (front door)", fd, fd_err, 10.0,
                            {**params, "path": "Admin/DeleteRecords"})
    figs += _latency_figures("delete_idle_leader", "DeleteRecords idle RF 3 (leader direct)", direct, d_err, None,
                             {**params, "path": "Replica/DeleteRecords on the leader"})
    return figs


def busy_latency(bench: Bench, pool: Executor, n: int, stop_dir: Path, warmup: int = 10) -> list[Figure]:
    """DeleteRecords latency while a worker process produces to the same RF 3 partition."""
    topic = "bench-delete-busy"
    try:
        leader = _prepare_topic(bench, topic, 2000)
    except Exception as exc:  # noqa: BLE001
        return [failed("delete_busy_frontdoor_p99_ms", "DeleteRecords busy RF 3 (front door) p99", "ms",
                       "p99 <= 25 ms", exc)]
    batch, count = build_batch(64 * KiB)
    gap_s = 0.02
    # Long enough for both loops; the loops end first and the producer then runs out its window.
    budget_s = 2 * (n + warmup) * 0.06 + 20
    stop_file = stop_dir / "stop-busy-producer"
    stop_file.unlink(missing_ok=True)
    spec = {"targets": [(leader, topic, 0)], "batch": batch, "records_per_batch": count, "acks": -1, "threads": 2,
            "start_at": time.time(), "warmup_s": 0.0, "duration_s": budget_s, "rate_batches_s": 0.0,
            "stop_file": str(stop_file)}
    began = time.monotonic()
    future = pool.submit(workers.produce_raw, spec)
    say(f"delete: busy RF 3 partition (producer: 64 KiB batches, acks=all), {n} calls front door + {n} leader")
    time.sleep(1.0)  # let the producer reach steady state
    lso = [bench.list_offsets(leader, topic, 0, -2)]

    def next_offset() -> int:
        hw = bench.list_offsets(leader, topic, 0, -1)
        lso[0] = max(lso[0] + 1, hw - 5 * count)
        return lso[0]

    def run(call) -> tuple[list[float], list[str]]:
        samples: list[float] = []
        errors: list[str] = []
        for i in range(n + warmup):
            offset = next_offset()
            began = time.perf_counter()
            try:
                check_delete(call(offset))
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc)[:200])
                continue
            if i >= warmup:
                samples.append(time.perf_counter() - began)
            time.sleep(gap_s)
        return samples, errors

    fd, fd_err = run(lambda o: bench.delete_records_frontdoor([(topic, 0, o)]))
    direct, d_err = run(lambda o: bench.delete_records_replica(leader, [(topic, 0, o)]))
    params = {"rf": 3, "partitions": 1, "calls": n, "warmup_calls": warmup, "producer": "1 process x 2 threads, "
              "64 KiB batches, acks=all, unthrottled", "target_offset": "HW - 5 batches"}
    try:
        stop_file.touch()
        load = future.result(timeout=budget_s + 60)
        params["producer_mbs_during"] = load["bytes"] / (time.monotonic() - began) / 1e6
        params["producer_errors"] = load["errors"]
    except Exception as exc:  # noqa: BLE001
        params["producer_error"] = repr(exc)
    bench.delete_topic(topic)
    figs = _latency_figures("delete_busy_frontdoor", "DeleteRecords while producing RF 3 (front door)", fd, fd_err,
                            25.0, {**params, "path": "Admin/DeleteRecords"})
    figs += _latency_figures("delete_busy_leader", "DeleteRecords while producing RF 3 (leader direct)", direct,
                             d_err, None, {**params, "path": "Replica/DeleteRecords on the leader"})
    return figs


def many_partitions(bench: Bench, partitions: int, repeats: int) -> list[Figure]:
    """One Admin/DeleteRecords over ``partitions`` partitions of an RF 3 topic, ``repeats`` times."""
    topic = "bench-delete-wide"
    name = f"DeleteRecords over {partitions:,} partitions in one call (RF 3)"
    key = "delete_wide_ms"
    try:
        began = time.monotonic()
        bench.create_topic(topic, partitions, 3)
        say(f"delete: created {partitions} partitions in {time.monotonic() - began:.1f}s; producing to each")
        batch, count = build_batch(10 * (KiB + 8))  # 10 records per partition per round
        rounds = repeats + 1
        for _ in range(rounds):
            bench.produce_all(topic, {p: batch for p in range(partitions)}, acks=-1)
        bench.wait_replicated(topic, timeout_s=120)
        samples: list[float] = []
        for r in range(repeats + 1):
            offset = (r + 1) * count
            began = time.perf_counter()
            resp = bench.delete_records_frontdoor([(topic, p, offset) for p in range(partitions)], timeout_ms=30000)
            elapsed = time.perf_counter() - began
            check_delete(resp)
            if len(resp.partitions) != partitions:
                raise RuntimeError(f"{len(resp.partitions)} results for {partitions} partitions")
            say(f"delete: {partitions} partitions to offset {offset}: {elapsed * 1e3:.0f} ms"
                + (" (warm-up)" if r == 0 else ""))
            if r > 0:
                samples.append(elapsed)
            time.sleep(0.2)
    except Exception as exc:  # noqa: BLE001
        say(f"delete: {partitions} partitions failed: {exc!r}")
        return [failed(key, name, "ms", "<= 1 s", exc)]
    finally:
        bench.delete_topic(topic)
    fig = Figure(key=key, name=name, value=max(samples) * 1e3, unit="ms", target="<= 1 s", target_value=1000.0,
                 better="lower", note=f"worst of {len(samples)} calls (median {percentile(samples, 50) * 1e3:.0f} ms)",
                 params={"partitions": partitions, "rf": 3, "repeats": repeats,
                         "samples_s": samples, "median_s": percentile(samples, 50)})
    return [fig.judge()]


def _segments(directory: Path) -> list[int]:
    return sorted({int(m.group(1)) for name in dir_log_bytes(directory) if (m := SEGMENT_FILE.match(name))})


def space_freed(bench: Bench, produce_bytes: int, repeats: int) -> list[Figure]:
    """Time from DeleteRecords' return until the deleted segments' files are gone on all replicas."""
    topic = "bench-delete-space"
    name = "disk space of deleted segments freed on all replicas (after the call returns)"
    key = "delete_space_freed_ms"
    segment_bytes = 64 * KiB
    try:
        _prepare_topic(bench, topic, produce_bytes // KiB, config={"segment.bytes": str(segment_bytes)},
                       batch_records=15, request_bytes=segment_bytes // 2)
        replica_ids = bench.replica_sets(topic)[0]
        dirs = [Path(bench.replicas[r].data_dir) / f"{topic}-0" for r in replica_ids]
        segments = _segments(dirs[0])
        say(f"delete: space: {len(segments)} segments of {segment_bytes // KiB} KiB on {len(dirs)} replicas")
        if len(segments) < repeats + 2:
            raise RuntimeError(f"only {len(segments)} segments in {dirs[0]}")
        samples: list[float] = []
        freed: list[int] = []
        for r in range(repeats):
            # Delete up to the base offset of a later segment: every segment before it is wholly deleted.
            target = segments[(r + 1) * (len(segments) - 1) // (repeats + 1)]
            doomed = {d: {n: s for n, s in dir_log_bytes(d).items()
                          if (m := SEGMENT_FILE.match(n)) and int(m.group(1)) < target} for d in dirs}
            doomed_segments = [s for s in segments if s < target]
            nbytes = sum(sum(v.values()) for v in doomed.values())
            check_delete(bench.delete_records_frontdoor([(topic, 0, target)]))
            returned = time.perf_counter()
            deadline = returned + 60
            while True:
                left = [d for d in dirs
                        if any((m := SEGMENT_FILE.match(n)) and int(m.group(1)) in doomed_segments
                               for n in dir_log_bytes(d))]
                if not left:
                    break
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"segments below {target} still present after 60 s in {left}")
                time.sleep(0.002)
            elapsed = time.perf_counter() - returned
            samples.append(elapsed)
            freed.append(nbytes)
            say(f"delete: space: offset {target}: {len(doomed_segments)} segments, {nbytes / MiB:.1f} MiB over "
                f"{len(dirs)} replicas gone {elapsed * 1e3:.1f} ms after the call returned")
    except Exception as exc:  # noqa: BLE001
        say(f"delete: space freed failed: {exc!r}")
        return [failed(key, name, "ms", "<= 1 s", exc)]
    finally:
        bench.delete_topic(topic)
    fig = Figure(key=key, name=name, value=max(samples) * 1e3, unit="ms", target="<= 1 s", target_value=1000.0,
                 better="lower", note=f"worst of {len(samples)} repeats",
                 params={"segment_bytes": segment_bytes, "produced_bytes": produce_bytes, "repeats": repeats,
                         "samples_ms": [s * 1e3 for s in samples], "bytes_freed_per_repeat": freed,
                         "poll_interval_ms": 2, "file.delete.delay.ms": "default"})
    return [fig.judge()]
