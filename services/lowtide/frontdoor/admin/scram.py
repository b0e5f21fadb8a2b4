"""SCRAM credential administration behind Admin.DescribeUserScramCredentials /
AlterUserScramCredentials (Kafka's KIP-554 APIs, which the Kafka listeners forward here).

Kafka's rules: describing needs DESCRIBE on the CLUSTER, altering ALTER on the CLUSTER (super
users may always; with authorization off anyone may). Results are per user:

* describe: users None/empty = every user with a credential; a named user without one gets
  RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE;
* alter: the same (user, mechanism) twice -> DUPLICATE_RESOURCE; an unknown mechanism ->
  UNSUPPORTED_SASL_MECHANISM; iterations outside 4096..16384, an empty name, an empty salt ->
  UNACCEPTABLE_CREDENTIAL; deleting a credential that does not exist -> RESOURCE_NOT_FOUND.
  A user with any error has none of its alterations applied; the others are applied together.

The password never arrives: an upsertion carries the salt and SaltedPassword, and only the keys
derived from it are stored (lowtide/auth/scram.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lowtide.auth.acl import AclOperation, Authorizer, parse_principal
from lowtide.auth.identity import BROKER_PRINCIPAL_PREFIX, FRONTDOOR_PRINCIPAL
from lowtide.auth.scram import Mechanism, ScramCredential, check_credential_input, mechanism_by_code
from lowtide.auth.scram_store import CredentialInfo, ScramStore
from lowtide.errors import (
    DuplicateResource,
    InvalidRequest,
    LowtideError,
    ResourceNotFound,
    UnacceptableCredential,
    UnsupportedSaslMechanism,
)
from lowtide.messages.admin import Deletion, ScramCredentialInfo, Upsertion, UserCredentials


def _shown(infos: Iterable[CredentialInfo]) -> tuple[ScramCredentialInfo, ...]:
    return tuple(ScramCredentialInfo(mechanism=i.mechanism.code, iterations=i.iterations) for i in infos)


def check_user_name(user: str) -> None:
    """UnacceptableCredential unless ``user`` can be a SCRAM user: the principal User:<user>."""
    if not user:
        raise UnacceptableCredential("the user name must not be empty")
    if user == "*":
        raise UnacceptableCredential("'*' is the wildcard principal, not a user")
    principal = f"User:{user}"
    try:
        parse_principal(principal)
    except InvalidRequest as err:
        raise UnacceptableCredential(err.message) from None
    if principal.startswith(BROKER_PRINCIPAL_PREFIX) or principal == FRONTDOOR_PRINCIPAL:
        # Service identities hold CLUSTER_ACTION and authenticate with their token files only: a
        # password for one would be a second, weaker key to the replication protocol.
        raise UnacceptableCredential(f"{principal} is a lowtide service identity")


class ScramAdmin:
    """Authorized reads and changes of SCRAM credentials. Thread-safe (store and authorizer are)."""

    def __init__(self, *, store: ScramStore, authorizer: Authorizer) -> None:
        self._store = store
        self._authorizer = authorizer

    def describe(self, *, principal: str, users: Sequence[str] | None) -> list[UserCredentials]:
        """One result per user (request order; every user with a credential when ``users`` is
        empty). Raises ClusterAuthorizationFailed without DESCRIBE on the CLUSTER."""
        self._authorizer.require_cluster(principal=principal, operation=AclOperation.DESCRIBE)
        if not users:
            return [UserCredentials(user, None, _shown(infos)) for user, infos in self._store.describe().items()]
        counts: dict[str, int] = {}
        for user in users:
            counts[user] = counts.get(user, 0) + 1
        found = self._store.describe(list(counts))
        results = []
        for user in counts:
            if counts[user] > 1:
                results.append(UserCredentials(user, DuplicateResource(f"user {user!r} is named more than once")))
            elif user not in found:
                results.append(UserCredentials(user, ResourceNotFound(
                    f"attempt to describe a user credential that does not exist: {user!r}")))
            else:
                results.append(UserCredentials(user, None, _shown(found[user])))
        return results

    def alter(self, *, principal: str, deletions: Sequence[Deletion],
              upsertions: Sequence[Upsertion]) -> list[tuple[str, LowtideError | None]]:
        """(user, error or None) per user, in the order users first appear (deletions first)."""
        users = list(dict.fromkeys([d.user for d in deletions] + [u.user for u in upsertions]))
        try:
            self._authorizer.require_cluster(principal=principal, operation=AclOperation.ALTER)
        except LowtideError as err:
            return [(user, err) for user in users]
        errors: dict[str, LowtideError] = {}
        seen: set[tuple[str, int]] = set()
        puts: list[tuple[str, Mechanism, ScramCredential]] = []
        deletes: list[tuple[str, Mechanism]] = []
        for item in [*deletions, *upsertions]:
            key = (item.user, int(item.mechanism))
            try:
                if key in seen:
                    raise DuplicateResource(f"a credential of {item.user!r} is altered twice in one request")
                seen.add(key)
                mechanism = mechanism_by_code(item.mechanism)
                if mechanism is None:
                    raise UnsupportedSaslMechanism(f"unknown SCRAM mechanism {int(item.mechanism)}")
                if isinstance(item, Deletion):
                    deletes.append((item.user, mechanism))
                else:
                    check_user_name(item.user)
                    check_credential_input(mechanism, salt=item.salt, iterations=item.iterations,
                                           salted_password=item.salted_password)
                    puts.append((item.user, mechanism, ScramCredential.from_salted_password(
                        mechanism, item.salted_password, item.salt, item.iterations)))
            except LowtideError as err:
                errors.setdefault(item.user, err)
        if deletes:
            existing = self._store.describe(list({user for user, _ in deletes}))
            for user, mechanism in deletes:
                if user not in errors and all(i.mechanism != mechanism for i in existing.get(user, ())):
                    errors[user] = ResourceNotFound(
                        f"attempt to delete a user credential that does not exist: {user!r} {mechanism.name}")
        self._store.apply(puts=[(m, user, c) for user, m, c in puts if user not in errors],
                          deletes=[(m, user) for user, m in deletes if user not in errors])
        return [(user, errors.get(user)) for user in users]
