"""Plain data of the cluster metadata. No I/O here."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Self

INTERNAL_TOPIC_PREFIX = "__"
# The topics only their coordinators write (Kafka's Topic.isInternal, plus the diskless
# coordinators' metadata log): a client's produce to them is INVALID_TOPIC_EXCEPTION, whatever the
# ACLs (lowtide.replica.servicer). Other "__" topics are listed as internal but written as any topic.
COORDINATOR_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__diskless_metadata"})


class JsonRecord:
    """A dataclass record kept as JSON in the metadata store: its fields with sorted keys (the
    same record, the same bytes), read back ignoring fields it does not know (``_known_fields``)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Self:
        return cls(**_known_fields(cls, json.loads(raw)))


@dataclass(frozen=True)
class BrokerInfo(JsonRecord):
    id: int
    host: str
    port: int
    rack: str = ""
    metrics: str = ""
    # The Kafka protocol listener on ``host`` (lowtide.kafka); 0 = none.
    kafka_port: int = 0
    # Every Kafka listener by name (PLAINTEXT, SSL, SASL_SSL...) -> its advertised "host:port";
    # records written before named listeners have none (their one listener is kafka_port).
    kafka_listeners: dict[str, str] = field(default_factory=dict, hash=False)
    # The replication listener on ``host`` (lowtide.rpc.framed.listener); 0 = none, and
    # followers use the gRPC Replicate stream.
    replication_port: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TopicInfo(JsonRecord):
    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)
    diskless: bool = False
    created_ms: int = 0
    # Diskless topics (KIP-1164): partition p's coordinator shard is diskless_shards[p], fixed at
    # creation (lowtide.diskless.topics.assign_shards); empty for classic topics.
    diskless_shards: list[int] = field(default_factory=list)

    @property
    def internal(self) -> bool:
        return self.name.startswith(INTERNAL_TOPIC_PREFIX)

    @property
    def cleanup_policy(self) -> set[str]:
        return {p.strip() for p in self.config.get("cleanup.policy", "delete").split(",") if p.strip()}


@dataclass(frozen=True)
class PartitionState:
    """Leadership of one partition. ``leader_epoch`` bumps on every leader change;
    ``partition_epoch`` on every change at all (ISR included): writers compare-and-set on it.

    A reassignment in progress (KIP-455, docs/design/reassignment.md) is kept in the same record,
    as KRaft's ``PartitionRegistration`` keeps it: ``replicas`` is the target followed by the
    replicas being removed, ``adding_replicas`` are target members not in the original set, and
    ``removing_replicas`` original members not in the target. Both are empty when nothing moves,
    and then left out of the JSON, so records of partitions that never moved stay byte-identical
    to those older lowtide versions write and read.
    """

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    partition_epoch: int = 0
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replica set the partition is moving to (``replicas`` when nothing moves)."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """The replica set before the move began (``replicas`` when nothing moves)."""
        return tuple(r for r in self.replicas if r not in self.adding_replicas)

    def to_json(self) -> str:
        doc = asdict(self)
        for name in ("replicas", "isr", "adding_replicas", "removing_replicas"):
            doc[name] = list(doc[name])
        for name in ("adding_replicas", "removing_replicas"):
            if not doc[name]:
                del doc[name]
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> PartitionState:
        doc = json.loads(raw)
        for name in ("replicas", "isr", "adding_replicas", "removing_replicas"):
            if name in doc:
                doc[name] = tuple(doc[name])
        return cls(**_known_fields(cls, doc))


def _known_fields(cls: type, doc: dict) -> dict:
    """``doc`` without the keys ``cls`` does not have: a record written by a newer lowtide (a field
    added since) still reads during a rolling upgrade, as Kafka's tagged fields do."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


@dataclass(frozen=True)
class IsrChange:
    """One partition's entry in a leader's ISR change (Kafka's AlterPartition request): the ISR
    ``leader`` wants under ``leader_epoch``, refused if the partition epoch is no longer
    ``expected_partition_epoch`` (None: not checked)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    expected_partition_epoch: int | None = None
