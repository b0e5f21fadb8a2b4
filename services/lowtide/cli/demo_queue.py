"""The main job's queue step (`lowtide demo`): a topic read as a queue by a KIP-932 share group, its
disk drained as the group acknowledges (docs/design/kip-932-share-groups.md#deleted-once-delivered).

Topic ``queue`` (RF 3, the demo's small segments) names the share group ``workers`` in
``consumed.retention.groups`` (``share:workers``, with ``consumed.retention.ms`` 0). The group's
``share.auto.offset.reset`` is set to earliest (a group config, as Kafka's share consumer tools set
it), the records are produced, and two workers (``ShareConsumer`` members of ``workers``, one
thread each, implicit acknowledgement) take them until every record was delivered. Each record goes
to one worker while its acquisition lock runs; an acknowledgement moves the group's start offset,
and the leader's retention pass deletes the segments below it on every replica.

The step reports each worker's count, the records delivered more than once (none unless a lock ran
out), the log start offsets, high watermarks and bytes on disk per replica before and after, and
the time from the workers' last acknowledgement (their close) until every replica's log starts at
its end. It never asserts on time; ``drained`` says whether the log starts reached the ends.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from lowtide.client.admin import Admin
from lowtide.client.producer import Producer
from lowtide.client.replica import ReplicaClient
from lowtide.client.share_consumer import ShareConsumer
from lowtide.localcluster import LocalCluster

QUEUE = "queue"
SHARE_GROUP = "workers"
WORKERS = 2
RECORD_SIZE = 1024
DRAIN_WAIT_S = 30.0


def snapshot_topic(cluster: LocalCluster, admin: Admin, topic: str) -> dict[int, dict]:
    """Per partition of ``topic``: LSO/HW/LW from the leader, and bytes on disk on every replica."""
    out: dict[int, dict] = {}
    replicas = ReplicaClient(channels=admin.channels)
    for entry in cluster.services("replica"):
        for info in replicas.describe_logs(entry.grpc, timeout_s=10).logs:
            if info.topic != topic:
                continue
            row = out.setdefault(info.partition, {"bytes": {}})
            row["bytes"][f"replica-{entry.index}"] = bytes_on_disk(Path(info.dir))
            if info.role == "leader":
                row.update(lso=info.log_start_offset, hw=info.high_watermark, lw=info.low_watermark,
                           leader=info.leader)
    return out


def bytes_on_disk(path: Path) -> int:
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except FileNotFoundError:
        return 0


def _log_starts(cluster: LocalCluster, admin: Admin) -> dict[tuple[int, str], tuple[int, int]]:
    """(partition, replica) -> (log start offset, high watermark) of ``queue`` on every replica."""
    replicas = ReplicaClient(channels=admin.channels)
    return {(info.partition, entry.name): (info.log_start_offset, info.high_watermark)
            for entry in cluster.services("replica")
            for info in replicas.describe_logs(entry.grpc, timeout_s=10).logs if info.topic == QUEUE}


def run_queue_step(*, cluster: LocalCluster, admin: Admin, records: int, partitions: int,
                   say: Callable[[str], None]) -> dict:
    """The step (module doc); returns its document."""
    admin.create_topic(QUEUE, partitions=partitions, replication_factor=3, config={
        "consumed.retention.ms": "0", "consumed.retention.groups": f"share:{SHARE_GROUP}"})
    admin.alter_group_config(SHARE_GROUP, set_config={"share.auto.offset.reset": "earliest"})
    time.sleep(0.5)  # leaders elected before the first produce
    with Producer(cluster.bootstrap) as producer:
        per_partition = [records // partitions + (1 if p < records % partitions else 0) for p in range(partitions)]
        for p, count in enumerate(per_partition):
            for start in range(0, count, 500):
                producer.produce_values(QUEUE, [b"q" * RECORD_SIZE] * min(500, count - start), partition=p)
    before = snapshot_topic(cluster, admin, QUEUE)
    say(f"{records:,} records in '{QUEUE}'; {WORKERS} workers of share group '{SHARE_GROUP}' take them")

    lock = threading.Lock()
    delivered: Counter[tuple[int, int]] = Counter()
    per_worker = [0] * WORKERS
    everything = threading.Event()
    errors: list[str] = []
    deadline = time.monotonic() + 120
    # Both members join before either takes anything, and each fetch takes at most 100 records:
    # otherwise the first to join may have emptied a small queue before the second is assigned.
    joined = threading.Barrier(WORKERS, timeout=30)

    def work(index: int) -> None:
        try:
            with ShareConsumer(cluster.bootstrap, group_id=SHARE_GROUP, client_id=f"worker-{index}",
                               max_records=100) as consumer:
                consumer.subscribe([QUEUE])
                joined.wait()
                while not everything.is_set() and time.monotonic() < deadline:
                    got = consumer.poll(max_wait_ms=200)
                    with lock:
                        per_worker[index] += len(got)
                        delivered.update((r.partition, r.offset) for r in got)
                        if len(delivered) >= records:
                            everything.set()
                # Leaving the block closes the member: the last poll's records are accepted then.
        except Exception as err:  # noqa: BLE001 - reported in the step's document
            errors.append(f"worker-{index}: {err!r}")
            everything.set()

    threads = [threading.Thread(target=work, args=(i,), name=f"demo-worker-{i}") for i in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acknowledged_at = time.monotonic()
    say(f"workers took {', '.join(f'{n:,}' for n in per_worker)} records; waiting for the disk to drain")
    ends = {p: row["hw"] for p, row in before.items()}
    drained_after = None
    while time.monotonic() - acknowledged_at < DRAIN_WAIT_S:
        starts = _log_starts(cluster, admin)
        if starts and all(start == ends.get(p) for (p, _), (start, _) in starts.items()):
            drained_after = time.monotonic() - acknowledged_at
            break
        time.sleep(0.02)
    after = snapshot_topic(cluster, admin, QUEUE)
    return {"topic": QUEUE, "group": SHARE_GROUP, "records": records, "workers": per_worker,
            "delivered": len(delivered), "delivered_more_than_once": sum(1 for n in delivered.values() if n > 1),
            "errors": errors, "drained": drained_after is not None,
            "drained_ms_after_last_ack": None if drained_after is None else round(drained_after * 1000, 1),
            "partitions": [{"partition": p, "before": {k: before[p][k] for k in ("lso", "hw", "lw")},
                            "after": {k: after[p][k] for k in ("lso", "hw", "lw")},
                            "bytes_before": before[p]["bytes"], "bytes_after": after[p]["bytes"]}
                           for p in sorted(before)]}


def render_queue_step(q: dict) -> list[str]:
    """The step's lines in the demo's summary."""
    mib = 1024 * 1024
    lines = [f"Queue '{q['topic']}' (share group '{q['group']}', consumed.retention.groups=share:{q['group']}): "
             f"{q['records']:,} records, workers took {' + '.join(f'{n:,}' for n in q['workers'])}, "
             f"{q['delivered_more_than_once']} delivered more than once"]
    for r in q["partitions"]:
        b, a = r["before"], r["after"]
        disk = "  ".join(f"{k[-1]}: {r['bytes_before'][k] / mib:5.1f} -> {r['bytes_after'].get(k, 0) / mib:5.1f}"
                         for k in sorted(r["bytes_before"]))
        lines.append(f"  partition {r['partition']}: LSO {b['lso']} -> {a['lso']} (HW {a['hw']}) | disk MiB {disk}")
    if q["errors"]:
        lines.append("NOT AS EXPECTED: " + "; ".join(q["errors"]))
    if q["drained"]:
        lines.append(f"Every replica's log starts at its end {q['drained_ms_after_last_ack']} ms after the workers' "
                     "last acknowledgement: what the share group was done with is deleted.")
    else:
        lines.append("NOT AS EXPECTED: the queue's log start offsets did not reach the ends.")
    return lines
