"""Concurrent clients that record a ``History``: acks=all producers, DeleteRecords callers, readers.

* Producers send one batch of fresh payload ids per call, acks=all, straight to the leader named by
  the metadata (with its leader epoch). Success -> ``produce_acked``. A retriable error refreshes the
  metadata and tries again with *new* ids (the old attempt may or may not be in the log: it is simply
  not acknowledged); anything else is counted and the loop goes on.
* The DeleteRecords caller (through the front door) deletes before an offset between the highest
  acknowledged low watermark and about a third of the way to the HW, so most acknowledged records
  stay checkable. Every attempt is recorded before it is sent, its LW when acknowledged.
* Readers fetch as consumers from the leader with its leader epoch (a deposed leader is fenced, as
  Kafka's KIP-320 consumers are): mostly forward scans, sometimes a probe below the LSO, plus
  ListOffsets earliest through the front door. Each answer is one ``ReadObs``.

Every worker is a daemon thread; ``stop()`` then ``join()``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from lowtide.client import Admin, ClusterMetadata, OffsetSpec
from lowtide.client.replica import ReplicaClient
from lowtide.errors import LowtideError, NetworkException
from lowtide.messages.replica import FetchPosition
from lowtide.record import decode_batches, encode_batch
from lowtide.rpc.channels import ChannelPool
from tests.chaos.checker import History, ReadObs, decode_id, encode_value

PRODUCE_TIMEOUT_MS = 4000
DELETE_TIMEOUT_MS = 4000


class _Clients:
    """One worker's own channels (a stuck channel never blocks another worker)."""

    def __init__(self, bootstrap: str, metadata: tuple[tuple[str, str], ...], topic: str) -> None:
        self.channels = ChannelPool()
        self.admin = Admin(bootstrap, metadata=metadata, channels=self.channels, timeout_s=10.0)
        self.replicas = ReplicaClient(channels=self.channels, metadata=metadata)
        self.meta = ClusterMetadata(self.admin, topics=[topic], max_age_s=2.0, min_refresh_interval_s=0.1)

    def leader(self, topic: str, partition: int) -> tuple[str, int]:
        snap = self.meta.snapshot()
        return snap.leader_address(topic, partition), snap.topic(topic).partitions[partition].leader_epoch

    def failed(self, err: LowtideError, address: str | None) -> None:
        if isinstance(err, NetworkException) and address:
            self.channels.forget(address)  # skip gRPC's reconnect backoff once the process is back
        try:
            self.meta.refresh()
        except LowtideError:
            pass

    def close(self) -> None:
        self.channels.close()


class Workload:
    def __init__(self, *, bootstrap: str, history: History, topic: str, partitions: int, seed: int,
                 producers: int = 2, deleters: int = 1, readers: int = 2, batch_records: int = 5,
                 delete_interval_s: tuple[float, float] = (1.5, 3.5), metadata: tuple[tuple[str, str], ...] = (),
                 say: Callable[[str], None] = lambda m: None) -> None:
        self.bootstrap, self.history, self.topic, self.partitions = bootstrap, history, topic, partitions
        self.metadata = metadata
        self.batch_records = batch_records
        self.delete_interval_s = delete_interval_s
        self.say = say
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self.threads: list[threading.Thread] = []
        for i in range(producers):
            self._add(f"producer-{i}", self._produce_loop, i)
        for i in range(deleters):
            self._add(f"deleter-{i}", self._delete_loop, i)
        for i in range(readers):
            self._add(f"reader-{i}", self._read_loop, i)
        self.crashes: list[str] = []

    def _add(self, name: str, target, index: int) -> None:
        rng = random.Random(self._rng.random())
        self.threads.append(threading.Thread(target=self._guard, args=(name, target, index, rng),
                                             name=f"chaos-{name}", daemon=True))

    def _guard(self, name: str, target, index: int, rng: random.Random) -> None:
        clients = _Clients(self.bootstrap, self.metadata, self.topic)
        try:
            target(clients, index, rng)
        except BaseException as exc:  # noqa: BLE001 - a harness bug: reported by the runner
            self.crashes.append(f"{name}: {exc!r}")
            self.say(f"workload {name} crashed: {exc!r}")
        finally:
            clients.close()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def _backoff(self, rng: random.Random) -> None:
        self._stop.wait(rng.uniform(0.05, 0.25))

    # -- producers -------------------------------------------------------------------------------
    def _produce_loop(self, c: _Clients, index: int, rng: random.Random) -> None:
        seq = 0
        h = self.history
        while not self._stop.is_set():
            partition = rng.randrange(self.partitions)
            ids = [f"p{index}-{seq + i}" for i in range(self.batch_records)]
            seq += self.batch_records
            data = encode_batch([encode_value(i, pad=rng.randrange(20, 400)) for i in ids])
            address = None
            try:
                address, epoch = c.leader(self.topic, partition)
                started = h.now()
                [res] = c.replicas.produce(address, [(self.topic, partition, data)], acks=-1,
                                           timeout_ms=PRODUCE_TIMEOUT_MS, deadline_s=PRODUCE_TIMEOUT_MS / 1000 + 3,
                                           leader_epochs={(self.topic, partition): epoch})
                if res.error is not None:
                    raise res.error
                h.produce_acked(self.topic, partition, res.base_offset, ids, started=started)
            except LowtideError as err:
                h.error(f"produce:{err.name}")
                c.failed(err, address)
                self._backoff(rng)

    # -- DeleteRecords ---------------------------------------------------------------------------
    def _delete_loop(self, c: _Clients, index: int, rng: random.Random) -> None:
        h = self.history
        while not self._stop.wait(rng.uniform(*self.delete_interval_s)):
            partition = rng.randrange(self.partitions)
            tp = (self.topic, partition)
            try:
                answer = c.admin.list_offsets({tp: OffsetSpec.LATEST})[tp]
                if answer.error is not None:
                    raise answer.error
                hw = answer.offset
                floor = h.low_watermark_floor(*tp)
                if hw - floor < 10:
                    continue
                target = floor + rng.randint(1, max(1, (hw - floor) // 3))
                started = h.delete_started(self.topic, partition, target)
                result = c.admin.delete_records({tp: target}, timeout_ms=DELETE_TIMEOUT_MS)[tp]
                if result.error is not None:
                    raise result.error
                h.delete_acked(self.topic, partition, target, result.low_watermark, started=started)
            except LowtideError as err:
                h.error(f"delete:{err.name}")
                c.failed(err, None)

    # -- readers ---------------------------------------------------------------------------------
    def _read_loop(self, c: _Clients, index: int, rng: random.Random) -> None:
        h = self.history
        positions = {p: 0 for p in range(self.partitions)}
        seen_hw = {p: 0 for p in range(self.partitions)}
        while not self._stop.is_set():
            partition = rng.randrange(self.partitions)
            roll = rng.random()
            address = None
            try:
                if roll < 0.1:
                    tp = (self.topic, partition)
                    started = h.now()
                    answer = c.admin.list_offsets({tp: OffsetSpec.EARLIEST})[tp]
                    if answer.error is not None:
                        raise answer.error
                    h.read(ReadObs(self.topic, partition, started, h.now(), log_start_offset=answer.offset,
                                   source="list_offsets"))
                    continue
                if roll < 0.25:  # a probe anywhere below the HW, the LSO region included
                    offset = rng.randint(0, max(0, seen_hw[partition]))
                else:
                    offset = positions[partition]
                c.meta.refresh()
                address, epoch = c.leader(self.topic, partition)
                started = h.now()
                [r] = c.replicas.fetch(address, [FetchPosition(
                    topic=self.topic, partition=partition, fetch_offset=offset, max_bytes=256 * 1024,
                    current_leader_epoch=epoch)], max_wait_ms=100, deadline_s=8)
                ended = h.now()
                if r.error is not None:
                    # OFFSET_OUT_OF_RANGE carries the leader's offsets: an LSO observation
                    if r.log_start_offset >= 0 and r.error.name == "OFFSET_OUT_OF_RANGE":
                        h.read(ReadObs(self.topic, partition, started, ended, fetch_offset=offset,
                                       log_start_offset=r.log_start_offset, high_watermark=r.high_watermark,
                                       source="fetch"))
                        if offset < r.log_start_offset:
                            positions[partition] = r.log_start_offset
                        elif offset > r.high_watermark >= 0:
                            positions[partition] = r.high_watermark
                    raise r.error
                records = tuple((rec.offset, decode_id(rec.value)) for _h, recs in decode_batches(r.records)
                                for rec in recs if rec.offset >= offset)
                h.read(ReadObs(self.topic, partition, started, ended, fetch_offset=offset, records=records,
                               log_start_offset=r.log_start_offset, high_watermark=r.high_watermark))
                seen_hw[partition] = max(seen_hw[partition], r.high_watermark)
                if records and offset == positions[partition]:
                    positions[partition] = records[-1][0] + 1
            except LowtideError as err:
                h.error(f"read:{err.name}")
                if err.name != "OFFSET_OUT_OF_RANGE":
                    c.failed(err, address)
                self._backoff(rng)
