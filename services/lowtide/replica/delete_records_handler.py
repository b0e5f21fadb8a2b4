"""DeleteRecords (KIP-107) on a replica, for both doors (issue 47): the gRPC
``Replica.DeleteRecords`` servicer (which the front door's fan-out calls) and the Kafka listener
(which Kafka's AdminClient reaches directly: it sends each partition to its leader) call this one
handler with ``lowtide.messages`` types.

The policy: DELETE on each topic, or CLUSTER_ACTION (the front door acts for callers it checked);
a classic partition is deleted up to its offset on this replica, which must lead it, and the
answer waits until the low watermark got there (``replica/delete_records.py``, the purgatory); a
diskless one goes to its coordinator shard (the LW is the shard's log start offset), as the front
door sends it. One answer per item, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages.admin import DeleteRequestItem
from lowtide.messages.replica import DeleteRecordsResult
from lowtide.replica.handler_parts import RequestHandler, interleave, topic_of
from lowtide.replica.partition import LEADER

DEFAULT_TIMEOUT_MS = 30000



def _refused(item: DeleteRequestItem, error: LowtideError) -> DeleteRecordsResult:
    return DeleteRecordsResult(topic=item.topic, partition=item.partition, error=error)


class DeleteRecordsRequestHandler(RequestHandler):
    """DeleteRecords for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; what it calls is thread-safe. ``delete_records`` blocks until every
    answer is known (the low watermark, or the timeout): call it off any event loop.
    """

    def serves_here(self, items: Sequence[DeleteRequestItem]) -> bool:
        """Whether every item is a partition this replica leads, or a diskless one (any replica
        reaches its shard): a Kafka client sends DeleteRecords to the leaders, and what else it
        sends goes through the front door, which finds the leaders."""
        registry = self.manager.registry
        for it in items:
            if self.diskless is not None and self.diskless.topic(it.topic) is not None:
                continue
            p = registry.find(it.topic, it.partition)
            if p is None or p.role != LEADER:
                return False
        return True

    def delete_records(self, principal: str, items: Sequence[DeleteRequestItem], *,
                       timeout_ms: int) -> list[DeleteRecordsResult]:
        timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        screened = self.access.screen(principal, items, operation=AclOperation.DELETE, topic=topic_of,
                                      or_cluster_action=True)
        allowed = screened.allowed
        kinds = self.diskless_kinds(allowed)
        classic = [(p.topic, p.partition, p.offset) for p, k in zip(allowed, kinds, strict=True) if k is None]
        out = self.deletes.delete_records(classic, timeout_ms=timeout_ms) if classic else []
        if len(out) != len(kinds):
            assert self.diskless is not None
            answers = self.diskless.delete_records(
                [(k, p.partition, p.offset) for p, k in zip(allowed, kinds, strict=True) if k is not None],
                timeout_ms=timeout_ms)
            out = interleave(kinds, out, answers)
        return screened.merge(out, _refused)
