"""ACL administration behind Admin.CreateAcls / DescribeAcls / DeleteAcls.

When authorization is on, creating and deleting ACLs needs ALTER on CLUSTER and describing them
DESCRIBE on CLUSTER (Kafka's rules); super users may always. Changes go to the shared AclStore, so
every front door's Authorizer sees them within its refresh interval; this front door's at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from lowtide.auth.acl import AclBinding, AclFilter, AclOperation, Authorizer
from lowtide.auth.store import AclStore
from lowtide.errors import LowtideError


class AclAdmin:
    """Authorized CRUD over ACL bindings. Thread-safe (store and authorizer are)."""

    def __init__(self, *, store: AclStore, authorizer: Authorizer) -> None:
        self._store = store
        self._authorizer = authorizer

    def create_acls(self, *, principal: str, bindings: Sequence[AclBinding]) -> list[LowtideError | None]:
        """Add the bindings; one result per binding (Kafka answers CreateAcls per binding)."""
        try:
            self._authorizer.require_cluster(principal=principal, operation=AclOperation.ALTER)
        except LowtideError as err:
            return [err for _ in bindings]
        self._store.add(list(bindings))
        self._authorizer.invalidate()
        return [None for _ in bindings]

    def describe_acls(self, *, principal: str, acl_filter: AclFilter) -> list[AclBinding]:
        self._authorizer.require_cluster(principal=principal, operation=AclOperation.DESCRIBE)
        return self._store.list(acl_filter)

    def delete_acls(self, *, principal: str, filters: Sequence[AclFilter]) -> list[AclBinding]:
        self._authorizer.require_cluster(principal=principal, operation=AclOperation.ALTER)
        deleted = self._store.remove(list(filters))
        self._authorizer.invalidate()
        return deleted
