"""KIP-11 style ACLs: the domain model and the authorizer that answers "may P do O on R?".

The model (bindings, filters, their enums and parsers) lives in ``lowtide.messages.acls``, where
the Kafka listener can build it too, and is re-exported here. The enums carry the same numbers as
the ``lowtide.v1`` proto enums (and as Kafka's), so conversion is a plain ``Enum(int)`` and never a
lookup table. Only ``lowtide.rpc.convert.acls`` touches the generated code.

Semantics follow Kafka's ``AclAuthorizer``:

* authorization disabled -> allow; a super user -> allow;
* any matching DENY wins over every ALLOW;
* otherwise any matching ALLOW allows; no match denies;
* ALLOW of READ, WRITE, DELETE or ALTER implies ALLOW of DESCRIBE (a DENY implies nothing);
* ALLOW of ALTER_CONFIGS implies ALLOW of DESCRIBE_CONFIGS;
* operation ALL matches every operation; principal ``User:*`` matches every principal;
* a LITERAL binding named ``*`` matches every resource of its type; a PREFIXED binding matches
  every name starting with its name; the CLUSTER resource is always named ``kafka-cluster``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from lowtide.errors import (
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    LowtideError,
    TopicAuthorizationFailed,
    TransactionalIdAuthorizationFailed,
)
from lowtide.messages.acls import (  # noqa: F401 - re-exported: the model's home for lowtide.auth's users
    CLUSTER_RESOURCE_NAME,
    PRINCIPAL_TYPE,
    WILDCARD_RESOURCE,
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
    parse_operation,
    parse_pattern_type,
    parse_permission,
    parse_principal,
    parse_resource_type,
)

if TYPE_CHECKING:
    from lowtide.auth.store import AclStore

log = logging.getLogger(__name__)

WILDCARD_PRINCIPAL = "User:*"
ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"

# Kafka: an ALLOW of any of these also allows DESCRIBE (you may see what you may use).
_IMPLIES_DESCRIBE = frozenset(
    {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
)


class _AclIndex:
    """Bindings grouped by resource type so one check scans only bindings of that type.

    Built once per ACL version and never mutated afterwards, so readers need no lock.
    """

    __slots__ = ("literal", "wildcard", "prefixed")

    def __init__(self, bindings: Iterable[AclBinding]) -> None:
        self.literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self.wildcard: dict[ResourceType, list[AclBinding]] = {}
        self.prefixed: dict[ResourceType, list[AclBinding]] = {}
        for b in bindings:
            if b.pattern_type is PatternType.PREFIXED:
                self.prefixed.setdefault(b.resource_type, []).append(b)
            elif b.resource_name == WILDCARD_RESOURCE:
                self.wildcard.setdefault(b.resource_type, []).append(b)
            else:
                self.literal.setdefault((b.resource_type, b.resource_name), []).append(b)

    def matching(self, resource_type: ResourceType, resource_name: str) -> list[AclBinding]:
        out = list(self.literal.get((resource_type, resource_name), ()))
        out.extend(self.wildcard.get(resource_type, ()))
        out.extend(b for b in self.prefixed.get(resource_type, ()) if resource_name.startswith(b.resource_name))
        return out


_FAILURE_BY_TYPE: dict[ResourceType, type[LowtideError]] = {
    ResourceType.TOPIC: TopicAuthorizationFailed,
    ResourceType.GROUP: GroupAuthorizationFailed,
    ResourceType.CLUSTER: ClusterAuthorizationFailed,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailed,
}


class Authorizer:
    """Answers ``authorize(principal, operation, resource)`` from the ACLs in an AclStore.

    Fast path: the ACL list lives in memory as an index, plus a memo of recent decisions. Nothing
    polls: the store's listener (``AclStore.listen``, the metadata watch) calls ``invalidate()``
    on every ACL change, and the next ``authorize`` reloads the list from the process's metadata
    image (no round trip) if the store's version moved. So a change made through any front door
    is seen everywhere as soon as the watch delivers it, and in the writing process before the
    change returns.

    With etcd away the image keeps its ACLs and so does the authorizer (as Kafka's authorizer keeps
    its cache while the controller is away); if the image never loaded, MetadataStoreUnavailable
    propagates and the request fails closed.

    Thread-safe: any number of threads may call ``authorize``; one of them reloads at a time
    while the others keep using the previous immutable snapshot.
    """

    _MEMO_LIMIT = 65536

    def __init__(
        self,
        *,
        store: AclStore,
        enabled: bool,
        super_users: frozenset[str] = frozenset(),
    ) -> None:
        for user in super_users:
            parse_principal(user)
        self._store = store
        self._enabled = enabled
        self._super_users = frozenset(super_users)
        self._refresh_lock = threading.Lock()
        self._version: int | None = None
        self._index = _AclIndex(())
        # Decisions keyed by (principal, op, type, name); replaced wholesale on each reload, so a
        # stale decision can never outlive the ACL version it was computed from.
        self._memo: dict[tuple[str, AclOperation, ResourceType, str], bool] = {}
        # Set on every ACL change (and before the first load): the next authorize reloads.
        self._stale = True
        if enabled:
            store.listen(self.invalidate)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def super_users(self) -> frozenset[str]:
        return self._super_users

    def invalidate(self) -> None:
        """Make the next ``authorize`` re-check the store's version (the store's listener calls it
        on every ACL change; quick: it only sets a flag)."""
        self._stale = True

    def authorize(
        self,
        *,
        principal: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool:
        """True when ``principal`` may perform ``operation`` on the resource (see module doc)."""
        if not self._enabled or principal in self._super_users:
            return True
        if self._stale:
            self._refresh_stale()
        decision = self._decide_memo(principal, operation, resource_type, resource_name)
        if not decision and self._refresh_lock.locked():
            # Another thread is reloading (an ACL changed): a denial waits for the reload instead
            # of coming from the previous snapshot, so an ACL just granted is not refused by a
            # request that merely raced the thread reloading it. Allowed requests never wait.
            with self._refresh_lock:
                pass
            decision = self._decide_memo(principal, operation, resource_type, resource_name)
        return decision

    def _decide_memo(self, principal: str, operation: AclOperation, resource_type: ResourceType,
                     resource_name: str) -> bool:
        memo = self._memo  # read the reference once: a reload swaps in a new dict
        key = (principal, operation, resource_type, resource_name)
        decision = memo.get(key)
        if decision is None:
            decision = self._decide(self._index, principal, operation, resource_type, resource_name)
            if len(memo) >= self._MEMO_LIMIT:
                memo.clear()  # bounded memory; recomputing is cheap
            memo[key] = decision
        return decision

    def require(
        self,
        *,
        principal: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> None:
        """``authorize`` or raise Topic/Group/ClusterAuthorizationFailed naming what was refused."""
        if not self.authorize(
            principal=principal, operation=operation, resource_type=resource_type, resource_name=resource_name
        ):
            rtype, op = ResourceType(resource_type), AclOperation(operation)
            raise _FAILURE_BY_TYPE[rtype](
                f"{principal} is not authorized to {op.name} on {rtype.name} {resource_name!r}"
            )

    def authorized_operations(self, *, principal: str, resource_type: ResourceType, resource_name: str,
                              operations: Iterable[AclOperation]) -> int:
        """Kafka's ``authorized_operations`` bit field of a described resource: bit ``op`` set for
        each of ``operations`` the principal may perform on it (the describing coordinators each
        name the operations their resource type has)."""
        bits = 0
        for op in operations:
            if self.authorize(principal=principal, operation=op, resource_type=resource_type,
                              resource_name=resource_name):
                bits |= 1 << int(op)
        return bits

    def authorize_cluster(self, *, principal: str, operation: AclOperation) -> bool:
        """``authorize`` on the one CLUSTER resource, which the admin operations are checked on."""
        return self.authorize(principal=principal, operation=operation, resource_type=ResourceType.CLUSTER,
                              resource_name=CLUSTER_RESOURCE_NAME)

    def require_cluster(self, *, principal: str, operation: AclOperation) -> None:
        """``require`` on the CLUSTER resource: ClusterAuthorizationFailed naming what was refused."""
        self.require(principal=principal, operation=operation, resource_type=ResourceType.CLUSTER,
                     resource_name=CLUSTER_RESOURCE_NAME)

    def refresh(self) -> None:
        """Reload now if the store's version changed (blocking; normally the listener's
        ``invalidate`` makes the next ``authorize`` do it)."""
        with self._refresh_lock:
            self._stale = False
            try:
                self._reload_if_changed()
            except Exception:
                self._stale = True
                raise

    def _refresh_stale(self) -> None:
        # Only one thread reloads; the rest keep serving from the current snapshot, except before
        # the very first load, when there is nothing to serve from and they must wait.
        if not self._refresh_lock.acquire(blocking=self._version is None):
            return
        try:
            if not self._stale:
                return
            self._stale = False  # before reading: a change applied meanwhile sets it again
            try:
                self._reload_if_changed()
            except Exception:
                if self._version is None:
                    self._stale = True
                    raise  # nothing loaded yet: fail closed, and try again on the next call
                # Keep the last good ACLs (a corrupt record): the next change tries again.
                log.exception("reloading the ACLs failed; keeping the ones loaded at version %s", self._version)
        finally:
            self._refresh_lock.release()

    def _reload_if_changed(self) -> None:
        version = self._store.version()
        if version == self._version:
            return
        version, bindings = self._store.snapshot()
        # Index first, memo second: a reader that sees the new memo also sees the new index, so
        # the new memo never receives a decision computed from the old ACLs.
        self._index = _AclIndex(bindings)
        self._memo = {}
        self._version = version

    @staticmethod
    def _decide(
        index: _AclIndex,
        principal: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool:
        allowed = False
        for b in index.matching(resource_type, resource_name):
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.permission is AclPermission.DENY:
                if b.operation == operation or b.operation is AclOperation.ALL:
                    return False  # any matching DENY wins, whatever ALLOWs exist
            elif not allowed:
                allowed = (
                    b.operation == operation
                    or b.operation is AclOperation.ALL
                    or (operation == AclOperation.DESCRIBE and b.operation in _IMPLIES_DESCRIBE)
                    or (operation == AclOperation.DESCRIBE_CONFIGS and b.operation is AclOperation.ALTER_CONFIGS)
                )
        return allowed
