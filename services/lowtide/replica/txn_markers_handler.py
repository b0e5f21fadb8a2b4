"""WriteTxnMarkers (KIP-98) on a replica, for both doors (issue 47): the gRPC
``Replica.WriteTxnMarkers`` servicer (what the front door's transaction coordinator calls) and the
Kafka listener (``kafka-transactions abort``, Kafka's ``Admin.abortTransaction``, sends it to the
partition's leader) call this one handler with ``lowtide.messages`` types.

The policy: CLUSTER_ACTION on the cluster, as Kafka asks of its WriteTxnMarkers, else the whole
call fails and nothing is appended; each marker's control batch goes to the partitions it names
that this replica leads, acks=all (``ReplicaRequests.write_txn_markers``), or, for a diskless
partition (which no replica hosts: any replica writes it), to the diskless broker, which commits it
through the partition's coordinator shard like a produced batch (issue 50). One answer per marker
and, in it, per partition, in request order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages.replica import TxnMarkerRequest, TxnMarkerResult
from lowtide.replica.handler_parts import RequestHandler, interleave

DEFAULT_TIMEOUT_MS = 30000


class TxnMarkersHandler(RequestHandler):
    """WriteTxnMarkers for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; what it calls is thread-safe. ``write_txn_markers`` blocks until the
    markers are replicated (or the timeout): call it off any event loop.
    """

    def write_txn_markers(self, principal: str, markers: Sequence[TxnMarkerRequest], *,
                          timeout_ms: int = 0) -> list[list[TxnMarkerResult]]:
        """Per marker, in order, its partitions' results; raises CLUSTER_AUTHORIZATION_FAILED whole."""
        self.access.require_cluster(principal, AclOperation.CLUSTER_ACTION)
        timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        kinds = [self.diskless_kinds([_Key(t) for t, _ in m.partitions]) for m in markers]
        classic = [replace(m, partitions=tuple(k for k, info in zip(m.partitions, ks, strict=True) if info is None))
                   for m, ks in zip(markers, kinds, strict=True)]
        answers = self.manager.requests.write_txn_markers(classic, timeout_ms=timeout_ms)
        out = []
        for marker, ks, (producer_id, results) in zip(markers, kinds, answers, strict=True):
            mine = [TxnMarkerResult(topic=topic, partition=partition, producer_id=producer_id,
                                    error=info if isinstance(info, LowtideError) else None)
                    for topic, partition, info in results]
            diskless = [(info, key) for key, info in zip(marker.partitions, ks, strict=True) if info is not None]
            if diskless:
                assert self.diskless is not None
                written = self.diskless.write_txn_markers(
                    [(info, partition) for info, (_, partition) in diskless], producer_id=marker.producer_id,
                    producer_epoch=marker.producer_epoch, commit=marker.commit,
                    coordinator_epoch=marker.coordinator_epoch, timeout_ms=timeout_ms)
                theirs = [TxnMarkerResult(topic=topic, partition=partition, producer_id=marker.producer_id,
                                          error=w if isinstance(w, LowtideError) else None)
                          for (_, (topic, partition)), w in zip(diskless, written, strict=True)]
                mine = interleave(ks, mine, theirs)
            out.append(mine)
        return out


class _Key:
    """A topic as ``diskless_kinds`` takes an item (it reads ``.topic``)."""

    __slots__ = ("topic",)

    def __init__(self, topic: str) -> None:
        self.topic = topic
