"""WriteTxnMarkers (KIP-98) on a replica, for both doors (issue 47): the gRPC
``Replica.WriteTxnMarkers`` servicer (what the front door's transaction coordinator calls) and the
Kafka listener (``kafka-transactions abort``, Kafka's ``Admin.abortTransaction``, sends it to the
partition's leader) call this one handler with ``lowtide.messages`` types.

The policy: CLUSTER_ACTION on the cluster, as Kafka asks of its WriteTxnMarkers, else the whole
call fails and nothing is appended; each marker's control batch goes to the partitions it names
that this replica leads, acks=all (``ReplicaRequests.write_txn_markers``). One answer per marker
and, in it, per partition, in request order.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.auth.acl import AclOperation
from lowtide.errors import LowtideError
from lowtide.messages.replica import TxnMarkerRequest, TxnMarkerResult
from lowtide.replica.handler_parts import RequestHandler

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
        answers = self.manager.requests.write_txn_markers(list(markers), timeout_ms=timeout_ms or DEFAULT_TIMEOUT_MS)
        return [[TxnMarkerResult(topic=topic, partition=partition, producer_id=producer_id,
                                 error=info if isinstance(info, LowtideError) else None)
                 for topic, partition, info in results] for producer_id, results in answers]
