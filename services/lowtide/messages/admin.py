"""Messages of the ``lowtide.v1.Admin`` service (the front door), as dataclasses.

The front door's handlers take and answer these (``lowtide.frontdoor``: topics, ListOffsets,
DeleteRecords, configs, committed offsets, group membership, SCRAM credentials); its servicer
converts them to and from protos/lowtide/v1/admin.proto. The answers the Python client shares with
the service live here too (``GroupListing``), as do the ones shared with the Replica service
(``lowtide.messages.replica``: ``PartitionOffset`` for ListOffsets, ``DeleteRecordsResult``).

Not here, with a reason: the Metadata views (``ClusterView``) are here: the front door copies the
metadata store's records into them, so the Kafka listener and the front door's remote twin
(``lowtide.client.frontdoor``) share one shape without importing the store. The Python client's
results that differ in shape from the service's (``lowtide.client.admin``: ``CommittedOffset``
keyed by partition, ``GroupOffsets``, ``JoinGroupResult``, ...) are the client's public API.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from lowtide.errors import InvalidRequest, LowtideError
from lowtide.messages import TopicPartition


# ---- Topics (CreateTopics, DeleteTopics) and ListOffsets, DeleteRecords --------------------------
@dataclass(frozen=True, slots=True)
class TopicRequest:
    """One topic to create. ``replication_factor`` <= 0 means the default: min(3, live brokers).
    ``assignments``: the client's own placement, ``(partition, its replicas)`` each (Kafka's
    CreateTopics ``assignments``; ``partitions`` and ``replication_factor`` must then be -1)."""

    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)
    diskless: bool = False
    assignments: tuple[tuple[int, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionsRequest:
    """More partitions for topic ``name``: ``count`` is the new total; ``assignments`` one replica
    list per new partition (first = preferred leader), or empty for the default placement."""

    name: str
    count: int
    assignments: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    name: str
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    topic: str
    partition: int
    timestamp: int  # -1 latest (HW), -2 earliest (LSO), -3 max timestamp, >= 0 by time
    current_leader_epoch: int = -1  # the epoch the client knows; the leader fences on it (-1: unchecked)


@dataclass(frozen=True, slots=True)
class DeleteRequestItem:
    topic: str
    partition: int
    offset: int


# ---- Topic configs (AlterConfigs, IncrementalAlterConfigs) ---------------------------------------
class ConfigOpType(enum.IntEnum):
    """Kafka's ``AlterConfigOp.OpType`` (same numbers on the wire and in lowtide.v1)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


# Admin.AlterConfigs names topics; a broker resource (Kafka's ConfigResource type BROKER) is named
# "broker:<id>", and "broker:" is the cluster-wide default. ":" is no topic name character, so the
# two can never collide (the front door: lowtide.metadata.config_defaults; the client: Admin).
BROKER_RESOURCE_PREFIX = "broker:"


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One change to one key; ``value`` is required for SET, APPEND and SUBTRACT. ``op`` may be
    the number a client sent: one that is no ConfigOpType is INVALID_REQUEST when applied."""

    key: str
    op: ConfigOpType | int = ConfigOpType.SET
    value: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """The ops for one topic; ``replace``: legacy AlterConfigs (the SET ops are the whole config)."""

    topic: str
    ops: tuple[ConfigOp, ...]
    replace: bool = False


@dataclass(frozen=True, slots=True)
class ConfigOutcome:
    """One topic's result: its config after the change (as it would be, with validate_only), or
    the error that left it unchanged."""

    topic: str
    error: LowtideError | None = None
    config: dict[str, str] = field(default_factory=dict)


# ---- Cluster metadata (Metadata), leader elections, partition reassignments ----------------------
# Metadata asked for this topic name answers the brokers only: no topic may have it ("\0" is no
# topic name character), so its one entry is an error every caller ignores.
NO_TOPIC = "\0none"


@dataclass(frozen=True, slots=True)
class BrokerView:
    """A registered broker as Metadata reports it (the store's ``BrokerInfo`` and its liveness).
    ``kafka_port`` 0: no Kafka listener; ``kafka_listeners``: listener name -> "host:port"."""

    id: int
    host: str
    port: int
    rack: str = ""
    live: bool = False
    kafka_port: int = 0
    kafka_listeners: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A partition's state as Metadata reports it; ``leader`` -1 when none."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicView:
    """A topic as Metadata reports it; ``error`` is set (and the rest left empty) for a topic that
    is unknown or that the caller may not DESCRIBE."""

    name: str
    error: LowtideError | None = None
    topic_id: str = ""
    replication_factor: int = 0
    config: dict[str, str] = field(default_factory=dict)
    diskless: bool = False
    partitions: tuple[PartitionView, ...] = ()
    # A diskless topic's coordinator shard of each partition, in partition order (else empty).
    diskless_shards: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterView:
    """A Metadata answer: every registered broker and the topics asked for."""

    cluster_id: str
    brokers: tuple[BrokerView, ...]
    topics: tuple[TopicView, ...]
    revision: int = 0  # the store revision this view reflects at least (0: unknown)


class ElectionType(enum.IntEnum):
    """Kafka's ``ElectionType`` (same numbers on the wire and in lowtide.v1)."""

    PREFERRED = 0
    UNCLEAN = 1

    @classmethod
    def of(cls, value: int) -> ElectionType:
        """The type a client sent; any other number is INVALID_REQUEST, as the Admin service answers."""
        if value not in (cls.PREFERRED, cls.UNCLEAN):
            raise InvalidRequest(f"election_type must be 0 (preferred) or 1 (unclean), got {value}")
        return cls(value)


@dataclass(frozen=True, slots=True)
class ElectionOutcome:
    partition: TopicPartition
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class ReassignmentOutcome:
    partition: TopicPartition
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    """A partition moving now (KIP-455): ``replicas`` is the target followed by the replicas
    being removed."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


# ---- Committed offsets (OffsetCommit, OffsetFetch, OffsetDelete) and groups ----------------------
@dataclass(frozen=True, slots=True)
class OffsetCommit:
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    leader_epoch: int = -1  # Kafka's committed_leader_epoch (-1: not known)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed offset (-1 when nothing is committed), or an error for that partition."""

    topic: str
    partition: int
    offset: int = -1
    metadata: str = ""
    commit_ms: int = -1
    error: LowtideError | None = None
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    member_id: str
    group_instance_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """What DescribeGroups / ListGroups / OffsetDelete see of a group (Kafka's GroupSummary:
    metadata, assignment and protocol only while Stable)."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    generation_id: int
    leader: str
    members: tuple[MemberSnapshot, ...]
    subscribed_topics: frozenset[str] | None  # None: not a consumer group, or not decodable


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    group_id: str
    error: LowtideError | None = None
    offsets: tuple[CommittedOffset, ...] = ()
    # DescribeGroups: the group's membership (None: no members in memory, i.e. Empty, no protocol)
    group: GroupSnapshot | None = None


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str = ""  # "" for a group with committed offsets only
    state: str = "Empty"  # classic_group.EMPTY
    group_type: str = "classic"  # or "consumer" (KIP-848)


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    topic: str
    partition: int
    error: LowtideError | None = None


# ---- Group membership (JoinGroup, SyncGroup, LeaveGroup) -----------------------------------------
@dataclass(frozen=True, slots=True)
class Protocol:
    name: str
    metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int = -1  # <= 0: session_timeout_ms (JoinGroup v0)
    member_id: str = ""
    group_instance_id: str = ""
    protocol_type: str = ""
    protocols: tuple[Protocol, ...] = ()
    require_known_member_id: bool = False
    client_id: str = ""
    client_host: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    """A JoinGroup answer; ``error`` set means failed (``member_id`` still carries the id
    MEMBER_ID_REQUIRED hands out)."""

    member_id: str = ""
    generation_id: int = -1
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    members: tuple[JoinedMember, ...] = ()  # the leader's answer only
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class SyncResult:
    protocol_type: str = ""
    protocol_name: str = ""
    assignment: bytes = b""
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str = ""
    group_instance_id: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LeaveOutcome:
    member_id: str
    group_instance_id: str
    error: LowtideError | None = None


# ---- SCRAM credentials (DescribeUserScramCredentials, AlterUserScramCredentials) -----------------
@dataclass(frozen=True, slots=True)
class Upsertion:
    user: str
    mechanism: int  # Kafka's ScramMechanism number
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class Deletion:
    user: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    """What DescribeUserScramCredentials shows of a credential: never its keys or salt."""

    mechanism: int  # Kafka's ScramMechanism number (1 SCRAM-SHA-256, 2 SCRAM-SHA-512)
    iterations: int


@dataclass(frozen=True, slots=True)
class UserCredentials:
    """One user's answer to DescribeUserScramCredentials: its credentials, or the error."""

    user: str
    error: LowtideError | None
    credentials: tuple[ScramCredentialInfo, ...] = ()


# ---- Transactions (ListTransactions, DescribeTransactions) ----------------------------------------
# Kafka's transaction.version feature levels as the coordinator's calls take them (KIP-890): 0 and
# 1 run the KIP-98 protocol (1 only adds the flexible state record), 2 is KIP-890's (an epoch per
# transaction, implicit partition adds). Both doors pass them: here, not in the coordinator.
TRANSACTION_VERSION_1, TRANSACTION_VERSION_2 = 0, 2


@dataclass(frozen=True, slots=True)
class TxnState:
    """One transactional id's state at the transaction coordinator (``lowtide.frontdoor.transactions``,
    which keeps and moves it) as ListTransactions and DescribeTransactions answer it. Here, not
    there, so the front door's remote twin (``lowtide.client.frontdoor``) answers the same type.
    ``state`` is Kafka's name (Empty, Ongoing, PrepareCommit, ...); ``start_ms`` -1: none ongoing;
    ``version`` is the coordinator's compare-and-set version (0 over the wire: not carried).

    KIP-890 (transactions version 2): ``transaction_version`` is 2 for a transaction its client
    runs in version 2 (every EndTxn bumps the epoch), else 0; ``next_producer_id`` is the id a
    Prepare* state whose epoch ran out hands its producer once complete (-1: none), and
    ``previous_producer_id`` the id it had before (-1: none), so a retried EndTxn of that id is
    known. Neither is carried over the wire."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str = "Empty"
    partitions: frozenset[TopicPartition] = field(default_factory=frozenset)
    start_ms: int = -1
    timeout_ms: int = 60_000  # Kafka's default transaction.timeout.ms
    updated_ms: int = 0
    version: int = 0
    transaction_version: int = 0
    previous_producer_id: int = -1
    next_producer_id: int = -1


# (transactional id, its state or None, the error describing it): DescribeTransactions per id
Described = tuple[str, "TxnState | None", "LowtideError | None"]
