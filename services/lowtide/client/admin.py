"""``Admin``: the client of the front door's lowtide.v1.Admin service (Kafka's AdminClient)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lowtide.auth.acl import AclBinding, AclFilter
from lowtide.client.metadata import (
    BrokerMetadata,
    ClusterSnapshot,
    PartitionMetadata,
    TopicMetadata,
    topic_from_error,
)
from lowtide.client.replica import PartitionDeletion, PartitionOffset
from lowtide.errors import LowtideError, UnknownTopicOrPartition, error_or_none
from lowtide.rpc.acls import binding_from_proto, binding_to_proto, filter_to_proto
from lowtide.rpc.channels import ChannelPool, PooledClient, call, validate_address
from lowtide_pb import admin_pb2, admin_pb2_grpc, common_pb2

TopicPartition = tuple[str, int]


class OffsetSpec:
    """ListOffsets timestamps with a meaning of their own (>= 0 means "first offset at or after")."""

    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3


# A ListOffsets answer (KIP-79) and a DeleteRecords answer (KIP-107 ``DeleteDataResult``) are the
# same whether the front door or a leader gives them.
ListedOffset = PartitionOffset
DeleteRecordsResult = PartitionDeletion


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    metadata: str = ""
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    group_id: str
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
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
                 timeout_s: float = 30.0, channels: ChannelPool | None = None) -> None:
        self.bootstrap = validate_address(bootstrap)  # before a pool exists that would leak
        super().__init__(channels=channels, metadata=metadata)
        self.timeout_s = timeout_s

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, request, *, timeout_s: float | None = None):
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
        response = self._call("CreateTopics", request)
        return {r.name: error_or_none(r.error_code, r.error_message) for r in response.topics}

    def create_topic(self, name: str, *, partitions: int = 1, replication_factor: int = 0,
                     config: Mapping[str, str] | None = None, diskless: bool = False) -> None:
        """Create one topic or raise its error (TOPIC_ALREADY_EXISTS, INVALID_CONFIG, ...)."""
        errors = self.create_topics([{"name": name, "partitions": partitions, "replication_factor": replication_factor,
                                      "config": dict(config or {}), "diskless": diskless}])
        if errors.get(name) is not None:
            raise errors[name]

    def delete_topics(self, names: Sequence[str]) -> dict[str, LowtideError | None]:
        response = self._call("DeleteTopics", admin_pb2.DeleteTopicsRequest(names=list(names)))
        return {r.name: error_or_none(r.error_code, r.error_message) for r in response.topics}

    def delete_topic(self, name: str) -> None:
        error = self.delete_topics([name]).get(name)
        if error is not None:
            raise error

    def list_topics(self, *, include_internal: bool = False) -> list[str]:
        return list(self._call("ListTopics", admin_pb2.ListTopicsRequest(include_internal=include_internal)).names)

    def describe_cluster(self, topics: Sequence[str] = ()) -> ClusterSnapshot:
        """Brokers and topics (all non-internal ones when ``topics`` is empty)."""
        response = self._call("Metadata", admin_pb2.MetadataRequest(topics=list(topics)))
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
            response = self._call("ListOffsets", request)
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
        response = self._call("DeleteRecords", request, timeout_s=timeout_ms / 1000 + 5)
        return {(r.topic, r.partition): DeleteRecordsResult(topic=r.topic, partition=r.partition,
                                                            low_watermark=r.low_watermark,
                                                            error=error_or_none(r.error_code, r.error_message))
                for r in response.partitions}

    # -- groups ------------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int], *,
                       metadata: str = "") -> dict[TopicPartition, LowtideError | None]:
        request = admin_pb2.OffsetCommitRequest(group_id=group_id, partitions=[
            admin_pb2.OffsetCommitPartition(topic=t, partition=p, offset=o, metadata=metadata)
            for (t, p), o in offsets.items()])
        response = self._call("OffsetCommit", request)
        return {(r.topic, r.partition): error_or_none(r.error_code, r.error_message) for r in response.partitions}

    def fetch_offsets(self, group_id: str,
                      partitions: Iterable[TopicPartition] = ()) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets (-1 = none) of the partitions, or of all the group committed when empty."""
        request = admin_pb2.OffsetFetchRequest(group_id=group_id, partitions=[
            common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])
        response = self._call("OffsetFetch", request)
        return {(r.topic, r.partition): CommittedOffset(offset=r.offset, metadata=r.metadata,
                                                        error=error_or_none(r.error_code, r.error_message))
                for r in response.partitions}

    def list_groups(self) -> list[str]:
        return list(self._call("ListGroups", admin_pb2.ListGroupsRequest()).group_ids)

    def describe_groups(self, group_ids: Sequence[str]) -> dict[str, GroupOffsets]:
        response = self._call("DescribeGroups", admin_pb2.DescribeGroupsRequest(group_ids=list(group_ids)))
        return {g.group_id: GroupOffsets(
            group_id=g.group_id, error=error_or_none(g.error_code, g.error_message),
            offsets={(o.topic, o.partition): CommittedOffset(offset=o.offset, metadata=o.metadata,
                                                             error=error_or_none(o.error_code, o.error_message))
                     for o in g.offsets}) for g in response.groups}

    def delete_groups(self, group_ids: Sequence[str]) -> dict[str, LowtideError | None]:
        response = self._call("DeleteGroups", admin_pb2.DeleteGroupsRequest(group_ids=list(group_ids)))
        return {g.group_id: error_or_none(g.error_code, g.error_message) for g in response.groups}

    def who_am_i(self) -> tuple[str, bool]:
        """(principal, authorization enabled) as the front door sees this client."""
        response = self._call("WhoAmI", admin_pb2.WhoAmIRequest())
        return response.principal, response.authorization_enabled

    # -- ACLs (KIP-11) -----------------------------------------------------------------------
    def create_acls(self, bindings: Sequence[AclBinding]) -> list[LowtideError | None]:
        """Add ``bindings``; one result per binding, in order (None = added)."""
        response = self._call("CreateAcls", admin_pb2.CreateAclsRequest(acls=[binding_to_proto(b) for b in bindings]))
        return [error_or_none(code) for code in response.results]

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The ACLs matching ``acl_filter`` (all of them when None)."""
        response = self._call("DescribeAcls", admin_pb2.DescribeAclsRequest(
            filter=filter_to_proto(acl_filter or AclFilter())))
        return [binding_from_proto(m) for m in response.acls]

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        """Remove every ACL matching any of ``filters``; returns the removed bindings."""
        response = self._call("DeleteAcls", admin_pb2.DeleteAclsRequest(filters=[filter_to_proto(f) for f in filters]))
        return [binding_from_proto(m) for m in response.deleted]
