"""Messages of KIP-848 consumer groups (ConsumerGroupHeartbeat, ConsumerGroupDescribe) between the
Kafka listener, the front door's servicer and its remote twin, and the coordinator
(``frontdoor/groups/consumer_membership.py``). Topics travel as Kafka carries them, by topic id
(32 hex digits, lowtide's form of a UUID); the coordinator maps them to names.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.errors import LowtideError


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    """Partitions of one topic in an assignment (``topic``: the name, where the answer gives it)."""

    topic_id: str
    partitions: tuple[int, ...]
    topic: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """One ConsumerGroupHeartbeat. ``None`` fields were not sent (null: unchanged since the
    member's previous heartbeat, as KIP-848 lets a member send only what changed)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    topic_partitions: tuple[TopicPartitions, ...] | None = None
    client_id: str = ""
    client_host: str = ""
    # The API version: v0 lets the coordinator name a joining member, v1 (KIP-1082) requires the
    # member to send its own id (a UUID) from its first heartbeat.
    version: int = 1


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatResult:
    member_id: str = ""
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    # What the member should own now; None: unchanged since the answer that last carried one.
    assignment: tuple[TopicPartitions, ...] | None = None
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class ConsumerMemberDescription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: tuple[TopicPartitions, ...]
    target_assignment: tuple[TopicPartitions, ...]
    classic: bool = False  # a member using the classic protocol inside the group (KIP-848's upgrade)


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    group_id: str
    error: LowtideError | None = None
    state: str = "Dead"
    group_epoch: int = -1
    assignment_epoch: int = -1
    assignor_name: str = ""
    members: tuple[ConsumerMemberDescription, ...] = ()
    authorized_operations: int = -(2**31)  # Kafka's "not asked for"
