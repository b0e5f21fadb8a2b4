"""Fetch on a replica, for both doors (issue 47): the gRPC ``Replica.Fetch`` / ``Replicate``
servicer, the replication listener and the Kafka listener's Fetch call this one handler with
``lowtide.messages`` types; the Kafka door builds no protobuf, and the records it answers with are
the bytes the log read, never copied into a message first.

The policy, in order (as Kafka's ``KafkaApis.handleFetchRequest``):

1. **A follower's fetch** (``replica_id`` >= 0) must come from that replica (CLUSTER_ACTION, and
   with auth on the broker's own identity), checked before anything is read or recorded: a refused
   follower fetch must not move the follower's LEO/LSO as the leader sees them (HW, ISR, low
   watermark). It may be a round of a fetch session (fetch_session.py).
2. **A consumer's fetch** needs READ on each topic; a fetch of internal topics only is also
   allowed with CLUSTER_ACTION (the brokers read ``__consumer_offsets`` for consumed retention).
3. **Classic or diskless** (consumers only): a classic partition is read here, long-polled
   (``ReplicaRequests.fetch_steps``); a diskless one from object storage through the diskless
   broker. With both, the classic ones are read without waiting and the diskless read waits
   (unless the classic read found data).
4. Answers come back one per request item, in request order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from lowtide.auth.access import Screened
from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages.replica import FetchedPartition, FetchPosition, FetchSessionRound
from lowtide.replica.handler_parts import RequestHandler, interleave, internal_only, topic_of
from lowtide.replica.metrics import count_fetched_bytes
from lowtide.rpc.steps import Blocking, Steps


def _refused(item: FetchPosition, error: LowtideError) -> FetchedPartition:
    return FetchedPartition(topic=item.topic, partition=item.partition, error=error)


class FetchHandler(RequestHandler):
    """Fetch for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; what it calls is thread-safe. ``fetch_steps`` runs as steps
    (rpc/steps.py): parks are yielded, a diskless read is a ``Blocking`` step.
    """

    def fetch_steps(self, principal: str, items: Sequence[FetchPosition], *, replica_id: int = -1,
                    max_wait_ms: int, min_bytes: int, max_bytes: int, isolation_level: int = 0, peer: str = "",
                    on_cancel: Callable[[Callable[[], None]], object] | None = None,
                    session: FetchSessionRound | None = None) -> Steps[list[FetchedPartition]]:
        """One answer per item, in order. ``peer`` names the caller's connection (parking
        bounds); ``on_cancel`` registers a callback fired when the caller cancels or goes away,
        which releases a parked fetch at once."""
        if replica_id >= 0:
            self.access.require_follower(principal, replica_id)
            screened = Screened.everything(items)
        else:
            screened = self.access.screen(principal, items, operation=AclOperation.READ, topic=topic_of,
                                          or_cluster_action=internal_only(items))
        allowed = screened.allowed
        kinds = [None] * len(allowed) if replica_id >= 0 else self.diskless_kinds(allowed)
        classic = [it for it, k in zip(allowed, kinds, strict=True) if k is None]
        diskless = [(k, it) for it, k in zip(allowed, kinds, strict=True) if k is not None]
        outcomes = (yield from self.requests.fetch_steps(
            classic, replica_id=replica_id, max_wait_ms=0 if diskless else max_wait_ms, min_bytes=min_bytes,
            max_bytes=max_bytes, peer=peer, isolation_level=isolation_level, on_cancel=on_cancel,
            session=session)) if classic or session is not None else []
        if diskless:
            cancelled = threading.Event()
            if on_cancel is not None:
                on_cancel(cancelled.set)
            found = any(o.records for o in outcomes)
            assert self.diskless is not None
            read = yield Blocking(lambda: self.diskless.fetch(
                diskless, max_wait_ms=0 if found else max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
                cancelled=cancelled.is_set, isolation_level=isolation_level))
            outcomes = interleave(kinds, outcomes, read)
        kind = "follower" if replica_id >= 0 else "consumer"
        for o in outcomes:
            if o.records:
                count_fetched_bytes(o.topic, kind, len(o.records))
        return screened.merge(outcomes, _refused)
