"""What a local cluster consists of: counts of each service kind and the flags they share.

``ClusterConfig`` is plain data; ``LocalCluster`` turns it into processes. Counts for kinds whose
service module is not built yet default to 0, so the same code runs before and after they land.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowtide.auth.identity import ADMIN_PRINCIPAL

COORDINATOR_MODULE = "lowtide.coordinator.server"
SCANNER_MODULE = "lowtide.scanner.server"
SECRETS_DIR = "secrets"
TLS_DIR = "tls"


def is_module_available(module: str) -> bool:
    """True when ``module`` can be imported (its package exists), without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package itself is missing
        return False


def default_coordinators() -> int:
    # Two DC shards once the coordinator exists (issue 13): diskless topics need at least one, and
    # two exercise sharding and file handover between owners.
    return 2 if is_module_available(COORDINATOR_MODULE) else 0


def default_orphan_scanners() -> int:
    return 1 if is_module_available(SCANNER_MODULE) else 0


def parse_config_pairs(pairs: Iterable[str] | None) -> dict[str, str]:
    """Parse ``["k=v", ...]`` (the CLI's repeated ``--config``) into a dict; later keys win.

    Values may contain ``=``; keys are stripped and must be non-empty.
    """
    result: dict[str, str] = {}
    for raw in pairs or ():
        key, sep, value = raw.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"invalid --config {raw!r}: expected key=value")
        result[key] = value.strip()
    return result


@dataclass
class ClusterConfig:
    """The shape of one local cluster in ``data_dir``.

    Contract: ``validate()`` raises ``ValueError`` for impossible shapes; everything else is passed
    to the services as flags (``replica_config`` entries become replica ``--config k=v`` broker
    defaults; ``extra_env`` is added to every child's environment). With ``auth_enabled`` every
    service gets its own token file under ``DIR/secrets`` and, when no ``tokens_file`` is given, an
    admin identity (``User:admin``, a super user) is generated for the CLI. Not thread-safe: build
    it, then hand it to ``LocalCluster`` and do not mutate it afterwards.
    """

    data_dir: Path
    replicas: int = 3
    # etcd members of the cluster metadata store (1, or 3 to survive a member's loss).
    metadata_members: int = 1
    coordinators: int = field(default_factory=default_coordinators)
    frontdoors: int = 1
    orphan_scanners: int = field(default_factory=default_orphan_scanners)
    replica_config: dict[str, str] = field(default_factory=dict)
    auth_enabled: bool = False
    tokens_file: Path | None = None
    super_users: str = ""
    session_timeout_ms: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    health_timeout_s: float = 60.0
    # A real Prometheus scraping every service, with lowtide's alert rules loaded (issue 16).
    with_prometheus: bool = False
    prometheus_scrape_interval: str = "2s"
    prometheus_rule_for: str | None = None  # replaces every rule's `for:` (tests use a short one)
    # Where diskless topics' WAL files go: None = DIR/objects (file://), else e.g.
    # s3://bucket/prefix?endpoint=http://127.0.0.1:9000 (the bucket must exist).
    object_store: str | None = None
    # TLS on every gRPC port (docs/design/tls.md): a CA and a certificate per service under DIR/tls,
    # made by ``up``; "required" client auth makes calls between services mutual TLS.
    tls: bool = False
    tls_client_auth: str = "required"
    # Each coordinator process also the warm standby of every other shard (docs/design/diskless.md
    # #warm-standby), with a 1.5 s lease so a killed shard is taken over within 2 s. Off by default:
    # no process is added, but each standby follows another shard's log (and each shard then may be
    # led from another process's port after a failure).
    coordinator_standbys: bool = False

    def __post_init__(self) -> None:
        # Children run with cwd=data_dir and the path lands in cluster.json: make it absolute.
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        if self.tokens_file is not None:
            self.tokens_file = Path(self.tokens_file).expanduser().resolve()

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.metadata_members not in (1, 3, 5):
            raise ValueError(f"metadata_members must be 1, 3 or 5 (an etcd quorum), got {self.metadata_members}")
        if self.frontdoors < 1:
            raise ValueError(f"frontdoors must be >= 1 (the bootstrap address), got {self.frontdoors}")
        for name in ("coordinators", "orphan_scanners"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.session_timeout_ms is not None and self.session_timeout_ms <= 0:
            raise ValueError(f"session_timeout_ms must be > 0, got {self.session_timeout_ms}")
        if self.health_timeout_s <= 0:
            raise ValueError(f"health_timeout_s must be > 0, got {self.health_timeout_s}")
        if self.tokens_file is not None and not self.tokens_file.is_file():
            raise ValueError(f"tokens file {self.tokens_file} does not exist")
        if self.tls_client_auth not in ("none", "required"):
            raise ValueError(f"tls_client_auth must be none or required, got {self.tls_client_auth!r}")

    @property
    def object_store_url(self) -> str:
        return self.object_store or (self.data_dir / "objects").as_uri()

    @property
    def secrets_dir(self) -> Path:
        return self.data_dir / SECRETS_DIR

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / TLS_DIR

    @property
    def mutual_tls(self) -> bool:
        """Services identify each other by certificate (and need no tokens of their own)."""
        return self.tls and self.tls_client_auth == "required"

    def token_file(self, service_name: str) -> Path:
        """Where the token of service ``service_name`` (e.g. ``replica-0``) lives (mode 0600)."""
        return self.secrets_dir / f"{service_name}.token"

    @property
    def generates_admin(self) -> bool:
        """Whether ``up`` makes an admin identity: auth on and no tokens file of the user's own."""
        return self.auth_enabled and self.tokens_file is None

    @property
    def effective_super_users(self) -> str:
        """The ``--super-users`` the services get: the user's, plus the generated admin."""
        users = [u.strip() for u in self.super_users.split(",") if u.strip()]
        if self.generates_admin and ADMIN_PRINCIPAL not in users:
            users.append(ADMIN_PRINCIPAL)
        return ",".join(users)

    def to_json(self) -> dict[str, Any]:
        """The settings a later ``LocalCluster.load`` needs to restart services the same way."""
        return {
            "replicas": self.replicas, "coordinators": self.coordinators, "frontdoors": self.frontdoors,
            "orphan_scanners": self.orphan_scanners, "replica_config": dict(self.replica_config),
            "auth_enabled": self.auth_enabled,
            "tokens_file": str(self.tokens_file) if self.tokens_file else None,
            "super_users": self.super_users, "session_timeout_ms": self.session_timeout_ms,
            "extra_env": dict(self.extra_env), "with_prometheus": self.with_prometheus,
            "prometheus_scrape_interval": self.prometheus_scrape_interval,
            "prometheus_rule_for": self.prometheus_rule_for, "object_store": self.object_store,
            "tls": self.tls, "tls_client_auth": self.tls_client_auth,
            "coordinator_standbys": self.coordinator_standbys,
        }

    @classmethod
    def from_json(cls, data_dir: Path, doc: Mapping[str, Any]) -> ClusterConfig:
        known = {k: doc[k] for k in cls.__dataclass_fields__ if k in doc and k != "data_dir"}
        return cls(data_dir=data_dir, **known)
