"""What the replica's request handlers share (produce_handler, fetch_handler,
list_offsets_handler, delete_records_handler): their base (what each is built on, and which of a
request's partitions are diskless), the internal-topic test of authorization, and the merge of a
classic/diskless split back into request order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from lowtide.auth.access import AccessControl
from lowtide.diskless.broker import DisklessBroker
from lowtide.metadata.model import INTERNAL_TOPIC_PREFIX, TopicInfo
from lowtide.replica.manager import ReplicaManager

R = TypeVar("R")


def internal_only(items: Sequence[Any]) -> bool:
    """Every item names an internal topic (``__``): CLUSTER_ACTION may stand in for topic ACLs.
    __consumer_offsets is written by the front door and read by the brokers (consumed retention)
    acting for callers they authorized themselves, as Kafka's coordinators do."""
    return bool(items) and all(p.topic.startswith(INTERNAL_TOPIC_PREFIX) for p in items)


def interleave(kinds: Sequence[object | None], classic: Sequence[R], diskless: Sequence[R]) -> list[R]:
    """Answers back in request order: ``classic`` answer the items whose kind is None (a classic
    topic), ``diskless`` the others (their diskless topic's info), each list in request order."""
    a, b = iter(classic), iter(diskless)
    return [next(a) if k is None else next(b) for k in kinds]


def topic_of(item: Any) -> str:
    """The topic an item names (what ``AccessControl.screen`` checks)."""
    return item.topic


class RequestHandler:
    """Base of a replica request handler: the manager it works through, the access control it
    checks with and the diskless broker diskless partitions go to (None: this replica serves none).

    Thread-safety: stateless; what it calls is thread-safe.
    """

    def __init__(self, *, manager: ReplicaManager, access: AccessControl,
                 diskless: DisklessBroker | None = None) -> None:
        self.manager, self.access, self.diskless = manager, access, diskless
        # The request paths themselves (no ReplicaManager method between: issue 47).
        self.requests, self.deletes = manager.requests, manager.deletes

    def diskless_kinds(self, items: Sequence[Any]) -> list[TopicInfo | None]:
        """Per item, its diskless topic's info, or None for a classic topic."""
        if self.diskless is None:
            return [None] * len(items)
        return [self.diskless.topic(p.topic) for p in items]
