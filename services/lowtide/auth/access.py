"""Per-call access control for a server port: who is calling, and which partitions of a request
the caller may touch (Kafka's ``KafkaApis`` checks, as a domain object the servicers call).

A servicer authenticates the call, screens the request's partitions, hands only the allowed ones
to its domain object and merges the refused ones back in request order::

    principal = access.authenticate(context.invocation_metadata())
    screened = access.screen(principal, request.partitions, operation=AclOperation.WRITE,
                             topic=lambda p: p.topic)
    results = requests.produce([...for p in screened.allowed...]) if screened.any_allowed else []
    return screened.merge(results, refuse=lambda p, err: <result of p carrying err>)

so the request paths below the servicer stay free of authorization. A refused partition gets
TOPIC_AUTHORIZATION_FAILED and is never handed on, so it changes nothing.

With auth off, ``authenticate`` ignores any token and answers ``User:ANONYMOUS`` and every check
allows: nothing changes, and the hot paths pay one attribute test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import grpc

from lowtide.auth.acl import (
    ANONYMOUS_PRINCIPAL,
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    Authorizer,
    ResourceType,
    parse_principal,
)
from lowtide.auth.identity import broker_principal, is_service_principal
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import Authenticator
from lowtide.errors import ClusterAuthorizationFailed, LowtideError, TopicAuthorizationFailed, UnknownServerError
from lowtide.metadata.store import MetadataStore
from lowtide.tls.principal import PrincipalMapper

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Screened(Generic[T]):
    """A request's partitions after an authorization check.

    ``allowed`` are the items the caller may touch, in request order; ``refused`` maps the request
    position of every other item to its error. ``merge`` puts the answers back together.
    """

    items: Sequence[T]
    allowed: list[T]
    allowed_positions: list[int]
    refused: dict[int, LowtideError]

    @classmethod
    def everything(cls, items: Sequence[T]) -> Screened[T]:
        items = list(items)
        return cls(items=items, allowed=items, allowed_positions=list(range(len(items))), refused={})

    @property
    def any_allowed(self) -> bool:
        """False only when something was refused and nothing allowed: then the domain call is
        skipped (Kafka answers at once), while an empty request still reaches it unchanged."""
        return bool(self.allowed) or not self.refused

    def refusing(self, error_of: Callable[[T], LowtideError | None]) -> Screened[T]:
        """These items with the allowed ones for which ``error_of`` gives an error refused too."""
        allowed: list[T] = []
        positions: list[int] = []
        refused = dict(self.refused)
        for position, item in zip(self.allowed_positions, self.allowed, strict=True):
            error = error_of(item)
            if error is None:
                allowed.append(item)
                positions.append(position)
            else:
                refused[position] = error
        return Screened(items=self.items, allowed=allowed, allowed_positions=positions, refused=refused)

    def merge(self, results: Sequence[R], refuse: Callable[[T, LowtideError], R]) -> list[R]:
        """One answer per request item, in request order: ``results`` answer ``allowed`` (one
        each, same order), ``refuse(item, error)`` builds the answer of a refused item."""
        if not self.refused:
            return list(results)
        if len(results) != len(self.allowed_positions):
            raise UnknownServerError(f"{len(results)} answers for {len(self.allowed_positions)} allowed partitions")
        out: list[R | None] = [None] * len(self.items)
        for position, result in zip(self.allowed_positions, results, strict=True):
            out[position] = result
        for position, error in self.refused.items():
            out[position] = refuse(self.items[position], error)
        return out  # type: ignore[return-value] - every position was filled above


class AccessControl:
    """Authentication and the per-operation checks of one server.

    Contract:

    * ``authenticate(metadata)``: auth on -> the token's principal, or SaslAuthenticationFailed
      (gRPC UNAUTHENTICATED) when the token is missing, malformed or unknown; auth off ->
      ``User:ANONYMOUS`` whatever was sent.
    * ``screen(principal, items, operation=..., topic=...)``: items whose topic allows
      ``operation`` are allowed; the rest get TOPIC_AUTHORIZATION_FAILED. With
      ``or_cluster_action`` a principal holding CLUSTER_ACTION on the CLUSTER is allowed everything
      (a broker or the front door acting for a caller it already authorized).
    * ``require_cluster(principal, operation)``: ClusterAuthorizationFailed unless allowed on the
      CLUSTER.
    * ``require_follower(principal, replica_id)``: a follower fetch needs CLUSTER_ACTION on the
      CLUSTER *and* must come from ``User:broker-<replica_id>``; else ClusterAuthorizationFailed.

    Decisions come from the Authorizer's in-memory ACL snapshot (reloaded from the metadata image
    when the watch reports an ACL change) and tokens from the metadata image, so a produce never
    waits for the metadata store, and keeps being checked while it is away. Thread-safe (both
    collaborators are).
    """

    def __init__(self, *, authenticator: Authenticator | None, authorizer: Authorizer | None) -> None:
        self._authenticator = authenticator
        self._authorizer = authorizer
        self._enabled = authorizer is not None and authorizer.enabled
        if self._enabled and authenticator is None:
            raise ValueError("access control with authorization on needs an authenticator")

    @classmethod
    def allow_all(cls) -> AccessControl:
        """Auth off: no store, every call anonymous, everything allowed."""
        return cls(authenticator=None, authorizer=None)

    @property
    def enabled(self) -> bool:
        return self._enabled

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
        if not self._enabled:
            return ANONYMOUS_PRINCIPAL
        assert self._authenticator is not None  # checked in __init__
        return self._authenticator.authenticate(metadata)

    def authenticate_call(self, context: grpc.ServicerContext) -> str:
        """``authenticate`` for a gRPC call: its token, or with mutual TLS its certificate."""
        if not self._enabled:
            return ANONYMOUS_PRINCIPAL
        assert self._authenticator is not None  # checked in __init__
        return self._authenticator.authenticate_context(context)

    def authenticate_peer(self, metadata: Iterable[tuple[str, str | bytes]] | None,
                          certificate_der: bytes | None) -> str:
        """``authenticate_call`` for a plain-socket peer (lowtide.rpc.framed): its HELLO's
        metadata, and its TLS client certificate (DER) if it presented one."""
        if not self._enabled:
            return ANONYMOUS_PRINCIPAL
        assert self._authenticator is not None  # checked in __init__
        return self._authenticator.authenticate_peer(metadata, certificate_der)

    def allows(self, principal: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        if not self._enabled:
            return True
        assert self._authorizer is not None
        return self._authorizer.authorize(principal=principal, operation=operation, resource_type=resource_type,
                                          resource_name=name)

    def screen(self, principal: str, items: Iterable[T], *, operation: AclOperation, topic: Callable[[T], str],
               or_cluster_action: bool = False) -> Screened[T]:
        items = list(items)
        if not self._enabled or (or_cluster_action and self._cluster_action(principal)):
            return Screened.everything(items)
        decisions: dict[str, bool] = {}  # one check per topic, however many of its partitions
        allowed: list[T] = []
        positions: list[int] = []
        refused: dict[int, LowtideError] = {}
        for position, item in enumerate(items):
            name = topic(item)
            ok = decisions.get(name)
            if ok is None:
                ok = decisions[name] = self.allows(principal, operation, ResourceType.TOPIC, name)
            if ok:
                allowed.append(item)
                positions.append(position)
            else:
                refused[position] = TopicAuthorizationFailed(
                    f"{principal} is not authorized to {operation.name} on TOPIC {name!r}")
        return Screened(items=items, allowed=allowed, allowed_positions=positions, refused=refused)

    def require_cluster(self, principal: str, operation: AclOperation) -> None:
        if not self.allows(principal, operation, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME):
            raise ClusterAuthorizationFailed(f"{principal} is not authorized to {operation.name} on the CLUSTER")

    def require_follower(self, principal: str, replica_id: int) -> None:
        if not self._enabled:
            return
        self.require_cluster(principal, AclOperation.CLUSTER_ACTION)
        expected = broker_principal(replica_id)
        if principal != expected:
            # CLUSTER_ACTION alone would let any broker (or a leaked broker token) speak for another
            # broker and move the HW or low watermark with offsets it never replicated.
            raise ClusterAuthorizationFailed(
                f"{principal} may not fetch as replica {replica_id}: only {expected} may")

    def _cluster_action(self, principal: str) -> bool:
        return self.allows(principal, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)


def build_access_control(*, metadata: MetadataStore, enabled: bool, tokens_file: str | Path | None = None,
                         super_users: frozenset[str] = frozenset(),
                         certificates: PrincipalMapper | None = None) -> AccessControl:
    """The AccessControl of a server: tokens from ``tokens_file`` and the metadata store, ACLs from
    the metadata store, and with ``certificates`` (mutual TLS) principals from client
    certificates."""
    if not enabled:
        return AccessControl.allow_all()
    return AccessControl(
        authenticator=Authenticator(metadata=metadata, tokens_file=tokens_file, required=True,
                                    certificates=certificates, reserved_for_certificates=is_service_principal),
        authorizer=Authorizer(store=AclStore(metadata=metadata), enabled=True, super_users=super_users))


def parse_super_users(text: str | None) -> frozenset[str]:
    """``--super-users "User:admin, User:ops"`` -> the principals (each validated)."""
    return frozenset(parse_principal(u.strip()) for u in (text or "").split(",") if u.strip())
