"""The orphan scanner racing real writers, deletes and shard handovers (issue 14's randomized test).

Real processes: redis-server, 3 replicas, 2 coordinator shards, the scanner. In the test process:

* writers act as brokers: upload a WAL file (1-3 batches over 4 partitions, two per shard), then
  commit it to every shard it has batches for (owners: those shards, randomly permuted, so files
  are handed from owner to owner), each commit within the broker's contract (sent within the
  commit interval of the upload's start, deadline = append timeout); one upload in ten is never
  committed (a broker that died between upload and commit), and one file with two owners in ten
  is committed to its later owner only (a broker that died between its commits: the later owner
  must claim the file once no commit of it can be in flight, or it would be kept forever);
* a deleter moves partitions' log start forward (DeleteRecords), so coordinators release, hand
  over and delete files;
* a disrupter stops a shard for a moment (SIGSTOP/SIGCONT), and once restarts one (a new leader);
* the scanner is asked to scan (ScanNow, grace 3 s), round after round.

Afterwards: no file a shard knows was deleted by the scanner, no file with an acknowledged batch
was, every acknowledged batch at or above its partition's log start reads back byte for byte
(FindBatches, then a ranged get of its object), and once every record is deleted one last scan
leaves no orphan behind, and the shards themselves delete every file they know (claims
included). Rounds: LOWTIDE_ORPHAN_RACE_ROUNDS (default 200; 10000 by hand).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import grpc

from lowtide_pb import coordinator_pb2 as pb
from tests.integration.coordinator.dc import (
    create_partitions,
    delete_records,
    describe_files,
    find_batches,
    list_offset,
    new_topic_id,
    shard_stub,
)
from tests.integration.scanner.support import (
    APPEND_TIMEOUT_MS,
    COMMIT_INTERVAL_MS,
    GRACE_MS,
    SCANNER_ENV,
    scanner_client,
    store_of,
)

ROUNDS = int(os.environ.get("LOWTIDE_ORPHAN_RACE_ROUNDS", "200"))
WRITERS = 3
RECORDS_PER_BATCH = 5
PARTITIONS = {0: 0, 1: 0, 2: 1, 3: 1}  # partition -> shard
CRASH_RATE = 0.1
PARTIAL_RATE = 0.1
CLAIM_AFTER_MS = 3000  # > the commit interval + the commit deadline, as the coordinators require


@dataclass(frozen=True)
class AckedBatch:
    partition: int
    base_offset: int
    key: str
    byte_offset: int
    data: bytes


class Race:
    """Shared record of what the writers, the deleter and the scanner did (guarded by ``lock``)."""

    def __init__(self, cluster, topic_id: bytes) -> None:
        self.cluster = cluster
        self.topic_id = topic_id
        self.store = store_of(cluster)
        self.stubs = {0: shard_stub(cluster, 0), 1: shard_stub(cluster, 1)}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.uploaded: set[str] = set()
        self.abandoned: set[str] = set()
        self.partial: set[str] = set()  # committed to later owners only
        self.acked: list[AckedBatch] = []
        self.acked_keys: set[str] = set()
        self.scanner_deleted: set[str] = set()
        self.errors: list[str] = []

    # ---- a broker ----------------------------------------------------------------------------------
    def write(self, writer: int) -> None:
        rng = random.Random(writer * 7919 + int(time.time()))
        seq = 0
        while not self.stop.is_set():
            seq += 1
            key = f"wal/race/{writer}-{seq:06d}"
            batches, data = [], bytearray()
            for _ in range(rng.randint(1, 3)):
                part = rng.choice(list(PARTITIONS))
                chunk = os.urandom(rng.randint(40, 200))
                batches.append((part, len(data), bytes(chunk)))
                data += chunk
            owners = sorted({PARTITIONS[p] for p, _, _ in batches})
            rng.shuffle(owners)
            put_started = time.monotonic()
            self.store.put(key, bytes(data))
            with self.lock:
                self.uploaded.add(key)
            if rng.random() < CRASH_RATE or time.monotonic() - put_started > COMMIT_INTERVAL_MS / 1000:
                with self.lock:  # died after the upload, or too slow to commit within its contract
                    self.abandoned.add(key)
                continue
            deadline = put_started + (COMMIT_INTERVAL_MS + APPEND_TIMEOUT_MS) / 1000
            if len(owners) > 1 and rng.random() < PARTIAL_RATE:
                with self.lock:
                    self.partial.add(key)
                owners_reached = owners[1:]  # died before committing to the first owner
            else:
                owners_reached = owners
            for shard in owners_reached:
                mine = [b for b in batches if PARTITIONS[b[0]] == shard]
                self._commit(shard, key, len(data), owners, mine, deadline)
            time.sleep(rng.uniform(0, 0.02))

    def _commit(self, shard: int, key: str, size: int, owners: list[int], batches, deadline: float) -> None:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            return
        request = pb.DisklessCommitFileRequest(
            object_key=key, object_format=1, file_size=size, owner_ids=owners, uploader_broker_id=0,
            timeout_ms=int(timeout * 1000), batches=[pb.DisklessCommitBatch(
                magic=2, topic_id=self.topic_id, partition_index=part, byte_offset=offset, size=len(chunk),
                base_offset=0, last_offset=RECORDS_PER_BATCH - 1, batch_max_timestamp=int(time.time() * 1000),
                timestamp_type=0, producer_id=-1, producer_epoch=-1, base_sequence=-1, last_sequence=-1)
                for part, offset, chunk in batches])
        try:
            reply = self.stubs[shard].CommitFile(request, timeout=timeout)
        except grpc.RpcError:
            return  # outcome unknown: not acknowledged (the shard may still know the file)
        with self.lock:
            for (part, offset, chunk), result in zip(batches, reply.batches, strict=True):
                if result.error_code == 0:
                    self.acked.append(AckedBatch(part, result.assigned_base_offset, key, offset, chunk))
                    self.acked_keys.add(key)

    # ---- DeleteRecords -----------------------------------------------------------------------------
    def delete(self) -> None:
        rng = random.Random(4242)
        while not self.stop.wait(0.15):
            part = rng.choice(list(PARTITIONS))
            with self.lock:
                offsets = sorted(b.base_offset for b in self.acked if b.partition == part)
            if len(offsets) < 5:
                continue  # randrange(n // 2, n - 2) needs n >= 5: with 4 the range is empty
            target = offsets[rng.randrange(len(offsets) // 2, len(offsets) - 2)]
            try:
                self.stubs[PARTITIONS[part]].DeleteRecords(pb.DisklessDeleteRecordsRequest(topics=[
                    pb.DisklessDeleteRecordsTopic(topic_id=self.topic_id, partitions=[
                        pb.DisklessDeleteRecordsPartition(partition_index=part, offset=target)])]), timeout=5)
            except grpc.RpcError:
                pass  # a stopped shard: the next round deletes further

    # ---- shards stopping and changing leader ---------------------------------------------------------
    def disrupt(self, *, restart_after_s: float) -> None:
        rng = random.Random(99)
        began = time.monotonic()
        restarted = False
        while not self.stop.wait(rng.uniform(1.5, 3.0)):
            shard = rng.choice([0, 1])
            name = f"coordinator-{shard}"
            if not restarted and time.monotonic() - began > restart_after_s:
                restarted = True
                self.cluster.stop_service(name)  # a new process takes the lease and loads the shard
                self.cluster.start_service(name)
                continue
            self.cluster.pause(name)
            time.sleep(rng.uniform(0.3, 1.0))
            self.cluster.resume(name)


def run_threads(race: Race, targets) -> list[threading.Thread]:
    def guarded(fn, *args, **kwargs):
        def body():
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
                race.errors.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
                race.stop.set()
        return body
    threads = [threading.Thread(target=guarded(*t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    return threads


def known_by_any_shard(race: Race, keys: list[str]) -> tuple[set[str], set[str]]:
    """(known, with live batches) over both shards."""
    known, live = set(), set()
    for shard in (0, 1):
        for i in range(0, len(keys), 500):
            reply = describe_files(race.stubs[shard], keys[i:i + 500])
            for f in reply.files:
                assert f.error_code == 0, f
                if f.known:
                    known.add(f.object_key)
                if f.has_live_batches:
                    live.add(f.object_key)
    return known, live


def test_scans_racing_commits_deletes_and_handovers_never_delete_a_known_file_or_an_acknowledged_batch(
        cluster_factory):
    cluster = cluster_factory(replicas=3, coordinators=2, extra_env={
        **SCANNER_ENV, "LOWTIDE_LEASE_MS": "3000", "LOWTIDE_FILE_CLAIM_AFTER_MS": str(CLAIM_AFTER_MS)})
    topic_id = new_topic_id()
    for shard in (0, 1):
        create_partitions(shard_stub(cluster, shard), topic_id, "race",
                          [p for p, s in PARTITIONS.items() if s == shard])
    race = Race(cluster, topic_id)
    scanner = scanner_client(cluster)
    threads = run_threads(race, [*[(race.write, w) for w in range(WRITERS)], (race.delete,),
                                 (lambda: race.disrupt(restart_after_s=8.0),)])
    results = defaultdict(int)
    try:
        for _ in range(ROUNDS):
            if race.stop.is_set():
                break
            report = scanner.scan_now()
            results["ok" if report.ok else report.failure] += 1
            with race.lock:
                race.scanner_deleted |= set(report.deleted_keys)
            assert report.deleted == len(report.deleted_keys), "more deletes than keys reported: raise the cap"
            time.sleep(0.05)
    finally:
        race.stop.set()
        for t in threads:
            t.join(30)
        for shard in (0, 1):
            cluster.resume(f"coordinator-{shard}")
    assert not race.errors, race.errors
    print(f"rounds={ROUNDS} scans={dict(results)} uploaded={len(race.uploaded)} acked={len(race.acked)} "
          f"abandoned={len(race.abandoned)} partial={len(race.partial)} scanner_deleted={len(race.scanner_deleted)}")
    assert results["ok"] > 0

    # Nothing the shards know, nothing acknowledged, was deleted by the scanner.
    uploaded = sorted(race.uploaded)
    known, live = known_by_any_shard(race, uploaded)
    assert not (race.scanner_deleted & known), sorted(race.scanner_deleted & known)[:10]
    assert not (race.scanner_deleted & race.acked_keys), sorted(race.scanner_deleted & race.acked_keys)[:10]
    assert race.scanner_deleted <= set(uploaded) - race.acked_keys
    missing_live = [k for k in live if race.store.head(k) is None]
    assert not missing_live, missing_live[:10]

    # Every acknowledged batch still above its partition's log start reads back.
    for part, shard in PARTITIONS.items():
        stub = race.stubs[shard]
        start = list_offset(stub, topic_id, part, -2).offset
        found = {b.base_offset: b for b in find_batches(stub, topic_id, part, start, max_bytes=64 << 20).batches}
        for acked in (b for b in race.acked if b.partition == part and b.base_offset >= start):
            info = found.get(acked.base_offset)
            assert info is not None, f"acknowledged batch {acked.key}@{acked.base_offset} not found"
            assert (info.object_key, info.byte_offset, info.byte_size) == (acked.key, acked.byte_offset,
                                                                          len(acked.data))
            assert race.store.get(acked.key, offset=acked.byte_offset, length=len(acked.data)) == acked.data

    # Delete every record: the shards delete their files, and a last scan takes every orphan.
    for part, shard in PARTITIONS.items():
        latest = list_offset(race.stubs[shard], topic_id, part, -1).offset
        assert delete_records(race.stubs[shard], topic_id, part, latest).error_code == 0
    time.sleep(GRACE_MS / 1000)
    deadline = time.monotonic() + 30
    while not (last := scanner.scan_now()).ok and time.monotonic() < deadline:
        time.sleep(0.5)  # a shard restarted by the disrupter may still be loading
    assert last.ok, last
    with race.lock:
        race.scanner_deleted |= set(last.deleted_keys)
    left = list(race.store.list(prefix="wal/race/"))
    known_left, _ = known_by_any_shard(race, [o.key for o in left])
    # The scan's promise: no unknown file older than its threshold survives it. (Files a shard
    # still holds keep the threshold behind them, so younger orphans wait for a later scan.)
    stale_orphans = [o.key for o in left if o.key not in known_left and o.last_modified * 1000 < last.threshold_ms]
    assert not stale_orphans, stale_orphans[:10]
    print(f"after deleting every record: {len(left)} files left, {len(known_left)} known to a shard, "
          f"threshold {time.time() * 1000 - last.threshold_ms:.0f} ms ago")
    assert race.scanner_deleted and race.scanner_deleted <= set(uploaded) - race.acked_keys
    # With no record left, the shards hand over, claim and delete every file they know; files
    # committed to their later owner only are claimed once CLAIM_AFTER_MS has passed.
    deadline = time.monotonic() + (CLAIM_AFTER_MS + 500) / 1000 + 60
    while known_left := known_by_any_shard(race, uploaded)[0]:
        assert time.monotonic() < deadline, (f"{len(known_left)} files still known with no record left, "
                                             f"{len(known_left & race.partial)} of them partial commits: "
                                             f"{sorted(known_left)[:5]}")
        time.sleep(0.5)
    assert not [k for k in uploaded if k in race.acked_keys and race.store.head(k) is not None]
