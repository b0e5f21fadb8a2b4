"""ListOffsets on a replica, for both doors (issue 47): the gRPC ``Replica.ListOffsets`` servicer
and the Kafka listener call this one handler with ``lowtide.messages`` types.

The policy: DESCRIBE on each topic, or CLUSTER_ACTION (the front door and the brokers ask on
behalf of callers they checked); a classic partition is answered from this replica's log (the
leader's: -1 latest is the HW, or the last stable offset for READ_COMMITTED; -2 earliest the log
start offset; -3 the max timestamp; a time the first offset at or after it), fenced on the
caller's leader epoch; a diskless one by its coordinator shard (latest: the HW, or for
READ_COMMITTED the shard's last stable offset). One answer per query, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages.replica import OffsetQuery, PartitionOffset
from lowtide.replica.handler_parts import RequestHandler, interleave, topic_of


def _refused(query: OffsetQuery, error: LowtideError) -> PartitionOffset:
    return PartitionOffset(topic=query.topic, partition=query.partition, error=error)


class ListOffsetsHandler(RequestHandler):
    """ListOffsets for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; what it calls is thread-safe. It never waits on a peer but the
    diskless shard's answer (a blocking call).
    """

    def list_offsets(self, principal: str, queries: Sequence[OffsetQuery], *,
                     isolation_level: int = 0) -> list[PartitionOffset]:
        screened = self.access.screen(principal, queries, operation=AclOperation.DESCRIBE, topic=topic_of,
                                      or_cluster_action=True)
        allowed = screened.allowed
        kinds = self.diskless_kinds(allowed)
        out: list[PartitionOffset] = []
        for q in (q for q, k in zip(allowed, kinds, strict=True) if k is None):
            try:
                offset, ts, epoch = self.requests.list_offset(
                    q.topic, q.partition, q.timestamp, isolation_level=isolation_level,
                    current_leader_epoch=q.current_leader_epoch if q.current_leader_epoch is not None else -1)
            except LowtideError as err:
                out.append(_refused(q, err))
                continue
            out.append(PartitionOffset(topic=q.topic, partition=q.partition, offset=offset, timestamp=ts,
                                       leader_epoch=epoch))
        if len(out) != len(kinds):
            assert self.diskless is not None
            answers = self.diskless.list_offsets(
                [(k, q.partition, q.timestamp) for q, k in zip(allowed, kinds, strict=True) if k is not None],
                isolation_level=isolation_level)
            out = interleave(kinds, out, [_without_epoch(a) for a in answers])
        return screened.merge(out, _refused)


def _without_epoch(answer: PartitionOffset) -> PartitionOffset:
    """A diskless shard's answer carries no leader epoch, and no offsets with an error."""
    if answer.error is not None:
        return PartitionOffset(topic=answer.topic, partition=answer.partition, error=answer.error)
    return PartitionOffset(topic=answer.topic, partition=answer.partition, offset=answer.offset,
                           timestamp=answer.timestamp)
