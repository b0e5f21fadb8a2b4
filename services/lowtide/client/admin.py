"""``Admin``: the client of the front door's lowtide.v1.Admin service (Kafka's AdminClient)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from lowtide.auth.acl import AclBinding, AclFilter
from lowtide.client.metadata import (
    BrokerMetadata,
    ClusterMetadata,
    ClusterSnapshot,
    PartitionMetadata,
    TopicMetadata,
    topic_from_error,
)
from lowtide.client.replica import ReplicaClient
from lowtide.errors import InvalidRequest, LowtideError, UnknownTopicOrPartition, error_or_none
from lowtide.messages import TopicPartition
from lowtide.messages.admin import BROKER_RESOURCE_PREFIX, Deletion, GroupListing, Upsertion
from lowtide.messages.group_configs import group_resource
from lowtide.messages.replica import DeleteRecordsResult, PartitionOffset
from lowtide.rpc.channels import ChannelPool, PooledClient, call, validate_address
from lowtide.rpc.convert import acls as acls_convert
from lowtide.rpc.convert import scram as scram_convert
from lowtide.rpc.messages import delete_results_from_proto
from lowtide.tls.config import ClientTls
from lowtide_pb import admin_pb2, admin_pb2_grpc, common_pb2

if TYPE_CHECKING:
    from lowtide.messages.consumer_groups import ConsumerGroupDescription, ConsumerHeartbeat, ConsumerHeartbeatResult


class OffsetSpec:
    """ListOffsets timestamps with a meaning of their own (>= 0 means "first offset at or after")."""

    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3


# A ListOffsets answer (KIP-79) is the same whether the front door or a leader gives it; so is a
# DeleteRecords answer (KIP-107 ``DeleteDataResult``: ``DeleteRecordsResult``).
ListedOffset = PartitionOffset


# Kafka's ScramMechanism numbers (lowtide.v1.ScramMechanism).
SCRAM_MECHANISM_NAMES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}


@dataclass(frozen=True, slots=True)
class UserScramCredentials:
    """One user's SCRAM credentials as the front door describes them: (mechanism, iterations)
    pairs, never a key or salt."""

    user: str
    credentials: tuple[tuple[str, int], ...] = ()
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    """A partition move in progress (Kafka's OngoingPartitionReassignment): ``replicas`` is the
    target followed by the replicas being removed; ``adding`` joins, ``removing`` leaves once
    every adding replica is in the ISR."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str = ""
    error: LowtideError | None = None
    leader_epoch: int = -1  # committed with the offset (Kafka's committed_leader_epoch); -1: not known


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member as DescribeGroups shows it (metadata and assignment only while Stable)."""

    member_id: str
    group_instance_id: str = ""
    client_id: str = ""
    client_host: str = ""
    metadata: bytes = b""
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    group_id: str
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    error: LowtideError | None = None
    state: str = ""  # Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    protocol_type: str = ""
    protocol: str = ""
    members: tuple[GroupMember, ...] = ()


@dataclass(frozen=True, slots=True)
class ShareStartOffset:
    """A share-partition's durable state as ``__share_group_state`` holds it: its start offset and
    the offsets [first, last] past it already acknowledged or archived."""

    topic: str
    partition: int
    start_offset: int
    leader_epoch: int = 0
    finished: tuple[tuple[int, int], ...] = ()

    def lag(self, log_end: int) -> int:
        """Records from the start offset to ``log_end`` not yet acknowledged or archived (the
        lag DescribeShareGroupOffsets answers at a replica)."""
        done = sum(min(last, log_end - 1) - max(first, self.start_offset) + 1
                   for first, last in self.finished if last >= self.start_offset and first < log_end)
        return max(0, log_end - self.start_offset - done)


@dataclass(frozen=True, slots=True)
class JoinGroupResult:
    """JoinGroup's answer. ``error`` set means it failed; with MEMBER_ID_REQUIRED ``member_id`` is
    the id to join again with. ``members`` (member_id, group_instance_id, metadata) is the leader's only."""

    member_id: str
    generation_id: int = -1
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    members: tuple[tuple[str, str, bytes], ...] = ()
    error: LowtideError | None = None

    @property
    def is_leader(self) -> bool:
        return self.error is None and self.leader == self.member_id


@dataclass(frozen=True, slots=True)
class SyncGroupResult:
    assignment: bytes = b""
    protocol_type: str = ""
    protocol_name: str = ""
    error: LowtideError | None = None


def _worth_retrying(answer: ListedOffset | None) -> bool:
    # UNKNOWN_TOPIC_OR_PARTITION is retriable in Kafka's table too, but here it answers a name or
    # partition that does not exist far more often than a topic still being created: a typo must
    # not hang for the whole timeout.
    error = None if answer is None else answer.error
    return error is not None and error.retriable and not isinstance(error, UnknownTopicOrPartition)


class Admin(PooledClient):
    """Wraps every Admin RPC; whole-call failures raise ``LowtideError``, per-item ones come back
    inside the results. ``metadata`` is sent on every call (``authorization: Bearer ...``; see
    ``lowtide.auth.client_config.call_metadata``). Thread-safe; close it (or use ``with``).
    """

    def __init__(self, bootstrap: str, *, metadata: Sequence[tuple[str, str]] = (),
                 timeout_s: float = 30.0, channels: ChannelPool | None = None, tls: ClientTls | None = None) -> None:
        self.bootstrap = validate_address(bootstrap)  # before a pool exists that would leak
        super().__init__(channels=channels, metadata=metadata, tls=tls)
        self.timeout_s = timeout_s

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, name: str, request, *, timeout_s: float | None = None):
        """Admin RPC ``name`` with ``request`` at the bootstrap front door, with this client's token
        and deadline (``timeout_s``, default the client's); returns the response, raises the typed
        error of a failed call. For callers that build the request themselves (transactions.py)."""
        stub = self.channels.stub(self.bootstrap, admin_pb2_grpc.AdminStub)
        return call(getattr(stub, name), request, metadata=self.metadata, timeout=timeout_s or self.timeout_s)

    # -- topics ------------------------------------------------------------------------------
    def create_topics(self, topics: Sequence[Mapping], *,
                      validate_only: bool = False) -> dict[str, LowtideError | None]:
        """``topics``: dicts with name, partitions, replication_factor, config, diskless. Per-topic errors."""
        request = admin_pb2.CreateTopicsRequest(validate_only=validate_only, topics=[
            admin_pb2.TopicSpec(name=t["name"], partitions=int(t.get("partitions", 1)),
                                replication_factor=int(t.get("replication_factor", 0)),
                                config=dict(t.get("config") or {}), diskless=bool(t.get("diskless", False)))
            for t in topics])
        response = self.call("CreateTopics", request)
        return {r.name: error_or_none(r.error_code, r.error_message) for r in response.topics}

    def create_topic(self, name: str, *, partitions: int = 1, replication_factor: int = 0,
                     config: Mapping[str, str] | None = None, diskless: bool = False) -> None:
        """Create one topic or raise its error (TOPIC_ALREADY_EXISTS, INVALID_CONFIG, ...)."""
        errors = self.create_topics([{"name": name, "partitions": partitions, "replication_factor": replication_factor,
                                      "config": dict(config or {}), "diskless": diskless}])
        if errors.get(name) is not None:
            raise errors[name]

    def create_partitions(self, counts: Mapping[str, int], *,
                          assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
                          validate_only: bool = False) -> dict[str, LowtideError | None]:
        """Grow each topic to ``counts[topic]`` partitions (Kafka's CreatePartitions); optional
        replica lists for the new partitions. Per-topic errors (INVALID_PARTITIONS, ...)."""
        request = admin_pb2.CreatePartitionsRequest(validate_only=validate_only, topics=[
            admin_pb2.CreatePartitionsTopic(name=name, count=int(count), assignments=[
                admin_pb2.PartitionAssignment(broker_ids=list(replicas))
                for replicas in (assignments or {}).get(name, ())])
            for name, count in counts.items()])
        response = self.call("CreatePartitions", request)
        return {r.name: error_or_none(r.error_code, r.error_message) for r in response.topics}

    def elect_leaders(self, *, election_type: str = "preferred", partitions: Sequence[tuple[str, int]] | None = None,
                      ) -> dict[tuple[str, int], LowtideError | None]:
        """Kafka's ElectLeaders: ``preferred`` moves leadership to each partition's first replica;
        ``unclean`` (kept clean) elects where no leader is live. ``partitions`` None = all, and then
        only partitions an election was due for are answered. Per-partition errors
        (ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE, ...)."""
        types = {"preferred": 0, "unclean": 1}
        if election_type not in types:
            raise InvalidRequest(f"election type must be preferred or unclean, got {election_type!r}")
        request = admin_pb2.ElectLeadersRequest(election_type=types[election_type], partitions=[
            common_pb2.TopicPartition(topic=t, partition=p) for t, p in (partitions or ())])
        response = self.call("ElectLeaders", request)
        return {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in response.results}

    def alter_partition_reassignments(self, targets: Mapping[tuple[str, int], Sequence[int] | None], *,
                                      allow_replication_factor_change: bool = True,
                                      ) -> dict[tuple[str, int], LowtideError | None]:
        """Kafka's AlterPartitionReassignments (KIP-455): move each ``(topic, partition)`` to its
        target replica list (preferred leader first), or cancel its move when the target is None.
        Answers once the moves are recorded, not finished (``list_partition_reassignments``
        tells that). Per-partition errors (NO_REASSIGNMENT_IN_PROGRESS, INVALID_REPLICA_ASSIGNMENT,
        INVALID_REPLICATION_FACTOR, UNKNOWN_TOPIC_OR_PARTITION, ...); a refusal of the whole call
        (CLUSTER_AUTHORIZATION_FAILED) raises."""
        request = admin_pb2.AlterPartitionReassignmentsRequest(
            disallow_replication_factor_change=not allow_replication_factor_change,
            partitions=[admin_pb2.PartitionReassignment(topic=t, partition=p, replicas=list(target or ()),
                                                        cancel=target is None)
                        for (t, p), target in targets.items()])
        response = self.call("AlterPartitionReassignments", request)
        return {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in response.results}

    def list_partition_reassignments(self, partitions: Iterable[tuple[str, int]] | None = None,
                                     ) -> list[OngoingReassignment]:
        """The moves in progress among ``partitions`` (None: every partition), in the front
        door's order; a partition not moving is left out."""
        asked = list(partitions) if partitions is not None else None
        if asked is not None and not asked:
            return []  # the RPC reads an empty list as "every partition"
        response = self.call("ListPartitionReassignments", admin_pb2.ListPartitionReassignmentsRequest(
            partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in (asked or ())]))
        return [OngoingReassignment(topic=r.topic, partition=r.partition, replicas=tuple(r.replicas),
                                    adding=tuple(r.adding_replicas), removing=tuple(r.removing_replicas))
                for r in response.reassignments]

    def delete_topics(self, names: Sequence[str]) -> dict[str, LowtideError | None]:
        response = self.call("DeleteTopics", admin_pb2.DeleteTopicsRequest(names=list(names)))
        return {r.name: error_or_none(r.error_code, r.error_message) for r in response.topics}

    def delete_topic(self, name: str) -> None:
        error = self.delete_topics([name]).get(name)
        if error is not None:
            raise error

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        return list(self.call("ListTopics", admin_pb2.ListTopicsRequest(include_internal=include_internal)).names)

    def describe_cluster(self, topics: Sequence[str] = ()) -> ClusterSnapshot:
        """Brokers and topics (all non-internal ones when ``topics`` is empty)."""
        response = self.call("Metadata", admin_pb2.MetadataRequest(topics=list(topics)))
        brokers = {b.id: BrokerMetadata(id=b.id, host=b.host, port=b.port, rack=b.rack, live=b.live)
                   for b in response.brokers}
        out: dict[str, TopicMetadata] = {}
        for t in response.topics:
            if t.error_code:
                out[t.name] = topic_from_error(t.name, t.error_code, t.error_message)
                continue
            out[t.name] = TopicMetadata(
                name=t.name, replication_factor=t.replication_factor, config=dict(t.config), diskless=t.diskless,
                topic_id=t.topic_id,
                partitions=tuple(PartitionMetadata(partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                                                   replicas=tuple(p.replicas), isr=tuple(p.isr))
                                 for p in sorted(t.partitions, key=lambda p: p.partition)))
        return ClusterSnapshot(cluster_id=response.cluster_id, brokers=brokers, topics=out)

    def describe_topics(self, names: Sequence[str]) -> dict[str, TopicMetadata]:
        return self.describe_cluster(names).topics

    def alter_topic_config(self, topic: str, *, set_config: Mapping[str, str] | None = None,
                           delete_config: Iterable[str] = (), append_config: Mapping[str, str] | None = None,
                           subtract_config: Mapping[str, str] | None = None,
                           validate_only: bool = False) -> dict[str, str]:
        """Change one topic's config (Kafka's IncrementalAlterConfigs): set keys, return keys to
        their defaults, append to / subtract from list configs (cleanup.policy). All or nothing;
        returns the config after the change (as it would be, with ``validate_only``), or raises
        the topic's error (INVALID_CONFIG, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED, ...)."""
        ops = [admin_pb2.ConfigOp(key=k, op=admin_pb2.CONFIG_DELETE) for k in delete_config]
        for op, pairs in ((admin_pb2.CONFIG_SET, set_config), (admin_pb2.CONFIG_APPEND, append_config),
                          (admin_pb2.CONFIG_SUBTRACT, subtract_config)):
            ops += [admin_pb2.ConfigOp(key=k, op=op, value=v) for k, v in (pairs or {}).items()]
        response = self.call("AlterConfigs", admin_pb2.AlterConfigsRequest(
            validate_only=validate_only, resources=[admin_pb2.AlterConfigsResource(topic=topic, ops=ops)]))
        result = response.results[0]
        error = error_or_none(result.error_code, result.error_message)
        if error is not None:
            raise error
        return dict(result.config)

    def alter_broker_config(self, broker: int | None, *, set_config: Mapping[str, str] | None = None,
                            delete_config: Iterable[str] = (), validate_only: bool = False) -> dict[str, str]:
        """Change one broker's dynamic configs (the KIP-73 replication throttle rates; ``broker``
        None = the cluster-wide default), Kafka's IncrementalAlterConfigs on a BROKER resource:
        Admin.AlterConfigs on the resource named ``broker:<id>`` (``broker:`` for the default; no
        topic name has a colon). Returns the broker's dynamic configs after the change (with no
        change and ``validate_only``: as they are), or raises (POLICY_VIOLATION for a static key,
        CLUSTER_AUTHORIZATION_FAILED, ...)."""
        return self.alter_topic_config(f"{BROKER_RESOURCE_PREFIX}{'' if broker is None else broker}",
                                       set_config=set_config, delete_config=delete_config,
                                       validate_only=validate_only)

    def describe_broker_configs(self, brokers: Iterable[int]) -> dict[int, dict[str, str]]:
        """The dynamic configs set on each of ``brokers`` (an empty dict when none); a broker the
        front door refuses to describe (unknown id, no DESCRIBE_CONFIGS) is left out."""
        ids = list(brokers)
        response = self.call("AlterConfigs", admin_pb2.AlterConfigsRequest(validate_only=True, resources=[
            admin_pb2.AlterConfigsResource(topic=f"{BROKER_RESOURCE_PREFIX}{b}") for b in ids]))
        return {b: dict(r.config) for b, r in zip(ids, response.results, strict=True) if not r.error_code}

    # -- offsets and deletion ----------------------------------------------------------------
    def list_offsets(self, queries: Mapping[TopicPartition, int], *, isolation_level: int = 0,
                     timeout_s: float | None = None) -> dict[TopicPartition, ListedOffset]:
        """``{(topic, partition): timestamp}`` with OffsetSpec values or a time in ms; with
        ``isolation_level`` 1 (read_committed) LATEST is the last stable offset.

        A partition answering a retriable error (NOT_LEADER_OR_FOLLOWER or LEADER_NOT_AVAILABLE
        while its leadership moves, a replica restarting...) is asked again, with backoff, until
        ``timeout_s`` (default: this client's timeout), as Kafka's AdminClient retries until
        ``default.api.timeout.ms``; then its last error is returned with the other results."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        results: dict[TopicPartition, ListedOffset] = {}
        pending = dict(queries)
        backoff = 0.05
        while True:
            request = common_pb2.ListOffsetsRequest(isolation_level=isolation_level, partitions=[
                common_pb2.ListOffsetsPartition(topic=t, partition=p, timestamp=ts) for (t, p), ts in pending.items()])
            response = self.call("ListOffsets", request)
            for r in response.partitions:
                results[(r.topic, r.partition)] = ListedOffset(
                    topic=r.topic, partition=r.partition, offset=r.offset, timestamp=r.timestamp,
                    leader_epoch=r.leader_epoch, error=error_or_none(r.error_code, r.error_message))
            retry = {tp: ts for tp, ts in pending.items() if _worth_retrying(results.get(tp))}
            if not retry or time.monotonic() + backoff > deadline:
                return results
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
            pending = retry

    def delete_records(self, offsets: Mapping[TopicPartition, int] | Sequence[tuple[str, int, int]], *,
                       timeout_ms: int = 30_000) -> dict[TopicPartition, DeleteRecordsResult]:
        """KIP-107 ``deleteRecordsBefore``. A sequence of (topic, partition, offset) keeps duplicates,
        which the front door rejects as a whole with INVALID_REQUEST (raised here)."""
        items = [(t, p, o) for (t, p), o in offsets.items()] if isinstance(offsets, Mapping) else list(offsets)
        request = common_pb2.DeleteRecordsRequest(timeout_ms=timeout_ms, partitions=[
            common_pb2.DeleteRecordsPartition(topic=t, partition=p, offset=o) for t, p, o in items])
        response = self.call("DeleteRecords", request, timeout_s=timeout_ms / 1000 + 5)
        return {(r.topic, r.partition): r for r in delete_results_from_proto(response)}

    # -- groups ------------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int], *,
                       metadata: str = "", generation_id: int | None = None, member_id: str = "",
                       group_instance_id: str = "") -> dict[TopicPartition, LowtideError | None]:
        """Without ``generation_id`` (or -1): a standalone commit, refused (UNKNOWN_MEMBER_ID) while
        the group has members; with one, checked against the group's generation and members."""
        request = admin_pb2.OffsetCommitRequest(group_id=group_id, member_id=member_id,
                                                group_instance_id=group_instance_id, partitions=[
            admin_pb2.OffsetCommitPartition(topic=t, partition=p, offset=o, metadata=metadata)
            for (t, p), o in offsets.items()])
        if generation_id is not None:
            request.generation_id = generation_id
        response = self.call("OffsetCommit", request)
        return {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in response.partitions}

    def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] = (), *,
                      require_stable: bool = False) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets (-1 = none) of the partitions, or of all the group committed when empty.
        ``require_stable`` (KIP-447): read after the group's log is caught up to its high watermark,
        and a partition an undecided transaction holds offsets of is UNSTABLE_OFFSET_COMMIT."""
        request = admin_pb2.OffsetFetchRequest(group_id=group_id, require_stable=require_stable, partitions=[
            common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])
        response = self.call("OffsetFetch", request)
        return {(r.topic, r.partition): CommittedOffset(offset=r.offset, metadata=r.metadata,
                                                        error=error_or_none(r.error_code, r.error_message),
                                                        leader_epoch=r.leader_epoch)
                for r in response.partitions}

    def list_groups(self) -> list[str]:
        return list(self.call("ListGroups", admin_pb2.ListGroupsRequest()).group_ids)

    def list_group_listings(self) -> list[GroupListing]:
        """Every group with its protocol type and state (groups with members but no offsets too)."""
        response = self.call("ListGroups", admin_pb2.ListGroupsRequest())
        return [GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state)
                for g in response.groups]

    def describe_groups(self, group_ids: Sequence[str]) -> dict[str, GroupOffsets]:
        response = self.call("DescribeGroups", admin_pb2.DescribeGroupsRequest(group_ids=list(group_ids)))
        return {g.group_id: GroupOffsets(
            group_id=g.group_id, error=error_or_none(g.error_code, g.error_message),
            offsets={(o.topic, o.partition): CommittedOffset(offset=o.offset, metadata=o.metadata,
                                                             error=error_or_none(o.error_code, o.error_message))
                     for o in g.offsets},
            state=g.state, protocol_type=g.protocol_type, protocol=g.protocol,
            members=tuple(GroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                      client_id=m.client_id, client_host=m.client_host, metadata=m.metadata,
                                      assignment=m.assignment) for m in g.members)) for g in response.groups}

    # -- KIP-932 share groups (the front door's share coordinator and its __share_group_state) --
    def describe_share_groups(self, group_ids: Sequence[str]) -> list[ConsumerGroupDescription]:
        """ShareGroupDescribe: state, members and their assignments (errors per group)."""
        # Imported here: `import lowtide.client` loads no group converters (test_import_rules).
        from lowtide.rpc.convert import consumer_groups as convert_consumer
        return convert_consumer.descriptions_from_proto(self.call(
            "ShareGroupDescribe", admin_pb2.ConsumerGroupDescribeRequest(group_ids=list(group_ids))))

    def share_group_heartbeat(self, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        """ShareGroupHeartbeat at the front door's share group coordinator: join (epoch 0), stay
        (the member's epoch), leave (-1); the refusal (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH...)
        comes back as the result's ``error``."""
        from lowtide.rpc.convert import consumer_groups as convert_consumer
        return convert_consumer.heartbeat_result_from_proto(self.call(
            "ShareGroupHeartbeat", convert_consumer.heartbeat_to_proto(request)))

    def share_group_start_offsets(self, group_id: str) -> list[ShareStartOffset]:
        """Every share-partition the group has durable state for; raises the whole-call error
        (GROUP_AUTHORIZATION_FAILED)."""
        response = self.call("ShareGroupStartOffsets", admin_pb2.ShareGroupStartOffsetsRequest(group_id=group_id))
        if response.error_code:
            raise error_or_none(response.error_code, response.error_message)
        return [ShareStartOffset(topic=p.topic, partition=p.partition, start_offset=p.start_offset,
                                 leader_epoch=p.leader_epoch, finished=tuple((r.first, r.last) for r in p.finished))
                for p in response.partitions]

    def reset_share_group_offsets(self, group_id: str,
                                  targets: Mapping[TopicPartition, int]) -> dict[TopicPartition, LowtideError | None]:
        """Kafka's AlterShareGroupOffsets: new start offsets of an empty share group. Raises the
        whole-call error (NON_EMPTY_GROUP, GROUP_AUTHORIZATION_FAILED); per partition e.g.
        UNKNOWN_TOPIC_OR_PARTITION."""
        response = self.call("ShareGroupResetOffsets", admin_pb2.ShareGroupResetOffsetsRequest(
            group_id=group_id, partitions=[admin_pb2.ShareStartOffset(topic=t, partition=p, start_offset=o)
                                           for (t, p), o in targets.items()]))
        if response.error_code:
            raise error_or_none(response.error_code, response.error_message)
        return {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in response.partitions}

    def delete_share_group_offsets(self, group_id: str, topics: Sequence[str]) -> dict[str, LowtideError | None]:
        """Kafka's DeleteShareGroupOffsets: forget an empty share group's state of whole topics.
        Raises the whole-call error (NON_EMPTY_GROUP, GROUP_AUTHORIZATION_FAILED); per topic e.g.
        UNKNOWN_TOPIC_OR_PARTITION."""
        response = self.call("ShareGroupDeleteOffsets", admin_pb2.ShareGroupDeleteOffsetsRequest(
            group_id=group_id, topics=list(topics)))
        if response.error_code:
            raise error_or_none(response.error_code, response.error_message)
        return {r.topic: error_or_none(r.error_code, r.error_message) for r in response.topics}

    def alter_group_config(self, group_id: str, *, set_config: Mapping[str, str] | None = None,
                           delete_config: Iterable[str] = (), validate_only: bool = False) -> dict[str, str]:
        """Change a group's configs (Kafka's IncrementalAlterConfigs of a GROUP resource, e.g.
        ``share.auto.offset.reset``): all or nothing; returns the keys set after the change. Raises
        INVALID_CONFIG, GROUP_AUTHORIZATION_FAILED, ..."""
        return self.alter_topic_config(group_resource(group_id), set_config=set_config, delete_config=delete_config,
                                       validate_only=validate_only)

    def group_config(self, group_id: str) -> dict[str, str]:
        """The keys set on a group (DESCRIBE_CONFIGS on the GROUP); {} when none is."""
        return self.alter_topic_config(group_resource(group_id), validate_only=True)

    def offset_delete(self, group_id: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition,
                                                                                          LowtideError | None]:
        """KIP-496: delete the group's committed offsets of ``partitions``. Raises the whole-call
        error (GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP, GROUP_AUTHORIZATION_FAILED); per partition
        e.g. GROUP_SUBSCRIBED_TO_TOPIC."""
        response = self.call("OffsetDelete", admin_pb2.OffsetDeleteRequest(group_id=group_id, partitions=[
            common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions]))
        if response.error_code:
            raise error_or_none(response.error_code, response.error_message)
        return {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in response.partitions}

    # -- group membership (Kafka's classic protocol; the group's front door keeps the state) ---
    def join_group(self, group_id: str, *, session_timeout_ms: int, protocols: Sequence[tuple[str, bytes]],
                   protocol_type: str = "consumer", rebalance_timeout_ms: int = -1, member_id: str = "",
                   group_instance_id: str = "", require_known_member_id: bool = False, client_id: str = "",
                   client_host: str = "", reason: str = "", timeout_s: float | None = None) -> JoinGroupResult:
        """JoinGroup; blocks until the rebalance completes (the call's deadline defaults to the
        rebalance timeout plus 5 s, as Kafka's consumer sets it). Errors come back in ``error``."""
        rebalance_ms = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms
        request = admin_pb2.JoinGroupRequest(
            group_id=group_id, session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            member_id=member_id, group_instance_id=group_instance_id, protocol_type=protocol_type,
            protocols=[admin_pb2.GroupProtocol(name=n, metadata=m) for n, m in protocols],
            require_known_member_id=require_known_member_id, client_id=client_id, client_host=client_host,
            reason=reason)
        r = self.call("JoinGroup", request, timeout_s=timeout_s or max(self.timeout_s, rebalance_ms / 1000 + 5))
        return JoinGroupResult(member_id=r.member_id, generation_id=r.generation_id, protocol_type=r.protocol_type,
                               protocol_name=r.protocol_name, leader=r.leader,
                               members=tuple((m.member_id, m.group_instance_id, m.metadata) for m in r.members),
                               error=error_or_none(r.error_code, r.error_message))

    def sync_group(self, group_id: str, *, generation_id: int, member_id: str, group_instance_id: str = "",
                   protocol_type: str = "", protocol_name: str = "",
                   assignments: Mapping[str, bytes] | None = None, timeout_s: float | None = None) -> SyncGroupResult:
        """SyncGroup: the leader passes every member's ``assignments``; a follower's call waits for
        the leader's. Errors come back in ``error``."""
        request = admin_pb2.SyncGroupRequest(
            group_id=group_id, generation_id=generation_id, member_id=member_id, group_instance_id=group_instance_id,
            protocol_type=protocol_type, protocol_name=protocol_name, assignments=[
                admin_pb2.SyncGroupAssignment(member_id=k, assignment=v) for k, v in (assignments or {}).items()])
        r = self.call("SyncGroup", request, timeout_s=timeout_s)
        return SyncGroupResult(assignment=r.assignment, protocol_type=r.protocol_type, protocol_name=r.protocol_name,
                               error=error_or_none(r.error_code, r.error_message))

    def heartbeat(self, group_id: str, *, generation_id: int, member_id: str,
                  group_instance_id: str = "") -> LowtideError | None:
        """Heartbeat: None, or the group's answer (REBALANCE_IN_PROGRESS: rejoin; ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID...)."""
        r = self.call("Heartbeat", admin_pb2.HeartbeatRequest(group_id=group_id, generation_id=generation_id,
                                                               member_id=member_id,
                                                               group_instance_id=group_instance_id))
        return error_or_none(r.error_code, r.error_message)

    def leave_group(self, group_id: str, *, members: Sequence[tuple[str, str]] = (), member_id: str = "",
                    group_instance_id: str = "", reason: str = "") -> dict[tuple[str, str], LowtideError | None]:
        """LeaveGroup of one member (``member_id``/``group_instance_id``) or of several
        (``members``: (member_id, group_instance_id) pairs). Per-member errors by that pair; a
        whole-call error (GROUP_AUTHORIZATION_FAILED...) is raised."""
        leaving = list(members) or [(member_id, group_instance_id)]
        r = self.call("LeaveGroup", admin_pb2.LeaveGroupRequest(group_id=group_id, members=[
            admin_pb2.LeaveGroupMember(member_id=m, group_instance_id=i, reason=reason) for m, i in leaving]))
        if r.error_code:
            raise error_or_none(r.error_code, r.error_message)
        return {(m.member_id, m.group_instance_id): error_or_none(m.error_code, m.error_message) for m in r.members}

    def delete_groups(self, group_ids: Sequence[str]) -> dict[str, LowtideError | None]:
        response = self.call("DeleteGroups", admin_pb2.DeleteGroupsRequest(group_ids=list(group_ids)))
        return {g.group_id: error_or_none(g.error_code, g.error_message) for g in response.groups}

    def who_am_i(self) -> tuple[str, bool]:
        """(principal, authorization enabled) as the front door sees this client."""
        response = self.call("WhoAmI", admin_pb2.WhoAmIRequest())
        return response.principal, response.authorization_enabled

    # -- ACLs (KIP-11) -----------------------------------------------------------------------
    def create_acls(self, bindings: Sequence[AclBinding]) -> list[LowtideError | None]:
        """Add ``bindings``; one result per binding, in order (None = added)."""
        return acls_convert.create_results(self.call("CreateAcls", acls_convert.create_request(bindings)))

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The ACLs matching ``acl_filter`` (all of them when None)."""
        response = self.call("DescribeAcls", acls_convert.describe_request(acl_filter or AclFilter()))
        return [acls_convert.binding_from_proto(m) for m in response.acls]

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        """Remove every ACL matching any of ``filters``; returns the removed bindings."""
        response = self.call("DeleteAcls", acls_convert.delete_request(filters))
        return [acls_convert.binding_from_proto(m) for m in response.deleted]

    # -- SCRAM credentials (KIP-554) ---------------------------------------------------------
    def describe_user_scram_credentials(self, users: Sequence[str] = ()) -> dict[str, UserScramCredentials]:
        """The SCRAM credentials of ``users`` (every user that has one when empty), by user. A
        named user without a credential maps to a result whose error is RESOURCE_NOT_FOUND."""
        results = scram_convert.describe_results(
            self.call("DescribeUserScramCredentials", scram_convert.describe_request(users)))
        return {r.user: UserScramCredentials(
            user=r.user, error=r.error,
            credentials=tuple((SCRAM_MECHANISM_NAMES.get(c.mechanism, str(c.mechanism)), c.iterations)
                              for c in r.credentials)) for r in results}

    def upsert_user_scram_credential(self, user: str, password: str, *, mechanism: str = "SCRAM-SHA-256",
                                     iterations: int | None = None) -> LowtideError | None:
        """Create or replace ``user``'s credential for ``mechanism``. The password is salted and
        hashed here (PBKDF2): only the salt and SaltedPassword are sent, as Kafka's AdminClient does."""
        from lowtide.auth.scram import DEFAULT_ITERATIONS, SALT_BYTES, mechanism_named  # noqa: PLC0415 - not for every client import

        mech = mechanism_named(mechanism)
        if mech is None:
            raise InvalidRequest(f"unknown SCRAM mechanism {mechanism!r} (SCRAM-SHA-256 or SCRAM-SHA-512)")
        rounds = iterations or DEFAULT_ITERATIONS
        salt = os.urandom(SALT_BYTES)
        upsertion = Upsertion(user=user, mechanism=mech.code, iterations=rounds, salt=salt,
                              salted_password=mech.salted_password(password, salt, rounds))
        return self._alter_scram(upsertions=[upsertion])[user]

    def delete_user_scram_credential(self, user: str, *, mechanism: str = "SCRAM-SHA-256") -> LowtideError | None:
        """Delete ``user``'s credential for ``mechanism`` (RESOURCE_NOT_FOUND when it has none)."""
        code = {name: number for number, name in SCRAM_MECHANISM_NAMES.items()}.get(mechanism.upper(), 0)
        return self._alter_scram(deletions=[Deletion(user=user, mechanism=code)])[user]

    def _alter_scram(self, *, deletions: Sequence[Deletion] = (),
                     upsertions: Sequence[Upsertion] = ()) -> dict[str, LowtideError | None]:
        response = self.call("AlterUserScramCredentials",
                             scram_convert.alter_request(deletions=deletions, upsertions=upsertions))
        return dict(scram_convert.alter_results(response))


class ClusterConnections(NamedTuple):
    """What a data client (``Producer``, ``Consumer``, the Spark reader) holds: one channel pool,
    shared by the front door's ``Admin`` and the leaders' ``ReplicaClient`` (a broker that is both
    is dialled once), and the metadata cache that routes over the Admin. Closing ``channels``
    closes them all."""

    channels: ChannelPool
    admin: Admin
    replicas: ReplicaClient
    cluster: ClusterMetadata


def open_connections(bootstrap: str, *, metadata: Sequence[tuple[str, str]],
                     tls: ClientTls | None) -> ClusterConnections:
    """The connections to the cluster behind ``bootstrap``, every call carrying ``metadata``."""
    channels = ChannelPool(tls=tls)
    admin = Admin(bootstrap, metadata=metadata, channels=channels)
    return ClusterConnections(channels, admin, ReplicaClient(channels=channels, metadata=metadata),
                              ClusterMetadata(admin))
