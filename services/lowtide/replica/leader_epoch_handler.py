"""OffsetForLeaderEpoch on a replica, for both doors (issue 47): the gRPC
``Replica.OffsetForLeaderEpoch`` servicer (its followers' and the front door's) and the Kafka
listener (KIP-320: a consumer checking its position after a leader change) call this one handler
with ``lowtide.messages`` types.

The policy: DESCRIBE on each topic, or CLUSTER_ACTION (brokers, and the front door acting for a
caller it checked); a refused partition is TOPIC_AUTHORIZATION_FAILED with epoch and end offset -1.
The others are answered from this replica's log, fenced on the caller's leader epoch
(``ReplicaRequests.offset_for_leader_epoch``). One answer per query, in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages.replica import EpochEndOffset, EpochQuery
from lowtide.replica.handler_parts import RequestHandler, topic_of


def _refused(query: EpochQuery, error: LowtideError) -> EpochEndOffset:
    return EpochEndOffset(topic=query.topic, partition=query.partition, error=error)


class OffsetForLeaderEpochHandler(RequestHandler):
    """OffsetForLeaderEpoch for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; what it calls is thread-safe. It never waits on a peer.
    """

    def offset_for_leader_epoch(self, principal: str, queries: Sequence[EpochQuery]) -> list[EpochEndOffset]:
        screened = self.access.screen(principal, queries, operation=AclOperation.DESCRIBE, topic=topic_of,
                                      or_cluster_action=True)
        answers = self.requests.offset_for_leader_epoch(list(screened.allowed)) if screened.any_allowed else []
        return screened.merge(answers, _refused)
