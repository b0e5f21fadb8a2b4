"""Cluster metadata in etcd: topics, partition leadership and ISR, brokers and their liveness, the
controller lease and dynamic broker configs. The only module that spells a metadata key.

Why etcd: an existing Raft store (the one Kubernetes runs on) whose writes are acknowledged only
once a majority committed them, with compare-and-set by revision, leases and watches. Redis, which
held this before, forgot it all when emptied and the replicas then deleted every log
(docs/design/metadata.md).

Key layout (under ``root``, ``/lowtide/`` by default)::

    cluster_id                      the cluster's id (created once; every write compares it)
    topics/{topic}                  TopicInfo JSON
    partitions/{topic}/{p}          PartitionState JSON (one key per partition: ISR changes of two
                                    partitions never contend)
    brokers/{id}                    BrokerInfo JSON (last registration)
    alive/{id}                      incarnation, attached to the broker's session lease: a broker is
                                    *live* while the key exists (etcd deletes it when the lease
                                    expires: Kafka's broker session)
    controller                      owner of the controller role, attached to its lease
    broker_configs/{id|default}     JSON of a broker's dynamic configs (KIP-73 throttle rates)
    acls/ scram/ tokens/ quotas/    the sections of lowtide.metadata.sections (security, quotas,
    producer_ids/ transactions/     producer ids, transactions, diskless shards): records other
    shards/                         packages keep here, written with the same guard
    deleted_topics/{topic_id}       {"name", "deleted_ms"} for a topic deleted through the API, kept
                                    for a week (lease): replicas delete its partitions; a partition
                                    of a topic the metadata neither names nor lists here is stray

Reads are served from the process's ``MetadataImage`` (kept current by a watch; see image.py), so
they cost no round trip and keep working while etcd is unreachable. Writes go to etcd in one
transaction each, compared against the cluster id (a store that is empty or another cluster's
refuses them all), and return once the image shows them (a process reads its own writes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from lowtide.clock import now_ms
from lowtide.errors import (
    FencedLeaderEpoch,
    InvalidPartitions,
    InvalidReplicationFactor,
    InvalidRequest,
    InvalidTopic,
    InvalidUpdateVersion,
    LowtideError,
    MetadataStoreUnavailable,
    RequestTimedOut,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from lowtide.metadata.etcd import (
    TLS_URL_SCHEME,
    URL_SCHEME,
    EtcdClient,
    KeyValue,
    delete_op,
    get_op,
    if_missing,
    if_mod_revision,
    if_value,
    put_op,
    txn_op,
)
from lowtide.metadata.image import Listener, MetadataImage
from lowtide.metadata.model import BrokerInfo, IsrChange, PartitionState, TopicInfo
from lowtide.tls.config import ClientTls

DEFAULT_ROOT = "/lowtide/"
TOPIC_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
# How long the record of a topic deleted through the API is kept: a replica down longer than this
# sets the topic's partitions aside as stray instead of deleting them.
DELETED_TOPIC_TTL_S = 7 * 24 * 3600
# A write waits this long for the watch to show it (normally a millisecond).
OWN_WRITE_WAIT_S = 5.0
# Partitions changed in one etcd write (each a nested transaction): within etcd's default
# --max-txn-ops (lowtide.metadata.etcd.MAX_TXN_OPS), so an external etcd at its defaults takes it.
PARTITIONS_PER_TXN = 100


def validate_topic_name(name: str) -> None:
    if not name or name in (".", "..") or len(name) > 249 or not set(name) <= TOPIC_NAME_CHARS:
        raise InvalidTopic(f"invalid topic name {name!r}: use 1-249 of [a-zA-Z0-9._-]")


def assign_replicas(*, broker_ids: Iterable[int], partitions: int, replication_factor: int,
                    start: int = 0, racks: Mapping[int, str] | None = None) -> list[list[int]]:
    """Round-robin placement: partition p's replicas start at broker start+p; the first is the
    preferred leader, so leaders spread evenly.

    Rack-aware when every broker has a rack (``racks``, the replicas' ``--rack``), as Kafka's
    rack-aware assignment: the brokers are listed alternating racks (a0, b0, c0, a1, b1, ...), and
    each partition takes, walking that list from its start, first one broker of each rack it has
    no replica on yet, then any broker it lacks. So the replicas of a partition span
    min(replication factor, racks) racks, and a rack's outage takes at most
    ceil(RF / racks) of them. Brokers without a rack (some or all): rack-unaware, as plain Kafka
    clusters are."""
    brokers = sorted(broker_ids)
    if replication_factor < 1 or replication_factor > len(brokers):
        raise InvalidReplicationFactor(
            f"replication factor {replication_factor} must be between 1 and the {len(brokers)} live brokers")
    if partitions < 1:
        raise InvalidPartitions(f"number of partitions must be >= 1, got {partitions}")
    n = len(brokers)
    if not racks or not all(racks.get(b) for b in brokers) or len({racks[b] for b in brokers}) < 2:
        return [[brokers[(start + p + i) % n] for i in range(replication_factor)] for p in range(partitions)]
    by_rack: dict[str, list[int]] = {}
    for b in brokers:
        by_rack.setdefault(racks[b], []).append(b)
    columns = [by_rack[r] for r in sorted(by_rack)]
    arranged = [column[i] for i in range(max(map(len, columns))) for column in columns if i < len(column)]
    out = []
    for p in range(partitions):
        order = [arranged[(start + p + i) % n] for i in range(n)]
        chosen: list[int] = []
        for b in order:  # one per rack first
            if len(chosen) < replication_factor and racks[b] not in {racks[c] for c in chosen}:
                chosen.append(b)
        for b in order:  # then any broker not chosen yet
            if len(chosen) < replication_factor and b not in chosen:
                chosen.append(b)
        out.append(chosen)
    return out


class MetadataStore:
    """Reads (from the image) and writes (to etcd) the cluster metadata (module doc: layout).

    Thread-safe: the etcd client is, the image is (image.py), and the per-key decode memo is a
    dict whose races only decode a value twice. ``close()`` once at the end.
    """

    def __init__(self, *, client: EtcdClient, root: str = DEFAULT_ROOT, owns_client: bool = True) -> None:
        self.client = client
        self.root = root if root.endswith("/") else root + "/"
        self.image = MetadataImage(client, prefix=self.root)
        self._owns_client = owns_client
        self._decoded: dict[str, tuple[KeyValue, object]] = {}
        self._leases: dict[str, int] = {}  # "broker:{id}" / "controller:{owner}" -> lease id
        self._lease_lock = threading.Lock()
        self._cluster_id: str | None = None

    @classmethod
    def from_url(cls, url: str, *, root: str = DEFAULT_ROOT, tls: ClientTls | None = None) -> MetadataStore:
        """On the etcd of ``url`` (``etcds://``: over TLS with ``tls``, else the process's own
        certificate: ``EtcdClient.from_url``)."""
        return cls(client=EtcdClient.from_url(url, tls=tls), root=root)

    @property
    def url(self) -> str:
        return self.client.url

    def close(self) -> None:
        self.image.stop()
        if self._owns_client:
            self.client.close()

    # -- keys -------------------------------------------------------------------------------------
    def _k(self, *parts: object) -> str:
        return self.root + "/".join(str(p) for p in parts)

    @property
    def cluster_id_key(self) -> str:
        return self._k("cluster_id")

    # -- the image --------------------------------------------------------------------------------
    def start(self, *, timeout_s: float = 10.0) -> None:
        """Load the image (first reads do this themselves); raises MetadataStoreUnavailable."""
        self.image.start(timeout_s=timeout_s)

    def listen(self, listener: Listener) -> None:
        """Call ``listener(changed keys)`` after every change the image applies (watch thread)."""
        self.image.listen(listener)

    def connected(self) -> bool:
        """True while the image follows etcd (its watch is connected)."""
        return self.image.connected()

    def _img(self) -> MetadataImage:
        if not self.image.loaded.is_set():
            self.image.start()
        return self.image

    def _decode(self, key: str, factory: Callable[[bytes], object]):
        kv = self._img().get(key)
        if kv is None:
            return None
        memo = self._decoded.get(key)
        if memo is not None and memo[0] is kv:  # the same record object: not replaced since
            return memo[1]
        value = factory(kv.value)
        self._decoded[key] = (kv, value)
        return value

    def _decode_under(self, prefix: str, factory: Callable[[bytes], object]) -> list:
        out = []
        for kv in self._img().under(prefix):
            memo = self._decoded.get(kv.key)
            if memo is not None and memo[0] is kv:
                out.append(memo[1])
                continue
            value = factory(kv.value)
            self._decoded[kv.key] = (kv, value)
            out.append(value)
        return out

    def sync(self, *, timeout_s: float = 2.0) -> bool:
        """Catch the image up with etcd (False when etcd did not answer: the image is as it was)."""
        return self._img().sync(timeout_s=timeout_s)

    def version(self) -> int:
        """The store revision the image reflects: it moves on every metadata change."""
        return self._img().revision

    # -- writing ----------------------------------------------------------------------------------
    def _guard(self) -> list:
        """The comparison every write carries: the store is still this cluster's."""
        return [if_value(self.cluster_id_key, self.cluster_id().encode())]

    def _commit(self, compare: list, success: list, *, what: str, read_on_failure: Sequence[str] = ()):
        """One transaction guarded by the cluster id; waits until the image shows it. When a
        comparison fails, ``result.reads[1:]`` hold the keys of ``read_on_failure`` as etcd has
        them then (what the image may not show yet)."""
        result = self.client.txn([*self._guard(), *compare], success,
                                 [*self._read_guard_op(), *(get_op(key) for key in read_on_failure)])
        if not result.succeeded and result.reads and not result.reads[0]:
            raise MetadataStoreUnavailable(f"{what}: the metadata store no longer holds cluster id "
                                           f"{self.cluster_id()} (emptied or replaced): refusing to write")
        if not result.succeeded and result.reads and result.reads[0][0].value.decode() != self.cluster_id():
            raise MetadataStoreUnavailable(f"{what}: the metadata store belongs to cluster "
                                           f"{result.reads[0][0].value.decode()}, not {self.cluster_id()}")
        if result.succeeded:
            self._see_own_write(result.revision)
        return result

    def _see_own_write(self, revision: int) -> None:
        """Wait until the image shows a write of ours. A watch that does not bring it within a
        second follows a member that stopped answering (the write itself failed over): it moves."""
        if self.image.wait_for(revision, timeout_s=1.0):
            return
        self.image.sync(timeout_s=OWN_WRITE_WAIT_S / 2)
        self.image.wait_for(revision, timeout_s=OWN_WRITE_WAIT_S / 2)

    def _read_guard_op(self) -> list:
        return [get_op(self.cluster_id_key)]

    # -- cluster id -------------------------------------------------------------------------------
    def stored_cluster_id(self) -> str | None:
        """The cluster id the image holds (None: the store has none)."""
        kv = self._img().get(self.cluster_id_key)
        return kv.value.decode() if kv is not None else None

    def cluster_id(self) -> str:
        """The cluster's id, created on first use when the store has none (every reader agrees:
        the creation is a put-if-absent)."""
        if self._cluster_id is not None:
            return self._cluster_id
        current = self.stored_cluster_id()
        if current is None:
            self.create_cluster_id(uuid.uuid4().hex)
            # Whoever won the put-if-absent, etcd has the id now: read it there (the image may be a
            # moment behind on a loaded machine).
            kv = self.client.get(self.cluster_id_key)
            if kv is None:
                raise MetadataStoreUnavailable("the metadata store did not keep the cluster id")
            current = kv.value.decode()
        self._cluster_id = current
        return current

    def adopt_cluster_id(self, cluster_id: str) -> None:
        """Use ``cluster_id`` (checked against the data directory at start-up) in every write's
        guard, whatever the store says later."""
        self._cluster_id = cluster_id

    def create_cluster_id(self, cluster_id: str) -> bool:
        """Set the cluster id if the store has none; True if this call set it."""
        result = self.client.txn([if_missing(self.cluster_id_key)], [put_op(self.cluster_id_key, cluster_id.encode())])
        if result.succeeded:
            self._see_own_write(result.revision)
        return result.succeeded

    # -- brokers ----------------------------------------------------------------------------------
    def register_broker(self, info: BrokerInfo, *, incarnation: str, session_timeout_ms: int) -> None:
        """Publish ``info`` and open a session: a fresh lease of ``session_timeout_ms`` (rounded up
        to whole seconds, at least 2: etcd's granularity) holding ``alive/{id}``."""
        ttl = max(2, math.ceil(session_timeout_ms / 1000))
        lease = self.client.grant_lease(ttl)
        with self._lease_lock:
            old = self._leases.pop(f"broker:{info.id}", None)
            self._leases[f"broker:{info.id}"] = lease
        self._commit([], [put_op(self._k("brokers", info.id), info.to_json().encode()),
                          put_op(self._k("alive", info.id), incarnation.encode(), lease=lease)],
                     what=f"registering broker {info.id}")
        if old is not None:
            self.client.revoke_lease(old)

    def heartbeat(self, broker_id: int, *, incarnation: str, session_timeout_ms: int) -> bool:
        """Renew the broker's session; False when it is gone (expired while the process was
        paused, or never opened here): the caller registers again."""
        with self._lease_lock:
            lease = self._leases.get(f"broker:{broker_id}")
        if lease is None:
            return False
        if self.client.keep_alive(lease) <= 0:
            return False
        kv = self._img().get(self._k("alive", broker_id))
        return kv is not None and kv.value == incarnation.encode()

    def unregister_broker(self, broker_id: int, *, incarnation: str) -> None:
        with self._lease_lock:
            lease = self._leases.pop(f"broker:{broker_id}", None)
        if lease is not None:
            self.client.revoke_lease(lease, timeout_s=2.0)

    def brokers(self) -> dict[int, BrokerInfo]:
        return {b.id: b for b in self._decode_under(self._k("brokers", ""), BrokerInfo.from_json)}

    def broker_racks(self) -> dict[int, str]:
        """Broker id -> its ``--rack`` ("" for none), for rack-aware placement."""
        return {b: info.rack for b, info in self.brokers().items()}

    def live_broker_ids(self, candidates: Iterable[int] | None = None) -> set[int]:
        prefix = self._k("alive", "")
        alive = {int(kv.key[len(prefix):]) for kv in self._img().under(prefix)}
        return alive if candidates is None else alive & set(candidates)

    def live_broker_incarnations(self) -> dict[int, str]:
        """Live broker id -> the incarnation its session was opened with (a new one per process
        start: the controller tells a restart from a broker that stayed up)."""
        prefix = self._k("alive", "")
        return {int(kv.key[len(prefix):]): kv.value.decode() for kv in self._img().under(prefix)}

    # -- topics -----------------------------------------------------------------------------------
    def create_topic(self, *, name: str, partitions: int, replication_factor: int,
                     config: dict[str, str], diskless: bool = False,
                     assignment: list[list[int]], topic_id: str | None = None,
                     diskless_shards: list[int] | None = None,
                     live: Iterable[int] | None = None) -> TopicInfo:
        """Create topic ``name`` with one partition per ``assignment`` entry (its replicas, the first
        the preferred leader). Each partition's ISR is its replicas, or with ``live`` given (an
        assignment the client chose, which may name a broker that is down) the live ones among
        them, in order, and its leader the first of those (Kafka's controller does the same)."""
        validate_topic_name(name)
        alive = None if live is None else set(live)
        info = TopicInfo(name=name, topic_id=topic_id or uuid.uuid4().hex, partitions=partitions,
                         replication_factor=replication_factor, config=dict(config), diskless=diskless,
                         created_ms=now_ms(), diskless_shards=list(diskless_shards or []))
        ops = [put_op(self._k("topics", name), info.to_json().encode())]
        for p, replicas in enumerate(assignment):
            isr = tuple(replicas) if alive is None else tuple(r for r in replicas if r in alive)
            state = PartitionState(topic=name, partition=p, leader=isr[0], leader_epoch=0,
                                   replicas=tuple(replicas), isr=isr, partition_epoch=0)
            ops.append(put_op(self._k("partitions", name, p), state.to_json().encode()))
        # Leftover partition keys of an older topic of this name cannot exist: deletion removes
        # them in the same transaction as the topic key.
        key = self._k("topics", name)
        result = self._commit([if_missing(key)], ops, what=f"creating topic {name}", read_on_failure=[key])
        if not result.succeeded:
            # A retry (the member that committed our first attempt failed before answering) finds
            # its own topic id: created, not a name taken by someone else. Read in the same
            # transaction: the image may not show the first attempt yet (its watch may be on the
            # member that failed).
            [kv] = result.reads[1] or [None]
            if kv is not None and TopicInfo.from_json(kv.value).topic_id == info.topic_id:
                self._see_own_write(kv.mod_revision)
                return info
            raise TopicAlreadyExists(f"topic '{name}' already exists")
        return info

    def delete_topic(self, name: str) -> None:
        """Remove the topic and its partitions, and record the deletion (module doc) so replicas
        delete its logs rather than set them aside."""
        for _ in range(10):
            kv = self._img().get(self._k("topics", name))
            if kv is None:
                self.sync()
                kv = self._img().get(self._k("topics", name))
                if kv is None:
                    raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
            info = TopicInfo.from_json(kv.value)
            lease = self.client.grant_lease(DELETED_TOPIC_TTL_S)
            record = json.dumps({"name": name, "deleted_ms": now_ms()}).encode()
            result = self._commit([if_mod_revision(kv.key, kv.mod_revision)],
                                  [delete_op(kv.key), delete_op(self._k("partitions", name, ""), prefix=True),
                                   put_op(self._k("deleted_topics", info.topic_id), record, lease=lease)],
                                  what=f"deleting topic {name}")
            if result.succeeded:
                return
            self.client.revoke_lease(lease)
            self.sync()
        raise RequestTimedOut(f"topic '{name}': changed under too many concurrent writers; retry")

    def deleted_topic_ids(self) -> set[str]:
        """Ids of topics deleted through the API (within the last week)."""
        prefix = self._k("deleted_topics", "")
        return {kv.key[len(prefix):] for kv in self._img().under(prefix)}

    def topics(self) -> dict[str, TopicInfo]:
        return {t.name: t for t in self._decode_under(self._k("topics", ""), TopicInfo.from_json)}

    def topic(self, name: str) -> TopicInfo:
        return self.topic_record(name)[1]

    def topic_record(self, name: str) -> tuple[bytes, TopicInfo]:
        """The topic's stored record as read (for ``add_partitions``' compare) and decoded. A name
        the image lacks is looked up after catching up with etcd (it may be a moment old)."""
        key = self._k("topics", name)
        kv = self._img().get(key)
        if kv is None:
            self.sync()
            kv = self._img().get(key)
            if kv is None:
                raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
        return kv.value, self._decode(key, TopicInfo.from_json) or TopicInfo.from_json(kv.value)

    def update_topic_config(self, name: str, change: Callable[[TopicInfo], dict[str, str]], *,
                            dry_run: bool = False) -> TopicInfo:
        """Set the topic's config to ``change(current topic)``; returns the topic as written.

        A compare-and-set on the topic record's revision, retried when another writer got in
        between (``change`` is called again on what it wrote), so two concurrent changes to
        different keys both land. Replicas learn the new config from their watch. ``change`` may
        raise (the LowtideError propagates, nothing is written); ``dry_run`` computes without
        writing.
        """
        key = self._k("topics", name)
        for _ in range(20):
            self.topic_record(name)
            kv = self._img().get(key)
            if kv is None:
                raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
            current = TopicInfo.from_json(kv.value)
            updated = dataclasses.replace(current, config=dict(change(current)))
            if dry_run or updated.config == current.config:
                return updated
            if self._commit([if_mod_revision(key, kv.mod_revision)], [put_op(key, updated.to_json().encode())],
                            what=f"changing topic {name}'s config").succeeded:
                return updated
            self.sync()
        raise RequestTimedOut(f"topic '{name}': its config changed under too many concurrent writers; retry")

    def add_partitions(self, *, expected: bytes, topic: TopicInfo, assignment: Sequence[Sequence[int]],
                       diskless_shards: Sequence[int] = ()) -> TopicInfo | None:
        """Grow ``topic`` (as read, ``expected`` its stored bytes) by ``len(assignment)`` partitions
        (classic: one replica list each) or ``len(diskless_shards)`` (diskless: their shards).
        Returns the topic as written, or None when its record changed since it was read (the
        caller reads again and decides again). Partitions are only ever added at the end."""
        added = len(diskless_shards) if topic.diskless else len(assignment)
        grown = dataclasses.replace(topic, partitions=topic.partitions + added,
                                    diskless_shards=[*topic.diskless_shards, *diskless_shards])
        key = self._k("topics", topic.name)
        compare = [if_value(key, expected)]
        ops = [put_op(key, grown.to_json().encode())]
        for i, replicas in enumerate(assignment):
            p = topic.partitions + i
            state = PartitionState(topic=topic.name, partition=p, leader=replicas[0], leader_epoch=0,
                                   replicas=tuple(replicas), isr=tuple(replicas), partition_epoch=0)
            compare.append(if_missing(self._k("partitions", topic.name, p)))
            ops.append(put_op(self._k("partitions", topic.name, p), state.to_json().encode()))
        if self._commit(compare, ops, what=f"adding partitions to {topic.name}").succeeded:
            return grown
        self.sync()
        if self._img().get(key) is None:
            raise UnknownTopicOrPartition(f"topic '{topic.name}' does not exist")
        return None

    # -- partitions -------------------------------------------------------------------------------
    def partition_states(self, topic: str) -> list[PartitionState]:
        states = self._decode_under(self._k("partitions", topic, ""), PartitionState.from_json)
        return sorted(states, key=lambda s: s.partition)

    def all_partition_states(self) -> dict[tuple[str, int], PartitionState]:
        states = self._decode_under(self._k("partitions", ""), PartitionState.from_json)
        return {(s.topic, s.partition): s for s in states}

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        key = self._k("partitions", topic, partition)
        state = self._decode(key, PartitionState.from_json)
        if state is None:
            self.sync()
            state = self._decode(key, PartitionState.from_json)
            if state is None:
                raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
        return state

    def compare_and_set_partition(self, expected: PartitionState, new: PartitionState) -> bool:
        """Write ``new`` if the stored state still has ``expected.partition_epoch``."""
        [written] = self.compare_and_set_partitions([(expected, new)])
        if not written and self._img().get(self._k("partitions", new.topic, new.partition)) is None:
            raise UnknownTopicOrPartition(f"{new.topic}-{new.partition} does not exist")
        return written

    def compare_and_set_partitions(self, changes: Sequence[tuple[PartitionState, PartitionState]]) -> list[bool]:
        """For each ``(expected, new)``: write ``new`` if the stored state still has
        ``expected.partition_epoch``; returns, in order, whether each was written (a partition
        that no longer exists is not).

        Many partitions go in one etcd write (up to ``PARTITIONS_PER_TXN``), each under its own
        compare-and-set (``txn_op``): a leader's ISR changes after a broker left, or the
        controller's elections after one died, cost a few writes instead of one per partition,
        as Kafka's AlterPartition and the controller's batched records do. Without this, 2,000
        partitions changed one write at a time kept a replica busy for tens of seconds, long
        enough for its own broker session to lapse under load (docs/design/metadata.md)."""
        outcome = [False] * len(changes)
        pending: list[tuple[int, str, int, PartitionState]] = []
        for i, (expected, new) in enumerate(changes):
            key = self._k("partitions", new.topic, new.partition)
            kv = self._img().get(key)
            if kv is None:
                self.sync()
                kv = self._img().get(key)
                if kv is None:
                    continue
            if PartitionState.from_json(kv.value).partition_epoch != expected.partition_epoch:
                continue
            pending.append((i, key, kv.mod_revision,
                            dataclasses.replace(new, partition_epoch=expected.partition_epoch + 1)))
        behind = False
        for start in range(0, len(pending), PARTITIONS_PER_TXN):
            chunk = pending[start:start + PARTITIONS_PER_TXN]
            ops = [txn_op([if_mod_revision(key, rev)], [put_op(key, new.to_json().encode())])
                   for _, key, rev, new in chunk]
            result = self._commit([], ops, what=f"changing {len(chunk)} partitions")
            for (i, _, _, _), one in zip(chunk, result.nested, strict=True):
                outcome[i] = one.succeeded
                behind |= not one.succeeded
        if behind:
            self.sync()  # the image was behind: the callers' retries read the current states
        return outcome

    def update_isr(self, *, topic: str, partition: int, leader: int, leader_epoch: int,
                   isr: Iterable[int], expected_partition_epoch: int | None = None) -> PartitionState:
        """A leader changes its ISR (Kafka's AlterPartition). Fenced if leadership moved.

        ``expected_partition_epoch`` is the partition epoch of the leader's own view; when the
        stored record moved on since (a reassignment started or finished, KIP-455), the leader's
        ISR was computed over a replica set that may no longer be the partition's, so the change
        is refused with INVALID_UPDATE_VERSION and the leader retries after it reconciled (Kafka's
        AlterPartition does the same). The ISR written never names a broker outside ``replicas``,
        and every other field (a move in progress) is kept as stored.
        """
        [answer] = self.update_isrs([IsrChange(topic=topic, partition=partition, leader=leader,
                                               leader_epoch=leader_epoch, isr=tuple(isr),
                                               expected_partition_epoch=expected_partition_epoch)])
        if isinstance(answer, LowtideError):
            raise answer
        return answer

    def update_isrs(self, changes: Sequence[IsrChange]) -> list[PartitionState | LowtideError]:
        """``update_isr`` for many partitions in few etcd writes: per change, in order, the state
        written (its new partition epoch included) or the error that refused it
        (FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION, UNKNOWN_TOPIC_OR_PARTITION)."""
        answers: list[PartitionState | LowtideError | None] = [None] * len(changes)
        todo = list(range(len(changes)))
        for _ in range(10):
            batch: list[tuple[int, PartitionState, PartitionState]] = []
            for i in todo:
                c = changes[i]
                try:
                    cur = self.partition_state(c.topic, c.partition)
                except UnknownTopicOrPartition as exc:
                    answers[i] = exc
                    continue
                if cur.leader != c.leader or cur.leader_epoch != c.leader_epoch:
                    answers[i] = FencedLeaderEpoch(
                        f"{c.topic}-{c.partition}: leader {c.leader} epoch {c.leader_epoch} is stale "
                        f"(now leader {cur.leader} epoch {cur.leader_epoch})")
                    continue
                if c.expected_partition_epoch is not None and cur.partition_epoch != c.expected_partition_epoch:
                    answers[i] = InvalidUpdateVersion(
                        f"{c.topic}-{c.partition}: partition epoch {c.expected_partition_epoch} is stale "
                        f"(now {cur.partition_epoch})")
                    continue
                isr = tuple(sorted(r for r in set(c.isr) if r in cur.replicas))
                batch.append((i, cur, dataclasses.replace(cur, isr=isr)))
            written = self.compare_and_set_partitions([(cur, new) for _, cur, new in batch])
            todo = []
            for (i, cur, new), ok in zip(batch, written, strict=True):
                if ok:
                    answers[i] = dataclasses.replace(new, partition_epoch=cur.partition_epoch + 1)
                else:
                    todo.append(i)  # lost a race (or the image was behind): read again
            if not todo:
                break
        for i in todo:
            c = changes[i]
            answers[i] = FencedLeaderEpoch(f"{c.topic}-{c.partition}: ISR update lost too many races")
        return answers  # type: ignore[return-value]

    # -- controller lease -------------------------------------------------------------------------
    def try_acquire_controller(self, owner: str, *, lease_ms: int) -> bool:
        """Take or keep the controller role: ``controller`` holds ``owner`` under a lease of
        ``lease_ms`` (whole seconds, at least 2) that this call renews."""
        key = self._k("controller")
        with self._lease_lock:
            lease = self._leases.get(f"controller:{owner}")
        if lease is not None and self.client.keep_alive(lease) > 0:
            kv = self._img().get(key)
            if kv is not None and kv.value == owner.encode():
                return True
        if lease is None or self.client.keep_alive(lease) <= 0:
            lease = self.client.grant_lease(max(2, math.ceil(lease_ms / 1000)))
            with self._lease_lock:
                self._leases[f"controller:{owner}"] = lease
        result = self.client.txn([*self._guard(), if_missing(key)], [put_op(key, owner.encode(), lease=lease)])
        if result.succeeded:
            self._see_own_write(result.revision)
            return True
        kv = self._img().get(key)
        return kv is not None and kv.value == owner.encode() and kv.lease in (0, lease)

    # -- dynamic broker configs (KIP-73 throttle rates) -------------------------------------------
    def _config_key(self, broker: str) -> str:
        return self._k("broker_configs", broker or "default")

    def broker_configs(self) -> dict[str, dict[str, str]]:
        """Every stored dynamic broker config: broker id as a string ("" = the cluster default)
        -> its keys; brokers with none are absent."""
        prefix = self._k("broker_configs", "")
        out = {}
        for kv in self._img().under(prefix):
            name = kv.key[len(prefix):]
            out["" if name == "default" else name] = json.loads(kv.value)
        return out

    def broker_config(self, broker: str) -> dict[str, str]:
        """The dynamic configs set on ``broker`` itself ("" = the cluster default); {} for none."""
        kv = self._img().get(self._config_key(broker))
        return dict(json.loads(kv.value)) if kv is not None else {}

    def effective_broker_config(self, broker_id: int) -> dict[str, str]:
        """What applies to ``broker_id``: the cluster default overridden by its own keys."""
        return {**self.broker_config(""), **self.broker_config(str(broker_id))}

    def update_broker_config(self, broker: str, change: Callable[[dict[str, str]], dict[str, str]], *,
                             dry_run: bool = False) -> dict[str, str]:
        """Set ``broker``'s dynamic configs ("" = the cluster default) to ``change(current)``;
        returns them as written. A compare-and-set on the stored entry, retried when another
        writer got in between (``change`` is called again); an empty result removes the entry.
        Replicas re-read their rates from their watch. ``change`` may raise (nothing is written);
        ``dry_run`` computes without writing."""
        key = self._config_key(broker)
        for _ in range(20):
            kv = self._img().get(key)
            current = dict(json.loads(kv.value)) if kv is not None else {}
            updated = dict(change(dict(current)))
            if dry_run or updated == current:
                return updated
            compare = [if_mod_revision(key, kv.mod_revision) if kv is not None else if_missing(key)]
            op = put_op(key, json.dumps(updated, sort_keys=True).encode()) if updated else delete_op(key)
            if self._commit(compare, [op], what=f"changing broker config {broker or 'default'}").succeeded:
                return updated
            self.sync()
        raise RequestTimedOut(f"broker config {broker or '<default>'!s}: changed under too many concurrent writers; "
                              "retry")


def import_cluster(store: MetadataStore, *, cluster_id: str, topics: Sequence[TopicInfo],
                   states: Sequence[PartitionState], brokers: Sequence[BrokerInfo],
                   broker_configs: Mapping[str, Mapping[str, str]]) -> dict[str, int]:
    """Write a cluster's metadata read from elsewhere (``lowtide metadata migrate``) into an empty
    store, or complete an earlier import of the same cluster: keys already there are kept as they
    are (put if absent), so running it twice changes nothing. Refuses a store of another cluster.
    Returns how many keys of each kind were written."""
    current = store.stored_cluster_id()
    if current is not None and current != cluster_id:
        raise InvalidRequest(f"the metadata store belongs to cluster {current}, not {cluster_id}: refusing to import")
    store.create_cluster_id(cluster_id)
    store.adopt_cluster_id(cluster_id)
    wanted: list[tuple[str, str, bytes]] = [("topics", store._k("topics", t.name), t.to_json().encode())
                                            for t in topics]
    wanted += [("partitions", store._k("partitions", s.topic, s.partition), s.to_json().encode()) for s in states]
    wanted += [("brokers", store._k("brokers", b.id), b.to_json().encode()) for b in brokers]
    wanted += [("broker_configs", store._config_key(name), json.dumps(dict(c), sort_keys=True).encode())
               for name, c in broker_configs.items() if c]
    written = {"topics": 0, "partitions": 0, "brokers": 0, "broker_configs": 0}
    store.sync()
    for kind, key, value in wanted:
        if store.image.get(key) is not None:
            continue
        if store._commit([if_missing(key)], [put_op(key, value)], what=f"importing {key}").succeeded:
            written[kind] += 1
    return written


def metadata_url(endpoints: Sequence[str], *, tls: bool) -> str:
    """The ``--metadata-url`` of etcd members at ``endpoints`` (host:port): ``etcds://`` with TLS."""
    return (TLS_URL_SCHEME if tls else URL_SCHEME) + ",".join(endpoints)


def etcd_member_health(endpoint: str, *, timeout_s: float = 1.0, tls: ClientTls | None = None) -> str:
    """"SERVING" once the etcd member at ``endpoint`` answers and its cluster has a leader, else
    what is wrong (for ``lowtide cluster up``'s health wait). ``tls``: the member speaks (mutual)
    TLS, dialled with these settings."""
    client = EtcdClient([endpoint], timeout_s=timeout_s,
                        credentials=tls.channel_credentials() if tls is not None else None)
    try:
        status = client.status(endpoint, timeout_s=timeout_s)
        return "SERVING" if status.leader else "no etcd leader yet"
    except MetadataStoreUnavailable as exc:
        return f"etcd not answering: {exc.message}"
    finally:
        client.close()


__all__ = ["DEFAULT_ROOT", "MetadataStore", "assign_replicas", "etcd_member_health", "import_cluster",
           "validate_topic_name"]
