"""Load generators that run in separate worker processes (``spawn``), so the benchmark driver's
GIL never throttles the load or inflates the latencies it measures.

Each function takes one picklable ``dict`` spec and returns a ``dict`` of counts and raw samples.
Windows are aligned across processes by wall-clock ``start_at``: work completing during
``[start_at + warmup_s, start_at + warmup_s + duration_s)`` is counted; work before is warm-up.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import grpc

from lowtide_pb import replica_pb2, replica_pb2_grpc
from tests.bench.common import CHANNEL_OPTIONS, next_offset_after


def noop(_spec: dict[str, Any] | None = None) -> int:
    """Warm a worker process up (imports grpc and the stubs)."""
    return 0


def produce_raw(spec: dict[str, Any]) -> dict[str, Any]:
    """Raw ``Replica.Produce`` of one pre-built batch per request, round-robin over ``targets``.

    spec: targets [(address, topic, partition)], batch (bytes), records_per_batch, acks, threads,
    start_at (epoch s), warmup_s, duration_s, rate_batches_s (0 = as fast as acknowledged), stop_file
    (optional: stop early once this path exists).
    Returns bytes/records/requests completed in the window, errors, and request latencies (s).
    """
    targets = spec["targets"]
    batch: bytes = spec["batch"]
    acks = int(spec["acks"])
    threads = int(spec.get("threads", 2))
    start_at = float(spec["start_at"])
    win_start = start_at + float(spec["warmup_s"])
    win_end = win_start + float(spec["duration_s"])
    rate = float(spec.get("rate_batches_s", 0.0))
    stop_file = spec.get("stop_file")
    channels: dict[str, grpc.Channel] = {}
    stubs = {}
    for address, _t, _p in targets:
        if address not in channels:
            channels[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            stubs[address] = replica_pb2_grpc.ReplicaStub(channels[address])
    requests = [(stubs[a], replica_pb2.ProduceRequest(acks=acks, timeout_ms=30000, partitions=[
        replica_pb2.ProducePartition(topic=t, partition=p, records=batch)])) for a, t, p in targets]
    lock = threading.Lock()
    totals = {"requests": 0, "errors": 0, "first_error": ""}
    latencies: list[float] = []

    def run(index: int) -> None:
        i = index
        next_due = start_at
        while True:
            now = time.time()
            if now >= win_end or (stop_file and os.path.exists(stop_file)):
                return
            if now < start_at:
                time.sleep(start_at - now)
            if rate > 0:
                next_due += threads / rate
                delay = next_due - time.time()
                if delay > 0:
                    time.sleep(delay)
            stub, req = requests[i % len(requests)]
            i += threads
            began = time.perf_counter()
            try:
                resp = stub.Produce(req, timeout=30)
                error = next((r for r in resp.partitions if r.error_code), None)
                err_text = f"{error.error_code} {error.error_message}" if error else ""
            except grpc.RpcError as exc:
                err_text = f"{exc.code().name} {exc.details()}"
            elapsed = time.perf_counter() - began
            done = time.time()
            if win_start <= done < win_end:
                with lock:
                    if err_text:
                        totals["errors"] += 1
                        totals["first_error"] = totals["first_error"] or err_text
                    else:
                        totals["requests"] += 1
                        latencies.append(elapsed)
            elif err_text and done < win_start:
                time.sleep(0.01)

    pool = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for ch in channels.values():
        ch.close()
    n = totals["requests"]
    return {"requests": n, "bytes": n * len(batch), "records": n * int(spec["records_per_batch"]),
            "errors": totals["errors"], "first_error": totals["first_error"], "latencies": latencies}


def produce_client(spec: dict[str, Any]) -> dict[str, Any]:
    """``lowtide.client.Producer.produce_values`` in a loop (client encodes records, per record).

    spec: bootstrap, topic, acks, batch_bytes, values_per_call, record_size, start_at, warmup_s,
    duration_s. Returns bytes/records completed in the window.
    """
    from lowtide.client import Producer

    start_at = float(spec["start_at"])
    win_start = start_at + float(spec["warmup_s"])
    win_end = win_start + float(spec["duration_s"])
    size = int(spec["record_size"])
    values = [(b"lowtide-bench-" * (size // 14 + 1))[:size]] * int(spec["values_per_call"])
    done_bytes = done_records = errors = 0
    first_error = ""
    with Producer(spec["bootstrap"], acks=int(spec["acks"]), batch_bytes=int(spec["batch_bytes"])) as producer:
        producer.produce_values(spec["topic"], values[:10])  # metadata + channels
        while time.time() < start_at:
            time.sleep(0.01)
        while time.time() < win_end:
            try:
                report = producer.produce_values(spec["topic"], values)
                ok = True
            except Exception as exc:  # noqa: BLE001 - report, keep loading
                ok, first_error, errors = False, first_error or repr(exc), errors + 1
            now = time.time()
            if ok and win_start <= now < win_end:
                done_bytes += report.bytes
                done_records += report.records
    return {"bytes": done_bytes, "records": done_records, "errors": errors, "first_error": first_error,
            "latencies": []}


def consume_raw(spec: dict[str, Any]) -> dict[str, Any]:
    """Raw consumer ``Replica.Fetch`` (replica_id -1) of one partition from ``start`` to ``end``.

    spec: address, topic, partition, start, end, partition_max_bytes, start_at. Returns the record
    bytes fetched, fetches, and elapsed seconds from the first fetch to the last.
    """
    channel = grpc.insecure_channel(spec["address"], options=CHANNEL_OPTIONS)
    stub = replica_pb2_grpc.ReplicaStub(channel)
    offset, end = int(spec["start"]), int(spec["end"])
    max_bytes = int(spec["partition_max_bytes"])
    total = fetches = 0
    error = ""
    while time.time() < float(spec["start_at"]):
        time.sleep(0.005)
    began = time.perf_counter()
    while offset < end:
        req = replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=0, partitions=[
            replica_pb2.FetchPartition(topic=spec["topic"], partition=int(spec["partition"]), fetch_offset=offset,
                                       partition_max_bytes=max_bytes, current_leader_epoch=-1)])
        result = stub.Fetch(req, timeout=30).partitions[0]
        fetches += 1
        if result.error_code:
            error = f"{result.error_code} {result.error_message}"
            break
        following = next_offset_after(result.records)
        if following is None:
            break
        total += len(result.records)
        offset = following
    elapsed = time.perf_counter() - began
    channel.close()
    return {"bytes": total, "fetches": fetches, "seconds": elapsed, "end_offset": offset, "error": error}
