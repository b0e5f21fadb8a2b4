"""What the replica's request handlers share (produce_handler, fetch_handler,
list_offsets_handler, delete_records_handler): the internal-topic test of authorization, and the
classic/diskless split of a request and the merge of its answers back into request order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from lowtide.metadata.model import INTERNAL_TOPIC_PREFIX

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
