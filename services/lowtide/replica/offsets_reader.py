"""A replica's own reader of ``__consumer_offsets``, for broker-side consumed retention (KIP-68).

The retention pass needs the committed offsets of the groups on the topics it leads. It reads them
straight from the leaders of ``__consumer_offsets`` (a consumer Fetch over ``ReplicaClient``, as
the broker's own identity), not through a front door: one hop less, and no front door needs to
be up for retention to run. Each call of ``refresh`` continues from where the last one stopped
(the fold of ``lowtide.groups`` keeps a position per partition), so a pass costs one fetch per
leader when nothing was committed since.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from lowtide.client.replica import ReplicaClient
from lowtide.groups import OFFSETS_TOPIC, TopicCommit
from lowtide.groups.tail import OffsetsTail
from lowtide.internal_topics import grpc_fetch
from lowtide.metadata.store import MetadataStore

FETCH_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class OffsetsReadResult:
    """What one refresh managed: the partition count (None: the topic does not exist, so no group
    has committed anything) and, per partition it could not read up to its HW, why."""

    partitions: int | None
    failures: dict[int, str] = field(default_factory=dict)


class ConsumerOffsetsReader:
    """Tails ``__consumer_offsets`` from its leaders (module doc).

    Contract: after ``refresh`` returned a partition without a failure, ``commits_by_topics``
    reflects every commit acknowledged on it before the refresh began.

    Thread-safety: ``refresh`` from one thread at a time (the retention thread); the reads of the
    folded state from any thread.
    """

    def __init__(self, *, store: MetadataStore, replicas: ReplicaClient, fetch_timeout_s: float = 3.0) -> None:
        self._store = store
        self._replicas = replicas
        self._fetch_timeout_s = fetch_timeout_s
        self._tail = OffsetsTail()
        self._fetch = grpc_fetch(replicas, OFFSETS_TOPIC, max_bytes=FETCH_MAX_BYTES, deadline_s=fetch_timeout_s)

    def refresh(self, partitions: Iterable[int] | None = None) -> OffsetsReadResult:
        """Read the given partitions (default: all) up to their leaders' high watermarks."""
        try:
            info = self._store.topics().get(OFFSETS_TOPIC)
        except Exception as exc:  # noqa: BLE001 - Redis down: nothing can be known about any group
            return OffsetsReadResult(partitions=0, failures={-1: f"cannot read the metadata: {exc}"})
        if info is None:
            return OffsetsReadResult(partitions=None)
        wanted = range(info.partitions) if partitions is None else [p for p in partitions if p < info.partitions]
        try:
            failures = self._tail.read_to_high_watermark(wanted, route=self._route, fetch=self._fetch)
        except Exception as exc:  # noqa: BLE001 - metadata lost mid-read: the same as unreadable
            failures = {p: f"{type(exc).__name__}: {exc}" for p in wanted}
        return OffsetsReadResult(partitions=info.partitions, failures=failures)

    def commits_by_topics(self, topics: set[str]) -> dict[str, dict[str, dict[int, TopicCommit]]]:
        return self._tail.commits_by_topics(topics)

    def _route(self, partitions: list[int]) -> tuple[dict[str, list[int]], dict[int, str]]:
        states = {s.partition: s for s in self._store.partition_states(OFFSETS_TOPIC)}
        brokers = self._store.brokers()
        live = self._store.live_broker_ids({s.leader for s in states.values() if s.leader >= 0})
        by_address: dict[str, list[int]] = {}
        failed: dict[int, str] = {}
        for p in partitions:
            state = states.get(p)
            if state is None or state.leader < 0:
                failed[p] = "LEADER_NOT_AVAILABLE: no leader"
            elif state.leader not in live or state.leader not in brokers:
                failed[p] = f"LEADER_NOT_AVAILABLE: leader {state.leader} is not live"
            else:
                by_address.setdefault(brokers[state.leader].address, []).append(p)
        return by_address, failed
