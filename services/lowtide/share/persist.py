"""The durable share-partition state: ``__share_group_state``, written and read by the partition
leaders themselves through ``lowtide.internal_topics`` (no share coordinator in between: the design
page says why). Records: ``share/codec.py``.

* **Write**: one ShareSnapshot per change that must survive (acknowledgements), appended with
  acks=all to the partition of its key; ``write`` returns only once the in-sync replicas have it.
* **Read**: a leader taking a share-partition over folds that key's ``__share_group_state``
  partition up to its leader's high watermark, once that HW is settled (``grpc_settled``), and
  takes the latest snapshot (updates applied over it; a tombstone forgets it).
* **Create**: the topic is created on first need, compacted, RF = min(3, live brokers), with
  ``partitions`` partitions, straight in the metadata store (as the diskless coordinator creates
  its metadata log: a replica may not import the front door's topic admin).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from lowtide.client.replica import ReplicaClient
from lowtide.errors import CoordinatorNotAvailable, LeaderNotAvailable, LowtideError
from lowtide.internal_topics import (
    Appender,
    AppendPolicy,
    FoldReader,
    InternalTopic,
    InternalTopicSpec,
    grpc_fetch,
    grpc_produce,
    grpc_settled,
)
from lowtide.metadata.model import TopicInfo
from lowtide.metadata.store import MetadataStore, assign_replicas
from lowtide.record import decode_batches, encode_batch
from lowtide.share.codec import (
    SHARE_STATE_TOPIC,
    UPDATE_TYPE,
    ShareSnapshot,
    ShareStateKey,
    decode_key,
    decode_snapshot,
    encode_key,
    encode_snapshot,
    partition_for_key,
    reset_snapshot,
)
from lowtide.share.state import StateBatch

log = logging.getLogger(__name__)

DEFAULT_STATE_PARTITIONS = 8
MAX_REPLICATION_FACTOR = 3
TOPIC_CONFIG = {"cleanup.policy": "compact"}
FETCH_MAX_BYTES = 1 << 20


def _explain_give_up(where: str, problem: LowtideError) -> LowtideError:
    # Retriable for the client: it sends the acknowledgement again.
    return CoordinatorNotAvailable(f"{where} did not take the share state: {problem.name}: {problem.message}")


APPENDS = AppendPolicy(give_up=_explain_give_up)


@dataclass(frozen=True, slots=True)
class StateRecord:
    key: ShareStateKey
    value: ShareSnapshot | None  # None: a tombstone


class KeyFold:
    """One ``__share_group_state`` partition folded: the latest snapshot of each key.

    A snapshot written under an older leader epoch, or an older state epoch, than the one folded for
    its key is ignored (Kafka's share coordinator fences such a write): a deposed leader that has
    not noticed yet cannot put back a state its successor has moved past, nor a leader holding a
    state from before an admin's reset put it back. Not thread-safe (the reader locks it)."""

    def __init__(self, position: int = 0) -> None:
        self.position = position
        self.latest: dict[tuple[str, str, int], ShareSnapshot] = {}

    def apply_all(self, records: Iterable[StateRecord]) -> None:
        for r in records:
            k = (r.key.group_id, r.key.topic_id, r.key.partition)
            if r.value is None:
                self.latest.pop(k, None)
                continue
            base = self.latest.get(k)
            if base is not None and (r.value.leader_epoch < base.leader_epoch or
                                     (not r.value.is_update and r.value.state_epoch < base.state_epoch)):
                log.warning("share state from an older leader or state epoch ignored", extra={"fields": {
                    "group": r.key.group_id, "topic_id": r.key.topic_id, "partition": r.key.partition,
                    "leader_epoch": r.value.leader_epoch, "folded_leader_epoch": base.leader_epoch,
                    "state_epoch": r.value.state_epoch, "folded_state_epoch": base.state_epoch}})
                continue
            if r.value.is_update:
                if base is not None:  # an update applies over the snapshot it follows
                    self.latest[k] = _apply_update(base, r.value)
            else:
                self.latest[k] = r.value

    def advance(self, position: int) -> None:
        self.position = max(self.position, position)

    def reset(self, position: int) -> None:
        self.position = position
        self.latest.clear()


def _apply_update(base: ShareSnapshot, update: ShareSnapshot) -> ShareSnapshot:
    """Kafka's coordinator merge: the update's batches replace what they overlap, and the start
    offset moves up."""
    start = max(base.start_offset, update.start_offset)
    kept: list[StateBatch] = []
    for b in base.batches:
        for u in update.batches:
            if u.first <= b.last and b.first <= u.last:
                if b.first < u.first:
                    kept.append(StateBatch(b.first, u.first - 1, b.state, b.delivery_count))
                b = StateBatch(u.last + 1, b.last, b.state, b.delivery_count)
                if b.first > b.last:
                    break
        if b.first <= b.last:
            kept.append(b)
    merged = sorted([*kept, *update.batches], key=lambda b: b.first)
    merged = [b for b in merged if b.last >= start]
    return ShareSnapshot(snapshot_epoch=update.snapshot_epoch, state_epoch=base.state_epoch,
                         leader_epoch=update.leader_epoch, start_offset=start,
                         create_timestamp_ms=base.create_timestamp_ms, write_timestamp_ms=base.write_timestamp_ms,
                         batches=tuple(merged))


def decode_records(data: bytes, from_offset: int) -> list[StateRecord]:
    out = []
    for header, records in decode_batches(data):
        if header.is_control:
            continue
        for r in records:
            if r.offset < from_offset or r.key is None:
                continue
            key = decode_key(r.key)
            if key is None:
                continue
            value = None if r.value is None else decode_snapshot(r.value, record_type=key.record_type)
            if key.record_type == UPDATE_TYPE and value is None:
                continue
            out.append(StateRecord(key=key, value=value))
    return out


class _StateReader(FoldReader[KeyFold, StateRecord]):
    """The fold reader of ``__share_group_state`` with the look-ups the share-partitions need
    (thread-safe: under the reader's lock)."""

    def latest(self, partition: int, key: ShareStateKey) -> ShareSnapshot | None:
        with self._lock:
            return self._fold(partition).latest.get((key.group_id, key.topic_id, key.partition))

    def of_group(self, group_id: str) -> dict[tuple[str, int], ShareSnapshot]:
        with self._lock:
            return {(t, p): v for fold in self._folds.values() for (g, t, p), v in fold.latest.items()
                    if g == group_id}


class _Router:
    """The live leaders of ``__share_group_state``'s partitions, from the metadata store (the
    internal topics' ``LeaderRouter``; nothing cached, so stateless and thread-safe)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    def cached_leader(self, partition: int) -> str | None:
        return None

    def forget_leader(self, partition: int) -> None:
        pass

    def find_leader(self, partition: int, *, refresh: bool = False) -> str:
        state = self._store.partition_state(SHARE_STATE_TOPIC, partition)
        if state.leader < 0 or not self._store.live_broker_ids({state.leader}):
            raise LeaderNotAvailable(f"{SHARE_STATE_TOPIC}-{partition} has no live leader")
        broker = self._store.brokers().get(state.leader)
        if broker is None:
            raise LeaderNotAvailable(f"{SHARE_STATE_TOPIC}-{partition}: leader {state.leader} is not registered")
        return broker.address

    def route(self, partitions: list[int]) -> tuple[dict[str, list[int]], dict[int, str]]:
        by_address: dict[str, list[int]] = {}
        failed: dict[int, str] = {}
        for p in partitions:
            try:
                by_address.setdefault(self.find_leader(p), []).append(p)
            except LowtideError as err:
                failed[p] = f"{err.name}: {err.message}"
        return by_address, failed


class ShareStateLog:
    """``__share_group_state`` for the share-partition leaders of one replica (module doc).

    Contract: ``write`` returns once the snapshot is acknowledged by the in-sync replicas, or
    raises a retriable LowtideError (nothing is known written); ``read`` returns the latest
    snapshot of a key acknowledged before the call, or raises COORDINATOR_LOAD_IN_PROGRESS-like
    retriable errors when the partition cannot be read up to its high watermark now.

    Thread-safety: thread-safe (the fold reader locks its folds; the appender holds no state).
    """

    def __init__(self, *, store: MetadataStore, replicas: ReplicaClient,
                 partitions: int = DEFAULT_STATE_PARTITIONS, timeout_ms: int = 10_000) -> None:
        self._store = store
        self._timeout_ms = timeout_ms
        self._topic = InternalTopic(spec=InternalTopicSpec(name=SHARE_STATE_TOPIC, partitions=partitions,
                                                           config=TOPIC_CONFIG),
                                    store=store, create=self._create)
        self._router = _Router(store)
        self._appender = Appender(topic=SHARE_STATE_TOPIC, router=self._router,
                                  produce=grpc_produce(replicas, SHARE_STATE_TOPIC), policy=APPENDS)
        self._reader = _StateReader(new_fold=lambda _p: KeyFold(), decode=decode_records)
        self._fetch = grpc_fetch(replicas, SHARE_STATE_TOPIC, max_bytes=FETCH_MAX_BYTES,
                                 deadline_s=timeout_ms / 1000)
        self._settled = grpc_settled(replicas, SHARE_STATE_TOPIC, timeout_s=timeout_ms / 1000)

    def _create(self, spec: InternalTopicSpec) -> TopicInfo:
        live = sorted(self._store.live_broker_ids())
        if not live:
            raise LeaderNotAvailable(f"no live replica to host {spec.name}")
        rf = min(MAX_REPLICATION_FACTOR, len(live))
        assignment = assign_replicas(broker_ids=live, partitions=spec.partitions, replication_factor=rf,
                                     start=0, racks=self._store.broker_racks())
        return self._store.create_topic(name=spec.name, partitions=spec.partitions, replication_factor=rf,
                                        config=dict(spec.config), assignment=assignment)

    def _partition_of(self, key: ShareStateKey) -> int:
        count = self._topic.partition_count(create=True)
        assert count is not None
        return partition_for_key(key, partitions=count)

    def write(self, key: ShareStateKey, value: ShareSnapshot) -> None:
        partition = self._partition_of(key)
        batch = encode_batch([encode_snapshot(value)], keys=[encode_key(key)],
                             timestamp_ms=int(time.time() * 1000))
        self._appender.append(partition, batch, timeout_ms=self._timeout_ms)

    def reset(self, key: ShareStateKey, start_offset: int, now_ms: int) -> None:
        """An admin's reset of a share-partition (AlterShareGroupOffsets, ``lowtide share-groups
        reset``): a new state at ``start_offset`` with nothing in flight, under the next state
        epoch, so that a leader holding the old state in memory reloads it and a write of the old
        state epoch is fenced when read."""
        self.write(key, reset_snapshot(self.read(key), start_offset, now_ms))

    def delete_group(self, group_id: str, *, topic_ids: frozenset[str] | None = None) -> None:
        """Tombstone every share-partition state of ``group_id`` (DeleteGroups), or only those of
        ``topic_ids`` (DeleteShareGroupOffsets); acks=all."""
        count = self._topic.partition_count(create=False)
        if count is None:
            return
        for topic_id, partition in sorted(self.read_group(group_id)):
            if topic_ids is not None and topic_id not in topic_ids:
                continue
            key = ShareStateKey(group_id=group_id, topic_id=topic_id, partition=partition)
            batch = encode_batch([None], keys=[encode_key(key)], timestamp_ms=int(time.time() * 1000))
            self._appender.append(partition_for_key(key, partitions=count), batch, timeout_ms=self._timeout_ms)

    def read(self, key: ShareStateKey) -> ShareSnapshot | None:
        partition = self._partition_of(key)
        self._read_up([partition])
        return self._reader.latest(partition, key)

    def read_group(self, group_id: str) -> dict[tuple[str, int], ShareSnapshot]:
        """The latest snapshot of every share-partition of ``group_id`` ((topic id, partition) ->
        snapshot), reading every partition of the topic (none yet: nothing)."""
        count = self._topic.partition_count(create=False)
        if count is None:
            return {}
        self._read_up(list(range(count)))
        return self._reader.of_group(group_id)

    def _read_up(self, partitions: list[int]) -> None:
        deadline = time.monotonic() + self._timeout_ms / 1000
        while True:
            # Every read asks the leaders first whether their HW is settled: a share-partition loaded
            # from a fold read to a lagging HW (a state leader just elected or restarted) misses the
            # latest acknowledgements, and its records would be delivered again; a missing state
            # would even be written afresh, under a newer leader epoch, over the real one.
            failures = self._reader.read_to_high_watermark(partitions, route=self._router.route, fetch=self._fetch,
                                                           settled=self._settled)
            if not failures:
                return
            if time.monotonic() >= deadline:
                raise CoordinatorNotAvailable(f"cannot read {SHARE_STATE_TOPIC}: {failures}")
            time.sleep(0.1)
