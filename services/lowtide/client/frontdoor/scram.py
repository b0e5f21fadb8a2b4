"""The front door's SCRAM credential administration over gRPC: ``frontdoor.admin.scram.ScramAdmin``'s
remote twin (Admin.DescribeUserScramCredentials / AlterUserScramCredentials, KIP-554), for a
replica's Kafka listener.

Same methods, answers and errors as the in-process object (``describe`` raises a refused caller's
error, ``alter`` answers it per user). A front door that keeps no credentials answers
INVALID_REQUEST, raised here as the Kafka handler raises it in process. The front door checks the
caller from the call metadata, so ``principal`` is not sent."""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.client.frontdoor.part import RemotePart
from lowtide.errors import LowtideError
from lowtide.messages.admin import Deletion, Upsertion, UserCredentials
from lowtide.rpc.convert import scram as convert


class RemoteScram(RemotePart):
    """``ScramAdmin`` over the Admin service. Thread-safe (the stub is)."""

    def describe(self, *, principal: str, users: Sequence[str] | None) -> list[UserCredentials]:
        return convert.describe_results(self._call(self._stub.DescribeUserScramCredentials,
                                                   convert.describe_request(users)))

    def alter(self, *, principal: str, deletions: Sequence[Deletion],
              upsertions: Sequence[Upsertion]) -> list[tuple[str, LowtideError | None]]:
        return convert.alter_results(self._call(self._stub.AlterUserScramCredentials,
                                                convert.alter_request(deletions=deletions, upsertions=upsertions)))
