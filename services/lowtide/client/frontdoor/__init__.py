"""The front door's domain objects, reached over gRPC: what a replica's Kafka listener calls.

A Kafka admin, group or transaction request reaching a replica's listener is answered by the
front door. Its handlers (``lowtide.kafka.apis_*``) call the front door's domain objects by their
Python methods, with ``lowtide.messages`` types, whichever process they run in
(``lowtide.kafka.broker.Call.front``):

* in the front door's own process, ``lowtide.frontdoor.servicer.FrontDoor`` itself;
* in a replica's, ``RemoteFrontDoor.bound(metadata)``: objects with the same methods and the same
  answers, which carry the call over the Admin gRPC service with the connection's identity as
  call metadata. The front door authenticates and authorizes it again, as any gRPC call.

Each part converts with the service's converter module (``lowtide.rpc.convert``), the one its
servicer uses the other way round; so a message has one protobuf mapping, tested once.

Thread-safe: the channel pool is; a bound view holds only the call metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lowtide.rpc.channels import ChannelPool, call
from lowtide_pb import admin_pb2_grpc

T = TypeVar("T")


class RemotePart:
    """Base of one remote domain object: the Admin stub, the caller's metadata, the deadline."""

    def __init__(self, stub: admin_pb2_grpc.AdminStub, *, metadata: Sequence[tuple[str, str]],
                 timeout_s: float) -> None:
        self._stub = stub
        self._metadata = metadata
        self._timeout_s = timeout_s

    def _call(self, rpc: Callable[..., T], request: Any, *, timeout_s: float | None = None) -> T:
        """One unary call; a failed call raises the LowtideError it carried."""
        return call(rpc, request, metadata=self._metadata, timeout=timeout_s or self._timeout_s)


class RemoteFrontDoorView:
    """``FrontDoor``'s parts for one caller (see the module doc). Built per request: cheap."""

    def __init__(self, stub: admin_pb2_grpc.AdminStub, *, metadata: Sequence[tuple[str, str]],
                 timeout_s: float) -> None:
        parts = {"metadata": metadata, "timeout_s": timeout_s}
        # Each area's remote objects are added here as they are converted (issue 47).
        # Imported here: the area modules subclass RemotePart from this one (an import cycle at the top).
        from lowtide.client.frontdoor.topics import (
            RemoteConfigs,
            RemoteElections,
            RemotePartitions,
            RemoteReassigner,
            RemoteRecordsDeleter,
            RemoteTopics,
        )

        self.topics = RemoteTopics(stub, **parts)
        self.deleter = RemoteRecordsDeleter(stub, **parts)
        self.configs = RemoteConfigs(stub, **parts)
        self.partitions = RemotePartitions(stub, **parts)
        self.elections = RemoteElections(stub, **parts)
        self.reassigner = RemoteReassigner(stub, **parts)
        from lowtide.client.frontdoor.acls import RemoteAcls
        from lowtide.client.frontdoor.scram import RemoteScram

        self.acls = RemoteAcls(stub, **parts)
        self.scram = RemoteScram(stub, **parts)
        from lowtide.client.frontdoor.groups import RemoteGroups, RemoteMembership
        from lowtide.client.frontdoor.transactions import RemoteTransactions

        self.groups, self.members = RemoteGroups(stub, **parts), RemoteMembership(stub, **parts)
        self.transactions = RemoteTransactions(stub, **parts)
        self._stub, self._parts = stub, parts


class RemoteFrontDoor:
    """The front door at ``address``; ``bound(metadata)`` gives the parts for one caller."""

    def __init__(self, *, address: str, channels: ChannelPool | None = None, timeout_s: float = 30.0) -> None:
        self.address = address
        self._owns_channels = channels is None
        self._channels = channels or ChannelPool()
        self._timeout_s = timeout_s

    def bound(self, metadata: Sequence[tuple[str, str]]) -> RemoteFrontDoorView:
        stub = self._channels.stub(self.address, admin_pb2_grpc.AdminStub)
        return RemoteFrontDoorView(stub, metadata=tuple(metadata), timeout_s=self._timeout_s)

    def close(self) -> None:
        if self._owns_channels:
            self._channels.close()
