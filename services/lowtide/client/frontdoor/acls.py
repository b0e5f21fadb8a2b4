"""The front door's ACL administration over gRPC: ``frontdoor.admin.acls.AclAdmin``'s remote twin
(Admin.CreateAcls / DescribeAcls / DeleteAcls), for a replica's Kafka listener.

Same methods, answers and errors as the in-process object: a refused caller is a per-binding error
of ``create_acls`` (CreateAcls answers per binding) and a raised LowtideError of the others. The
front door checks the caller from the call metadata, so ``principal`` is not sent."""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.client.frontdoor.part import RemotePart
from lowtide.errors import LowtideError
from lowtide.messages.acls import AclBinding, AclFilter
from lowtide.rpc.convert import acls as convert


class RemoteAcls(RemotePart):
    """``AclAdmin`` over the Admin service. Thread-safe (the stub is)."""

    def create_acls(self, *, principal: str, bindings: Sequence[AclBinding]) -> list[LowtideError | None]:
        if not bindings:
            return []
        return convert.create_results(self._call(self._stub.CreateAcls, convert.create_request(bindings)))

    def describe_acls(self, *, principal: str, acl_filter: AclFilter) -> list[AclBinding]:
        answer = self._call(self._stub.DescribeAcls, convert.describe_request(acl_filter))
        return [convert.binding_from_proto(b) for b in answer.acls]

    def delete_acls(self, *, principal: str, filters: Sequence[AclFilter]) -> list[AclBinding]:
        answer = self._call(self._stub.DeleteAcls, convert.delete_request(filters))
        return [convert.binding_from_proto(b) for b in answer.deleted]
