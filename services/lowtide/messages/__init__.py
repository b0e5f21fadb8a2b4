"""The messages of lowtide's services, as plain dataclasses, and the one ``TopicPartition``.

A service's handlers (servicer, domain code) and its clients (``lowtide.client``, other services
calling it) import the same module here, so both ends of a call agree on one shape and no server
package imports ``lowtide.client`` for a type:

* ``lowtide.messages.replica``      the ``lowtide.v1.Replica`` service (Produce, Fetch, ListOffsets,
                                    DeleteRecords, OffsetForLeaderEpoch, WriteTxnMarkers, DescribeLogs)
* ``lowtide.messages.coordinator``  the ``lowtide.v1.DisklessCoordinator`` service (KIP-1164)
* ``lowtide.messages.admin``        the ``lowtide.v1.Admin`` service (the front door)
* ``lowtide.messages.acls``         its ACL bindings and filters (``lowtide.auth.acl`` re-exports them)

This package is the lowest layer besides ``errors`` and ``clock``: it imports nothing else of
lowtide (and no generated protobuf code), and every package may import it (docs/architecture.md#import-rules).
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A (topic, partition) pair: the key of every per-partition map in lowtide.

    A plain ``(topic, partition)`` tuple is equal to it and hashes the same, so either may be used
    as a dict key or compared; JSON encodes it as the two-element list a tuple gives.
    """

    topic: str
    partition: int


__all__ = ["TopicPartition"]
