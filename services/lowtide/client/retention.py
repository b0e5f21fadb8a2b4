"""KIP-68 client-side consumed retention: delete what every consumer group has consumed.

For each partition of a topic: target = min committed offset over the groups that must have
consumed it (default: every group that has committed offsets for the topic). Any failure to read
a group's offset, or a group with no commit for the partition, makes the minimum -1: delete
nothing there. The targets go to one DeleteRecords call (KIP-107).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lowtide.client.admin import Admin, OffsetSpec
from lowtide.errors import LowtideError
from lowtide.messages import TopicPartition
from lowtide.messages.replica import DeleteRecordsResult


@dataclass
class RetentionPlan:
    topic: str
    groups: list[str]
    targets: dict[TopicPartition, int] = field(default_factory=dict)  # -1 = delete nothing
    reasons: dict[TopicPartition, str] = field(default_factory=dict)


def plan_consumed_retention(admin: Admin, topic: str, *, groups: Sequence[str] | None = None) -> RetentionPlan:
    """Compute the per-partition delete offsets; reads only, changes nothing."""
    partitions = [(topic, p.partition) for p in admin.describe_topics([topic])[topic].partitions]
    if groups is None:
        described = admin.describe_groups(admin.list_groups())
        groups = sorted(g for g, d in described.items() if any(t == topic for t, _ in d.offsets))
    plan = RetentionPlan(topic=topic, groups=list(groups))
    if not groups:
        for tp in partitions:
            plan.targets[tp], plan.reasons[tp] = -1, "no consumer group has committed offsets"
        return plan
    minimum: dict[TopicPartition, int] = {tp: 2**63 - 1 for tp in partitions}
    for group in groups:
        try:
            committed = admin.fetch_offsets(group, partitions)
        except LowtideError as err:
            committed = {}
            for tp in partitions:
                plan.reasons.setdefault(tp, f"group {group}: {err.name}")
        for tp in partitions:
            c = committed.get(tp)
            if c is None or c.error is not None or c.offset < 0:
                minimum[tp] = -1
                plan.reasons.setdefault(tp, f"group {group} has no committed offset")
            elif minimum[tp] >= 0:
                minimum[tp] = min(minimum[tp], c.offset)
    plan.targets = minimum
    return plan


def run_consumed_retention(admin: Admin, plan: RetentionPlan, *,
                           timeout_ms: int = 30_000) -> dict[TopicPartition, DeleteRecordsResult]:
    """DeleteRecords up to each positive target that is above the current log start offset."""
    wanted = {tp: o for tp, o in plan.targets.items() if o > 0}
    if not wanted:
        return {}
    earliest = admin.list_offsets({tp: OffsetSpec.EARLIEST for tp in wanted})
    wanted = {tp: o for tp, o in wanted.items() if earliest[tp].error is not None or o > earliest[tp].offset}
    return admin.delete_records(wanted, timeout_ms=timeout_ms) if wanted else {}
