"""Load generators that run in separate worker processes (``spawn``), so the benchmark driver's
GIL never throttles the load or inflates the latencies it measures.

Each function takes one picklable ``dict`` spec and returns a ``dict`` of counts and raw samples.
Windows are aligned across processes by wall-clock ``start_at``: work completing during
``[start_at + warmup_s, start_at + warmup_s + duration_s)`` is counted; work before is warm-up.
A spec's optional ``tls`` (``{"ca", "cert", "key"}`` paths, as ``tls_spec`` makes them) dials TLS;
without it, plaintext.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import grpc

from lowtide.rpc.channels import open_channel
from lowtide.tls.config import ClientTls
from lowtide_pb import replica_pb2, replica_pb2_grpc
from tests.bench.common import next_offset_after


def noop(_spec: dict[str, Any] | None = None) -> int:
    """Warm a worker process up (imports grpc and the stubs)."""
    return 0


def tls_spec(tls: ClientTls | None) -> dict[str, str] | None:
    """A picklable form of ``tls`` for a spec's ``tls`` key (None: plaintext)."""
    if tls is None:
        return None
    return {k: str(v) for k, v in (("ca", tls.ca), ("cert", tls.cert), ("key", tls.key)) if v is not None}


def _channel(address: str, spec: dict[str, Any]) -> grpc.Channel:
    """A channel to ``address``: TLS with the spec's ``tls`` paths, else plaintext (never the
    process's ``LOWTIDE_TLS_*`` default: the spec says which)."""
    tls = spec.get("tls")
    return open_channel(address, ClientTls(**{k: Path(v) for k, v in tls.items()}) if tls else None)


class _WindowCpu:
    """This process's CPU seconds (every thread: ``time.process_time``) over the wall-clock window
    ``[win_start, win_end)``, read by a thread at both ends; ``result()`` waits for the end."""

    def __init__(self, win_start: float, win_end: float) -> None:
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, args=(win_start, win_end), daemon=True)
        self._thread.start()

    def _run(self, win_start: float, win_end: float) -> None:
        time.sleep(max(0.0, win_start - time.time()))
        before = time.process_time()
        time.sleep(max(0.0, win_end - time.time()))
        self.seconds = time.process_time() - before

    def result(self) -> float | None:
        self._thread.join()
        return self.seconds


def produce_raw(spec: dict[str, Any]) -> dict[str, Any]:
    """Raw ``Replica.Produce`` of one pre-built batch per request, round-robin over ``targets``.

    spec: targets [(address, topic, partition)], batch (bytes), records_per_batch, acks, threads,
    start_at (epoch s), warmup_s, duration_s, rate_batches_s (0 = as fast as acknowledged), stop_file
    (optional: stop early once this path exists), tls (optional).
    Returns bytes/records/requests completed in the window, errors, request latencies (s), and
    ``cpu_s``: this process's CPU seconds over the window (None when stopped early).
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
            channels[address] = _channel(address, spec)
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

    cpu = _WindowCpu(win_start, win_end)
    pool = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    cpu_s = cpu.result() if time.time() >= win_end else None
    for ch in channels.values():
        ch.close()
    n = totals["requests"]
    return {"requests": n, "bytes": n * len(batch), "records": n * int(spec["records_per_batch"]),
            "errors": totals["errors"], "first_error": totals["first_error"], "latencies": latencies,
            "cpu_s": cpu_s}


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

    spec: address, topic, partition, start, end, partition_max_bytes, start_at, tls (optional).
    Returns the record bytes fetched, fetches, elapsed seconds from the first fetch to the last,
    and ``cpu_s``: this process's CPU seconds over them.
    """
    channel = _channel(spec["address"], spec)
    stub = replica_pb2_grpc.ReplicaStub(channel)
    offset, end = int(spec["start"]), int(spec["end"])
    max_bytes = int(spec["partition_max_bytes"])
    total = fetches = 0
    error = ""
    while time.time() < float(spec["start_at"]):
        time.sleep(0.005)
    began = time.perf_counter()
    cpu_began = time.process_time()
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
    cpu_s = time.process_time() - cpu_began
    channel.close()
    return {"bytes": total, "fetches": fetches, "seconds": elapsed, "end_offset": offset, "error": error,
            "cpu_s": cpu_s}
