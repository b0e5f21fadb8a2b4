"""Partition reassignment (KIP-455, issue 31): how fast a new replica copies a partition, with and
without a replication throttle (KIP-73).

A cluster of its own, 4 replicas: one partition RF 3 filled with ``size`` bytes (1 MiB batches,
acks=all), then moved so that the broker outside its replica set replaces one member. The adding
replica copies the whole log from the leader (from its log start offset) and the move completes
once it is in the ISR. Timed from AlterPartitionReassignments to the completed record in the
metadata (what ``kafka-reassign-partitions --verify`` waits for).

* ``reassign_copy_mbs``: the unthrottled copy rate, beside the sequential disk write of the same
  run (the copy writes every byte once on the new replica and reads it once on the leader);
* ``reassign_throttled_<rate>_mbs``: the copy with ``leader.replication.throttled.rate`` and
  ``follower.replication.throttled.rate`` set to ``rate`` on every broker and the topic's
  throttled-replica lists ``*``, as ``kafka-reassign-partitions --execute --throttle`` sets them;
  the ratio is achieved / configured (issue 31: within 10 %);
* ``reassign_copy_cpu_s_gib``: CPU seconds per GiB copied, summed over the four replicas, with the
  adding replica's and the leader's share in the params.
"""

from __future__ import annotations

import time
from pathlib import Path

from lowtide.metadata.store import MetadataStore
from lowtide_pb import admin_pb2, common_pb2
from tests.bench.common import (
    Bench,
    Figure,
    MiB,
    build_batch,
    cpu_ms,
    failed,
    running_cluster,
    say,
    wait_until,
)

TOPIC = "bench-reassign"
THROTTLE_KEYS = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
REPLICA_KEYS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")


def _alter_configs(bench: Bench, resource: str, ops: dict[str, str | None]) -> None:
    """SET (value) / DELETE (None) on a topic or a ``broker:<id>`` resource (``broker:`` = default)."""
    request = admin_pb2.AlterConfigsRequest(resources=[admin_pb2.AlterConfigsResource(topic=resource, ops=[
        admin_pb2.ConfigOp(key=k, op=admin_pb2.CONFIG_SET, value=v) if v is not None
        else admin_pb2.ConfigOp(key=k, op=admin_pb2.CONFIG_DELETE) for k, v in ops.items()])])
    result = bench.admin.AlterConfigs(request, timeout=30).results[0]
    if result.error_code:
        raise RuntimeError(f"AlterConfigs {resource}: {common_pb2.ErrorCode.Name(result.error_code)} "
                           f"{result.error_message}")


def set_throttle(bench: Bench, rate: int | None) -> None:
    """Throttle every broker's replication to ``rate`` bytes/s (None: remove the throttle)."""
    value = None if rate is None else str(rate)
    _alter_configs(bench, "broker:", dict.fromkeys(THROTTLE_KEYS, value))
    _alter_configs(bench, TOPIC, dict.fromkeys(REPLICA_KEYS, None if rate is None else "*"))


def _move(bench: Bench, store: MetadataStore, target: list[int], *, timeout_s: float) -> float:
    """Seconds from the Alter to the completed move."""
    began = time.monotonic()
    result = bench.admin.AlterPartitionReassignments(admin_pb2.AlterPartitionReassignmentsRequest(
        partitions=[admin_pb2.PartitionReassignment(topic=TOPIC, partition=0, replicas=target)]), timeout=30).results[0]
    if result.error_code:
        raise RuntimeError(f"AlterPartitionReassignments: {common_pb2.ErrorCode.Name(result.error_code)} "
                           f"{result.error_message}")

    def done() -> bool:
        st = store.partition_state(TOPIC, 0)
        return not st.reassigning and list(st.replicas) == target
    wait_until(done, timeout_s, f"the move of {TOPIC}-0 to {target}", interval_s=0.02)
    return time.monotonic() - began


def reassign_figures(data_dir: Path, *, quick: bool, disk_write_mbs: float | None) -> list[Figure]:
    size = (48 if quick else 200) * MiB
    rates = [10 * 1000 * 1000] if quick else [10 * 1000 * 1000, 50 * 1000 * 1000]
    figures: list[Figure] = []
    try:
        with running_cluster(data_dir, replicas=4,
                             replica_config={"segment.bytes": str(64 * MiB)}) as bench:
            store = MetadataStore.from_url(bench.cluster.metadata_url)
            bench.create_topic(TOPIC, 1, 3)
            batch, _count = build_batch(1 * MiB)
            for _ in range(size // MiB):
                bench.produce_all(TOPIC, {0: batch}, acks=-1)
            bench.wait_replicated(TOPIC, timeout_s=120)
            nbytes = size
            replicas = list(store.partition_state(TOPIC, 0).replicas)
            outside = next(b for b in sorted(bench.replicas) if b not in replicas)
            pids = {b: s.pid for b, s in bench.replicas.items()}

            # Unthrottled: the broker outside replaces the last member (not the leader).
            target = [*replicas[:-1], outside]
            before = {b: cpu_ms(p) or 0.0 for b, p in pids.items()}
            seconds = _move(bench, store, target, timeout_s=300)
            after = {b: cpu_ms(p) or 0.0 for b, p in pids.items()}
            mbs = nbytes / 1e6 / seconds
            cpu = {b: (after[b] - before[b]) / 1000 / (nbytes / (1 << 30)) for b in pids}
            leader = store.partition_state(TOPIC, 0).leader
            say(f"reassign: {nbytes / 1e6:.0f} MB copied to broker {outside} in {seconds:.2f}s = {mbs:.0f} MB/s")
            fig = Figure("reassign_copy_mbs", "reassignment copy rate, unthrottled", mbs, "MB/s",
                         params={"bytes": nbytes, "seconds": round(seconds, 3), "from": replicas, "to": target})
            if disk_write_mbs:
                fig.ratio, fig.ratio_of = mbs / disk_write_mbs, "sequential disk write"
            figures.append(fig.judge())
            figures.append(Figure(
                "reassign_copy_cpu_s_gib", "reassignment copy CPU, all replicas", sum(cpu.values()), "CPU s/GiB",
                params={"adding_replica": round(cpu[outside], 2), "leader": round(cpu.get(leader, 0.0), 2),
                        "per_broker": {str(b): round(v, 2) for b, v in cpu.items()}}).judge())

            # Throttled: move back and forth between the two brokers, one rate each time.
            moved_out, moved_in = replicas[-1], outside
            for rate in rates:
                set_throttle(bench, rate)
                current = list(store.partition_state(TOPIC, 0).replicas)
                target = [moved_out if r == moved_in else r for r in current]
                seconds = _move(bench, store, target, timeout_s=nbytes / rate * 3 + 60)
                set_throttle(bench, None)
                achieved = nbytes / seconds
                say(f"reassign: throttled at {rate / 1e6:.0f} MB/s: {nbytes / 1e6:.0f} MB in {seconds:.2f}s = "
                    f"{achieved / 1e6:.1f} MB/s ({achieved / rate:.2f} of the throttle)")
                fig = Figure(f"reassign_throttled_{rate // 1_000_000}_mbs",
                             f"reassignment copy rate, throttle {rate / 1e6:.0f} MB/s", achieved / 1e6, "MB/s",
                             target="within 10 % of the throttle", params={
                                 "bytes": nbytes, "seconds": round(seconds, 3), "throttle_bytes_s": rate})
                fig.ratio, fig.ratio_of = achieved / rate, "the configured throttle"
                fig.judge()
                fig.status = "pass" if abs(fig.ratio - 1) <= 0.10 else "falls short"
                figures.append(fig)
                moved_out, moved_in = moved_in, moved_out
            store.close()
    except Exception as exc:  # noqa: BLE001 - reported as an error figure, the suite goes on
        say(f"reassign: failed: {exc!r}")
        figures.append(failed("reassign_copy_mbs", "reassignment copy rate", "MB/s", None, exc))
    return figures
