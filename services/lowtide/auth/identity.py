"""Service identities: the principals brokers and other lowtide services authenticate as, their
secret token files, and provisioning them into the cluster metadata (etcd).

With auth on, every call on every port carries an identity (docs/design/invariants.md, rule 7): a broker calls
other brokers as ``User:broker-<id>`` (a follower's ``replica_id`` must match it), the front door
calls leaders as ``User:frontdoor``. Each identity is one random token in a file readable only by
its owner; the metadata store keeps only the token's SHA-256 digest (``tokens.add_token``), and
the identity gets CLUSTER_ACTION on the CLUSTER resource through the ACL store, so it is an
ordinary principal an operator can list and revoke (``lowtide acls list --cluster``), not a super
user.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lowtide.auth.acl import (
    CLUSTER_RESOURCE_NAME,
    AclBinding,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
    parse_principal,
)
from lowtide.auth.client_config import TOKEN_KEY, bearer_metadata
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import add_token
from lowtide.errors import InvalidConfig
from lowtide.metadata.store import MetadataStore

BROKER_PRINCIPAL_PREFIX = "User:broker-"
FRONTDOOR_PRINCIPAL = "User:frontdoor"
ADMIN_PRINCIPAL = "User:admin"
# 32 random bytes, url-safe base64: no whitespace, so it fits a tokens file line and a header.
TOKEN_BYTES = 32


SERVICE_PRINCIPALS = frozenset({FRONTDOOR_PRINCIPAL, "User:coordinator", "User:orphan-scanner"})


def is_service_principal(principal: str) -> bool:
    """The identities of lowtide's own services (brokers, front door, coordinator, scanner): with
    mutual TLS on they authenticate only with their certificates."""
    return principal.startswith(BROKER_PRINCIPAL_PREFIX) or principal in SERVICE_PRINCIPALS


def broker_principal(broker_id: int) -> str:
    """The principal broker ``broker_id`` authenticates as (and the only one whose follower fetch
    may say ``replica_id = broker_id``)."""
    return f"{BROKER_PRINCIPAL_PREFIX}{broker_id}"


def generate_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def write_secret_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), never briefly wider: the file
    is created with that mode and re-chmodded in case it already existed with another."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_token_file(path: str | Path) -> str:
    """The token in ``path`` (one line; surrounding whitespace ignored); InvalidConfig naming the
    path when it is missing, unreadable or empty."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfig(f"cannot read token file {str(path)!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not token or any(c.isspace() for c in token):
        raise InvalidConfig(f"token file {str(path)!r} must hold exactly one token (no spaces)")
    return token


def token_file_metadata(path: str | Path | None) -> list[tuple[str, str]]:
    """Call metadata for the token in ``path`` (``[]`` when no path is configured)."""
    return bearer_metadata(read_token_file(path)) if path else []


def cluster_action_binding(principal: str) -> AclBinding:
    return AclBinding(principal=principal, resource_type=ResourceType.CLUSTER, resource_name=CLUSTER_RESOURCE_NAME,
                      pattern_type=PatternType.LITERAL, operation=AclOperation.CLUSTER_ACTION,
                      permission=AclPermission.ALLOW)


@dataclass(frozen=True, slots=True)
class ServiceIdentity:
    """One identity to provision: ``principal`` authenticates with the token kept in ``token_file``."""

    principal: str
    token_file: Path

    def __post_init__(self) -> None:
        parse_principal(self.principal)


def ensure_token_file(path: Path) -> str:
    """The token in ``path``, generating and writing one (0600) when the file does not exist yet:
    a restarted cluster keeps its identities."""
    if path.exists():
        return read_token_file(path)
    token = generate_token()
    write_secret_file(path, token + "\n")
    return token


def provision_identities(metadata: MetadataStore, identities: Iterable[ServiceIdentity], *,
                         cluster_action: bool = True) -> None:
    """Make each identity's token (generated when its file is missing) authenticate as its
    principal, and with ``cluster_action`` grant it CLUSTER_ACTION on the CLUSTER. Idempotent;
    MetadataStoreUnavailable when etcd does not answer."""
    identities = list(identities)
    for identity in identities:
        add_token(metadata, token=ensure_token_file(identity.token_file), principal=identity.principal)
    if cluster_action and identities:
        AclStore(metadata=metadata).add([cluster_action_binding(i.principal) for i in identities])


def write_command_config(path: Path, token: str) -> None:
    """A ``--command-config`` properties file presenting ``token`` (auth/client_config.py format)."""
    write_secret_file(path, f"# lowtide client settings; keep this file secret\n{TOKEN_KEY}={token}\n")
