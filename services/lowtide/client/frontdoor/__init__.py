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

from collections.abc import Sequence
from functools import cached_property

from lowtide.client.frontdoor.acls import RemoteAcls
from lowtide.client.frontdoor.groups import RemoteConsumerGroups, RemoteGroups, RemoteMembership, RemoteShareGroups
from lowtide.client.frontdoor.part import RemotePart
from lowtide.client.frontdoor.scram import RemoteScram
from lowtide.client.frontdoor.topics import (
    RemoteConfigs,
    RemoteElections,
    RemotePartitions,
    RemoteReassigner,
    RemoteRecordsDeleter,
    RemoteTopics,
)
from lowtide.client.frontdoor.transactions import RemoteTransactions
from lowtide.rpc.channels import ChannelPool
from lowtide_pb import admin_pb2_grpc

__all__ = ["RemoteFrontDoor", "RemoteFrontDoorView", "RemotePart"]


class RemoteFrontDoorView:
    """``FrontDoor``'s parts for one caller (see the module doc). Built per request: each part is
    made when first used, so a request builds only the one it calls."""

    def __init__(self, stub: admin_pb2_grpc.AdminStub, *, metadata: Sequence[tuple[str, str]],
                 timeout_s: float) -> None:
        self._stub = stub
        self._parts = {"metadata": metadata, "timeout_s": timeout_s}

    @cached_property
    def topics(self) -> RemoteTopics:
        return RemoteTopics(self._stub, **self._parts)

    @cached_property
    def deleter(self) -> RemoteRecordsDeleter:
        return RemoteRecordsDeleter(self._stub, **self._parts)

    @cached_property
    def configs(self) -> RemoteConfigs:
        return RemoteConfigs(self._stub, **self._parts)

    @cached_property
    def partitions(self) -> RemotePartitions:
        return RemotePartitions(self._stub, **self._parts)

    @cached_property
    def elections(self) -> RemoteElections:
        return RemoteElections(self._stub, **self._parts)

    @cached_property
    def reassigner(self) -> RemoteReassigner:
        return RemoteReassigner(self._stub, **self._parts)

    @cached_property
    def groups(self) -> RemoteGroups:
        return RemoteGroups(self._stub, **self._parts)

    @cached_property
    def members(self) -> RemoteMembership:
        return RemoteMembership(self._stub, **self._parts)

    @cached_property
    def consumer_groups(self) -> RemoteConsumerGroups:
        return RemoteConsumerGroups(self._stub, **self._parts)

    @cached_property
    def share_groups(self) -> RemoteShareGroups:
        return RemoteShareGroups(self._stub, **self._parts)

    @cached_property
    def transactions(self) -> RemoteTransactions:
        return RemoteTransactions(self._stub, **self._parts)

    @cached_property
    def acls(self) -> RemoteAcls:
        return RemoteAcls(self._stub, **self._parts)

    @cached_property
    def scram(self) -> RemoteScram:
        return RemoteScram(self._stub, **self._parts)


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
