"""The cost of TLS (issue 33): produce RF 3 acks=all and consume, plaintext against TLS, on the same
machine in the same run.

Two local clusters run side by side, alike but for TLS: 3 replicas + front door + Redis each, one
plaintext, one with ``ClusterConfig(tls=True)`` (every gRPC port TLS, mutual TLS between services,
so the followers' replication fetches are mutual TLS too; the load generators present the
cluster's admin client certificate). Rounds alternate between them, ABBA (plaintext, TLS, TLS,
plaintext, ...), so a drift of this shared machine's speed hits both alike; each figure is the
median of the rounds, with the range of the rounds beside it. The idle cluster costs little while
the other one is loaded.

One round on one cluster: a fresh 3-partition RF 3 topic; ``processes`` worker processes of
``threads`` threads send raw ``Replica.Produce`` requests of one pre-built 1 MiB RecordBatch v2 of
1 KiB records with acks=all to the partitions' leaders, as produce.py does (warm-up, then the
measured window; MB/s of acknowledged batches, request latency p50/p99). Then the partitions are
consumed from their leaders from log start to high watermark, one worker per partition, 4 MiB per
fetch (page cache warm: just written). The topic is deleted and the disk's writeback settled
before the next round.

CPU per GiB: utime + stime of every cluster process (``/proc/PID/stat``: replicas, front door,
Redis) over the measured window, plus the load generators' own CPU (``time.process_time`` in each
worker over the same window; for consume, over its fetches), divided by the GiB acknowledged
(each batch once, not once per replica) or fetched. On a 2-core box shared with other work, MB/s
follows whatever else runs; CPU per GiB moves much less (an overloaded machine still inflates it
some: the 1-minute load average at each round's start is in the params). TLS's CPU seconds per GiB
minus plaintext's (difference of the medians) is the cost of TLS.

Before the measured rounds, one short unmeasured round per cluster warms the worker processes
(a process's first TLS channel initialises the TLS library), the services and the page cache.

Connection set-up: from creating a gRPC channel to a replica until its first call returns
(``grpc.health.v1.Health/Check``, ``wait_for_ready``): TCP connect, HTTP/2 preface and, with TLS,
the handshake with a client certificate (credentials built once beforehand), then one small call;
one connection at a time, alternating plaintext and TLS, each channel with its own subchannel pool
so none reuses a connection; with the CPU per connection of that replica (``/proc``, 10 ms ticks:
averaged over many connections) and of this process. The same call on an open channel, alternating
too, is the per-call reference: first call minus it is the connection's cost.

Kafka clients (full runs, when ``make kafka-tools`` installed it): Kafka's own ProducerPerformance
(``kafka-producer-perf-test``, the producer settings of idempotence.py, 1 KiB records) through the
front door's Kafka listener, PLAINTEXT on the plaintext cluster against SSL on the TLS cluster
(client certificate in a PEM keystore, KIP-651), alternating ABBA, 3 rounds each on fresh RF 3
topics: MB/s, p99 and the cluster's CPU per GiB over the tool's whole run (the JVM's own CPU,
start-up and JIT included, is in the params: it does not scale with the bytes). A quick run skips it.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.bench import idempotence, workers
from tests.bench.common import (
    Bench,
    Figure,
    KiB,
    MiB,
    build_batch,
    cpu_ms,
    cpu_per_unit,
    cpu_snapshot,
    running_cluster,
    say,
    settle_disk,
    summary_ms,
)

GiB = 1024 * MiB
MODES = ("plaintext", "tls")
BATCH_BYTES = MiB
RECORD_SIZE = KiB
PARTITIONS = 3
FETCH_BYTES = 4 * MiB


def _cluster_pids(bench: Bench) -> dict[str, int]:
    return {s.name: s.pid for s in bench.cluster.services() if s.pid}


def _cpu_s_per_gib(before: dict[str, float | None], after: dict[str, float | None], client_s: float | None,
                   nbytes: int) -> dict[str, float]:
    """CPU seconds per GiB of ``nbytes``: per cluster process, ``cluster`` (their sum), ``client``
    (the load generators) and ``total``; empty without bytes or a reading."""
    per = cpu_per_unit(before, after, nbytes / GiB)  # ms per GiB, with "sum"
    if not per or client_s is None:
        return {}
    out = {n: ms / 1000 for n, ms in per.items() if n != "sum"}
    out["cluster"] = per["sum"] / 1000
    out["client"] = client_s / (nbytes / GiB)
    out["total"] = out["cluster"] + out["client"]
    return out


def _produce(bench: Bench, pool: Executor, topic: str, *, processes: int, threads: int, warmup_s: float,
             duration_s: float) -> dict[str, Any]:
    batch, count = build_batch(BATCH_BYTES, RECORD_SIZE)
    leaders = bench.leaders(topic)
    targets = [(leaders[p], topic, p) for p in sorted(leaders)]
    start_at = time.time() + 0.5
    specs = [{"targets": targets[k:] + targets[:k], "batch": batch, "records_per_batch": count, "acks": -1,
              "threads": threads, "start_at": start_at, "warmup_s": warmup_s, "duration_s": duration_s,
              "tls": workers.tls_spec(bench.tls)} for k in range(processes)]
    futures = [pool.submit(workers.produce_raw, s) for s in specs]
    pids = _cluster_pids(bench)
    win_start = start_at + warmup_s
    time.sleep(max(0.0, win_start - time.time()))
    before = cpu_snapshot(pids)
    time.sleep(max(0.0, win_start + duration_s - time.time()))
    after = cpu_snapshot(pids)
    results = [f.result(timeout=warmup_s + duration_s + 120) for f in futures]
    nbytes = sum(r["bytes"] for r in results)
    client = [r["cpu_s"] for r in results]
    lat = summary_ms([x for r in results for x in r["latencies"]])
    return {"mbs": nbytes / duration_s / 1e6, "bytes": nbytes, "p50_ms": lat.get("p50_ms"), "p99_ms": lat.get("p99_ms"),
            "requests": lat.get("n", 0), "errors": sum(r["errors"] for r in results),
            "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
            "cpu": _cpu_s_per_gib(before, after, None if None in client else sum(client), nbytes)}


def _consume(bench: Bench, pool: Executor, topic: str) -> dict[str, Any]:
    leaders = bench.leaders(topic)
    specs = []
    for p, addr in sorted(leaders.items()):
        specs.append({"address": addr, "topic": topic, "partition": p, "start": bench.list_offsets(addr, topic, p, -2),
                      "end": bench.list_offsets(addr, topic, p, -1), "partition_max_bytes": FETCH_BYTES,
                      "tls": workers.tls_spec(bench.tls)})
    start_at = time.time() + 0.3
    for s in specs:
        s["start_at"] = start_at
    futures = [pool.submit(workers.consume_raw, s) for s in specs]
    pids = _cluster_pids(bench)
    time.sleep(max(0.0, start_at - time.time()))
    before = cpu_snapshot(pids)
    results = [f.result(timeout=300) for f in futures]
    after = cpu_snapshot(pids)
    nbytes = sum(r["bytes"] for r in results)
    seconds = max(r["seconds"] for r in results)
    return {"mbs": nbytes / seconds / 1e6, "bytes": nbytes, "seconds": seconds,
            "errors": [r["error"] for r in results if r["error"]],
            "cpu": _cpu_s_per_gib(before, after, sum(r["cpu_s"] for r in results), nbytes)}


def _round(bench: Bench, pool: Executor, mode: str, index: int, **load: Any) -> dict[str, Any]:
    topic = f"bench-tls-{mode}-{'warm' if index < 0 else index}"
    settle_disk()
    load_1m = os.getloadavg()[0]
    bench.create_topic(topic, PARTITIONS, 3)
    try:
        produce = _produce(bench, pool, topic, **load)
        bench.wait_replicated(topic)
        consume = _consume(bench, pool, topic)
    finally:
        bench.delete_topic(topic)
    label = "warm-up" if index < 0 else f"round {index + 1}"
    say(f"tls: {label} {mode}: produce {produce['mbs']:.1f} MB/s p50 {produce['p50_ms'] or 0:.1f} ms "
        f"p99 {produce['p99_ms'] or 0:.1f} ms, CPU {produce['cpu'].get('total', float('nan')):.2f} s/GiB "
        f"(cluster {produce['cpu'].get('cluster', float('nan')):.2f}, client "
        f"{produce['cpu'].get('client', float('nan')):.2f}), errors {produce['errors']} {produce['first_error']}; "
        f"consume {consume['mbs']:.0f} MB/s, CPU {consume['cpu'].get('total', float('nan')):.2f} s/GiB "
        f"{consume['errors'] or ''}")
    return {"produce": produce, "consume": consume, "load_1m": load_1m}


# ------------------------------------------------------------------------------------ connections

def _health(channel: grpc.Channel) -> None:
    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10,
                                              wait_for_ready=True)


def _open(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own, never a shared one
    return (grpc.secure_channel(address, credentials, options=options) if credentials is not None
            else grpc.insecure_channel(address, options=options))


def _first_call_s(address: str, credentials: grpc.ChannelCredentials | None) -> float:
    """Seconds from creating a channel to its first call's reply, on a new connection."""
    began = time.perf_counter()
    channel = _open(address, credentials)
    try:
        _health(channel)
        return time.perf_counter() - began
    finally:
        channel.close()


def _connections(benches: dict[str, Bench], n: int) -> dict[str, dict[str, Any]]:
    """``n`` new connections per mode to replica 0 of each cluster, alternating modes; then ``n``
    calls per mode on an open channel, alternating."""
    targets = {}
    for mode, bench in benches.items():
        replica = bench.replicas[min(bench.replicas)]
        targets[mode] = (replica.grpc, replica.pid, bench.tls.channel_credentials() if bench.tls else None)
    samples: dict[str, list[float]] = {m: [] for m in benches}
    server_ms: dict[str, float] = {m: 0.0 for m in benches}
    client_s: dict[str, float] = {m: 0.0 for m in benches}
    for address, _pid, credentials in targets.values():  # unmeasured: first use of each credentials
        _first_call_s(address, credentials)
    for _ in range(n):
        for mode, (address, pid, credentials) in targets.items():
            server_before, client_before = cpu_ms(pid), time.process_time()
            samples[mode].append(_first_call_s(address, credentials))
            client_s[mode] += time.process_time() - client_before
            server_ms[mode] += (cpu_ms(pid) or 0.0) - (server_before or 0.0)
    open_calls: dict[str, list[float]] = {m: [] for m in benches}
    channels = {m: _open(address, credentials) for m, (address, _pid, credentials) in targets.items()}
    try:
        for ch in channels.values():
            _health(ch)
        for _ in range(n):
            for mode, ch in channels.items():
                began = time.perf_counter()
                _health(ch)
                open_calls[mode].append(time.perf_counter() - began)
    finally:
        for ch in channels.values():
            ch.close()
    out = {}
    for mode in benches:
        call = summary_ms(open_calls[mode])
        out[mode] = {"n": n, **summary_ms(samples[mode]), "server_cpu_ms": server_ms[mode] / n,
                     "client_cpu_ms": client_s[mode] * 1000 / n,
                     "cpu_ms": server_ms[mode] / n + client_s[mode] * 1000 / n,
                     "open_channel_call_p50_ms": call["p50_ms"], "open_channel_call_p99_ms": call["p99_ms"]}
        say(f"tls: new connection + first call, {mode}: p50 {out[mode]['p50_ms']:.2f} ms p99 "
            f"{out[mode]['p99_ms']:.2f} ms (the call on an open channel p50 {call['p50_ms']:.2f} ms), CPU "
            f"{out[mode]['cpu_ms']:.2f} ms per connection (replica {out[mode]['server_cpu_ms']:.2f}, "
            f"client {out[mode]['client_cpu_ms']:.2f})")
    return out


def _start_clusters(stack: ExitStack, data_dir: Path) -> dict[str, Bench]:
    """Both clusters, started at the same time (each start mostly waits on its services); each one
    that started is torn down by ``stack``, also when the other fails."""
    managers: dict[str, AbstractContextManager[Bench]] = {
        "plaintext": running_cluster(data_dir / "plaintext"), "tls": running_cluster(data_dir / "tls", tls=True)}
    with ThreadPoolExecutor(max_workers=len(managers)) as ex:
        futures = {m: ex.submit(cm.__enter__) for m, cm in managers.items()}
    benches: dict[str, Bench] = {}
    failure: BaseException | None = None
    for mode, future in futures.items():
        try:
            benches[mode] = future.result()
            stack.push(managers[mode].__exit__)
        except BaseException as exc:  # noqa: BLE001 - raised below, once the started one is registered
            failure = failure or exc
    if failure is not None:
        raise failure
    return benches


# ---------------------------------------------------------------------------------- Kafka clients

KAFKA_ROUNDS = 3
KAFKA_RECORDS = 200_000


def _kafka_props(bench: Bench, mode: str, work: Path) -> tuple[str, Path]:
    """(bootstrap, --producer.config file) for ``mode``'s Kafka listener on ``bench``'s cluster."""
    props = work / f"kafka-{mode}.properties"
    lines = {**idempotence.PRODUCER_PROPS, "enable.idempotence": "true"}
    if mode == "tls":
        tls = bench.tls
        assert tls is not None and tls.cert is not None and tls.key is not None and tls.ca is not None
        keystore = work / "admin-keystore.pem"  # Java's PEM keystore: the PKCS#8 key, then the certificate
        keystore.write_bytes(tls.key.read_bytes() + tls.cert.read_bytes())
        lines.update({"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tls.ca),
                      "ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)})
        bootstrap = bench.cluster.kafka_bootstrap_for("SSL")
    else:
        bootstrap = bench.cluster.kafka_bootstrap_for("PLAINTEXT")
    if not bootstrap:
        raise RuntimeError(f"the {mode} cluster has no {'SSL' if mode == 'tls' else 'PLAINTEXT'} Kafka listener")
    props.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    return bootstrap, props


def _kafka_run(bench: Bench, bootstrap: str, props: Path, topic: str, records: int) -> dict[str, Any]:
    argv = [str(idempotence.TOOL), "--topic", topic, "--num-records", str(records), "--record-size",
            str(idempotence.RECORD), "--throughput", "-1", "--producer.config", str(props),
            "--producer-props", f"bootstrap.servers={bootstrap}"]
    pids = _cluster_pids(bench)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = cpu_snapshot(pids)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    after = cpu_snapshot(pids)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = idempotence.SUMMARY.findall(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"kafka-producer-perf-test exited {done.returncode}: {done.stdout[-800:]} "
                           f"{done.stderr[-800:]}")
    sent, rate, _mbs, _avg, _max, p50, _p95, p99 = found[-1]
    if int(sent) != records:
        raise RuntimeError(f"kafka-producer-perf-test acknowledged {sent} of {records} records")
    nbytes = records * idempotence.RECORD
    jvm_s = (children_after.ru_utime - children.ru_utime) + (children_after.ru_stime - children.ru_stime)
    cpu = cpu_per_unit(before, after, nbytes / GiB)
    return {"mbs": float(rate) * idempotence.RECORD / 1e6, "p50_ms": float(p50), "p99_ms": float(p99),
            "cluster_cpu_s_gib": cpu["sum"] / 1000 if cpu else None, "jvm_cpu_s": jvm_s,
            "cluster_cpu_per_process_s_gib": {n: ms / 1000 for n, ms in cpu.items() if n != "sum"},
            "jvm_cpu_s_gib": jvm_s / (nbytes / GiB)}


def _kafka(benches: dict[str, Bench], work: Path) -> dict[str, list[dict[str, Any]]]:
    work.mkdir(parents=True, exist_ok=True)
    setup = {m: _kafka_props(b, m, work) for m, b in benches.items()}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for index in range(-1, KAFKA_ROUNDS):  # round -1: unmeasured (listeners, the JVM jars in the page cache)
        for mode in MODES if index % 2 == 0 else MODES[::-1]:
            bench = benches[mode]
            topic = f"bench-tls-kafka-{mode}-{'warm' if index < 0 else index}"
            settle_disk()
            bench.create_topic(topic, PARTITIONS, 3)
            try:
                got = _kafka_run(bench, *setup[mode], topic, 20_000 if index < 0 else KAFKA_RECORDS)
            finally:
                bench.delete_topic(topic)
            if index >= 0:
                runs[mode].append(got)
            say(f"tls: Kafka ProducerPerformance {'warm-up' if index < 0 else f'round {index + 1}'} "
                f"{'SSL' if mode == 'tls' else 'PLAINTEXT'}: {got['mbs']:.1f} MB/s, p99 {got['p99_ms']:.0f} ms, "
                f"cluster CPU {got['cluster_cpu_s_gib'] or float('nan'):.2f} s/GiB, JVM {got['jvm_cpu_s']:.1f} s")
    return runs


# ---------------------------------------------------------------------------------------- figures

def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return "1 round"
    return f"median of {len(values)} rounds, range {min(values):.3g}–{max(values):.3g}"


def _pair(key: str, name: str, unit: str, per_mode: dict[str, list[float]], params: dict[str, Any]) -> list[Figure]:
    """One figure per mode (median of its rounds); the TLS one's ratio is TLS / plaintext."""
    figs = []
    medians = {m: statistics.median(v) for m, v in per_mode.items() if v}
    for mode in MODES:
        values = per_mode.get(mode) or []
        if not values:
            continue
        fig = Figure(key=f"{key}_{mode}", name=f"{name}, {'TLS (mutual)' if mode == 'tls' else 'plaintext'}",
                     value=medians[mode], unit=unit, note=_spread(values),
                     params={**params, "mode": mode, "rounds": values})
        if mode == "tls" and medians.get("plaintext"):
            fig.ratio, fig.ratio_of = medians["tls"] / medians["plaintext"], "plaintext (same run, alternating rounds)"
        figs.append(fig)
    return figs


def _cpu_cost(op: str, label: str, rounds: dict[str, list[dict[str, Any]]], params: dict[str, Any]) -> list[Figure]:
    """CPU s/GiB per mode (cluster + client) and the cost of TLS: the difference of the medians."""
    parts = ("total", "cluster", "client")
    med: dict[str, dict[str, float]] = {}
    per_mode: dict[str, list[float]] = {}
    for mode in MODES:
        cpus = [r[op]["cpu"] for r in rounds[mode] if r[op]["cpu"]]
        if not cpus:
            continue
        med[mode] = {p: statistics.median(c[p] for c in cpus) for p in parts}
        per_mode[mode] = [c["total"] for c in cpus]
        names = sorted({n for c in cpus for n in c} - set(parts))
        med[mode].update({n: statistics.median(c[n] for c in cpus if n in c) for n in names})
    figs = _pair(f"tls_{op}_cpu_s_gib", f"{label}: CPU per GiB, cluster + client", "CPU s/GiB", per_mode,
                 {**params, "median_per_process_s_gib": med})
    for f in figs:
        f.params["rounds_per_process_s_gib"] = [r[op]["cpu"] for r in rounds[f.params["mode"]]]
    for f in figs:
        m = med[f.params["mode"]]
        f.note += f"; medians of the parts: cluster {m['cluster']:.2f}, client {m['client']:.2f}"
    if "plaintext" in med and "tls" in med:
        plain, tls = med["plaintext"], med["tls"]
        cost = tls["total"] - plain["total"]
        figs.append(Figure(
            key=f"tls_{op}_cpu_cost_s_gib", name=f"{label}: cost of TLS, CPU per GiB (TLS − plaintext)", value=cost,
            unit="CPU s/GiB", ratio=cost / plain["total"] if plain["total"] else None,
            ratio_of="plaintext CPU per GiB (cluster + client)",
            note=f"cluster {tls['cluster'] - plain['cluster']:+.2f}, client {tls['client'] - plain['client']:+.2f} "
                 f"s/GiB; = {cost / plain['total'] * 100:+.0f} % of plaintext's {plain['total']:.2f}",
            params={**params, "plaintext": plain, "tls": tls}))
    return figs


def _kafka_figures(kafka: dict[str, list[dict[str, Any]]] | None, error: str,
                   common: dict[str, Any]) -> list[Figure]:
    label = "TLS bench: Kafka ProducerPerformance, RF 3 acks=all, PLAINTEXT vs SSL listener"
    if kafka is None:
        return [Figure(key="tls_kafka_perf_mbs_tls", name=label, value=None, unit="MB/s", status="info",
                       note=error)]
    params = {"tool": "kafka-producer-perf-test", "records": KAFKA_RECORDS, "record_bytes": idempotence.RECORD,
              "partitions": PARTITIONS, "producer": {**idempotence.PRODUCER_PROPS, "enable.idempotence": "true"},
              "rounds_per_mode": KAFKA_ROUNDS, "order": "ABBA after an unmeasured round",
              "runs": kafka, "load_average_1m": common.get("load_average_1m")}
    figs = _pair("tls_kafka_perf_mbs", label, "MB/s", {m: [r["mbs"] for r in kafka[m]] for m in MODES}, params)
    figs += _pair("tls_kafka_perf_p99_ms", f"{label}: p99", "ms", {m: [r["p99_ms"] for r in kafka[m]] for m in MODES},
                  {"see": "tls_kafka_perf_mbs_tls"})
    cpu = {m: [r["cluster_cpu_s_gib"] for r in kafka[m] if r["cluster_cpu_s_gib"] is not None] for m in MODES}
    figs += _pair("tls_kafka_perf_cluster_cpu_s_gib", f"{label}: cluster CPU per GiB", "CPU s/GiB", cpu,
                  {"see": "tls_kafka_perf_mbs_tls",
                   "jvm_cpu_s_gib_median": {m: statistics.median(r["jvm_cpu_s_gib"] for r in kafka[m]) for m in MODES}})
    if all(cpu.values()):
        plain, tls = statistics.median(cpu["plaintext"]), statistics.median(cpu["tls"])
        figs.append(Figure(key="tls_kafka_perf_cluster_cpu_cost_s_gib",
                           name=f"{label}: cost of SSL, cluster CPU per GiB (SSL − PLAINTEXT)", value=tls - plain,
                           unit="CPU s/GiB", ratio=(tls - plain) / plain if plain else None,
                           ratio_of="PLAINTEXT cluster CPU per GiB",
                           note=f"= {(tls - plain) / plain * 100:+.0f} % of PLAINTEXT's {plain:.2f}" if plain else "",
                           params={"see": "tls_kafka_perf_mbs_tls"}))
    return figs


def tls_figures(data_dir: Path, pool: Executor, *, quick: bool, processes: int, threads: int) -> list[Figure]:
    rounds_per_mode = 1 if quick else 5
    warmup_s, duration_s = (1.0, 2.0) if quick else (2.0, 8.0)
    connections = 20 if quick else 300
    load = {"processes": processes, "threads": threads, "warmup_s": warmup_s, "duration_s": duration_s}
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    load_at_start = os.getloadavg()[0]
    with ExitStack() as stack:
        benches = _start_clusters(stack, data_dir)
        conns = _connections(benches, connections)
        for mode in MODES:
            say(f"tls: warm-up round on the {mode} cluster (not measured)")
            _round(benches[mode], pool, mode, -1, **{**load, "warmup_s": 0.5, "duration_s": 1.0})
        for index in range(rounds_per_mode):
            order = MODES if index % 2 == 0 else MODES[::-1]
            for mode in order:
                rounds[mode].append(_round(benches[mode], pool, mode, index, **load))
        kafka: dict[str, list[dict[str, Any]]] | None = None
        kafka_error = ""
        if quick:
            kafka_error = "skipped in a quick run"
        elif not idempotence.TOOL.exists():
            kafka_error = f"{idempotence.TOOL} is missing: run 'make kafka-tools'"
        else:
            try:
                kafka = _kafka(benches, data_dir / "kafka")
            except Exception as exc:  # noqa: BLE001 - the gRPC figures stand without it
                kafka_error = f"error: {exc!r}"[:300]
                say(f"tls: Kafka clients failed: {exc!r}")
    common = {"rf": 3, "acks": -1, "batch_bytes": BATCH_BYTES, "record_bytes": RECORD_SIZE, "partitions": PARTITIONS,
              "processes": processes, "threads_per_process": threads, "warmup_s": warmup_s, "duration_s": duration_s,
              "rounds_per_mode": rounds_per_mode, "order": "ABBA, plaintext first",
              "load_average_1m": {"section_start": load_at_start, "section_end": os.getloadavg()[0],
                                  "round_starts": {m: [r["load_1m"] for r in rounds[m]] for m in MODES}},
              "tls": "ClusterConfig(tls=True): every gRPC port TLS 1.2+/1.3, mutual TLS between services; "
                     "clients present the admin certificate; EC P-256 keys"}
    consume_params = {**common, "partition_max_bytes": FETCH_BYTES, "page_cache": "warm (just produced)"}
    label_p, label_c = "TLS bench: produce RF 3 acks=all, 1 MiB batches", "TLS bench: consume (Fetch from leaders)"
    figs: list[Figure] = []
    figs += _pair("tls_produce_mbs", label_p, "MB/s", {m: [r["produce"]["mbs"] for r in rounds[m]] for m in MODES},
                  {**common, "errors": {m: sum(r["produce"]["errors"] for r in rounds[m]) for m in MODES}})
    for q in ("p50", "p99"):
        figs += _pair(f"tls_produce_{q}_ms", f"{label_p}: request {q}", "ms",
                      {m: [r["produce"][f"{q}_ms"] for r in rounds[m] if r["produce"][f"{q}_ms"] is not None]
                       for m in MODES}, common)
    figs += _cpu_cost("produce", label_p, rounds, common)
    figs += _pair("tls_consume_mbs", label_c, "MB/s", {m: [r["consume"]["mbs"] for r in rounds[m]] for m in MODES},
                  consume_params)
    figs += _cpu_cost("consume", label_c, rounds, consume_params)
    figs += _kafka_figures(kafka, kafka_error, common)
    conn_params = {"connections_per_mode": connections, "to": "replica 0", "alternating": True}
    for mode in MODES:
        c = conns[mode]
        name = (f"TLS bench: new gRPC connection + first call, "
                f"{'TLS (mutual)' if mode == 'tls' else 'plaintext'}")
        fig = Figure(key=f"tls_connect_p50_ms_{mode}", name=name + ", p50", value=c["p50_ms"], unit="ms",
                     note=f"p99 {c['p99_ms']:.2f} ms over {c['n']}; the call alone on an open channel p50 "
                          f"{c['open_channel_call_p50_ms']:.2f} ms", params={**conn_params, **c})
        cpu = Figure(key=f"tls_connect_cpu_ms_{mode}", name=name + ", CPU per connection (replica + client)",
                     value=c["cpu_ms"], unit="CPU ms",
                     note=f"replica {c['server_cpu_ms']:.2f} + client {c['client_cpu_ms']:.2f}",
                     params={**conn_params, **c})
        if mode == "tls" and conns["plaintext"]["p50_ms"]:
            fig.ratio, fig.ratio_of = c["p50_ms"] / conns["plaintext"]["p50_ms"], "plaintext p50"
        if mode == "tls" and conns["plaintext"]["cpu_ms"]:
            cpu.ratio, cpu.ratio_of = c["cpu_ms"] / conns["plaintext"]["cpu_ms"], "plaintext"
        figs += [fig, cpu]
    return figs
