"""``DIR/cluster.json``: the record of a local cluster (docs/operations.md#clusterjson), read by
clients and by ``down``.

Fields clients rely on: ``bootstrap``, ``redis``, ``object_store`` and ``services`` (each with
``name``, ``kind``, ``grpc``, ``metrics``, ``pid``, ``data_dir``; ``metrics`` is an https URL on a
``--tls`` cluster, and there ``kafka_bootstrap`` is the front door's SSL listener, no Kafka listener
being plaintext). The extra fields (``argv``,
``log``, ``state``, ``config``) let another process stop or restart the same services later.
``auth`` (only with auth on) names the secret files: each service's token file and principal and,
when generated, the admin token and its ready ``--command-config`` file.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CLUSTER_FILE = "cluster.json"
REDIS_KIND = "redis"
ETCD_KIND = "etcd"


@dataclass
class ServiceEntry:
    """One process of the cluster. ``argv`` and the addresses are fixed at first start so a restart
    (``start_service`` or a re-``up``) brings back the same service on the same ports and data."""

    name: str
    kind: str
    grpc: str
    metrics_addr: str
    data_dir: str
    argv: list[str]
    log: str
    pid: int = 0
    index: int = 0
    kafka: str = ""  # HOST:PORT of its Kafka protocol listener (with TLS its SSL one), "" = none
    # With TLS: its Kafka listeners, by name ("SSL", "SASL_SSL") -> HOST:PORT; none is plaintext.
    kafka_listeners: dict[str, str] = field(default_factory=dict)
    # /metrics over HTTPS (``--metrics-tls``, a ``--tls`` cluster): its URL says https.
    metrics_tls: bool = False

    @property
    def metrics_url(self) -> str:
        scheme = "https" if self.metrics_tls else "http"
        return f"{scheme}://{self.metrics_addr}/metrics" if self.metrics_addr else ""

    @property
    def is_redis(self) -> bool:
        return self.kind == REDIS_KIND

    @property
    def is_etcd(self) -> bool:
        return self.kind == ETCD_KIND

    @property
    def is_store(self) -> bool:
        """redis-server or an etcd member: started by the supervisor itself, not a lowtide server."""
        return self.kind in (REDIS_KIND, ETCD_KIND)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "grpc": self.grpc, "metrics": self.metrics_url,
                "pid": self.pid, "data_dir": self.data_dir, "index": self.index, "log": self.log,
                "argv": list(self.argv), **({"kafka": self.kafka} if self.kafka else {}),
                **({"kafka_listeners": dict(self.kafka_listeners)} if self.kafka_listeners else {})}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ServiceEntry:
        metrics = doc.get("metrics") or ""
        metrics_addr = metrics.removeprefix("https://").removeprefix("http://").removesuffix("/metrics")
        return cls(name=doc["name"], kind=doc["kind"], grpc=doc.get("grpc") or "", metrics_addr=metrics_addr,
                   metrics_tls=metrics.startswith("https://"),
                   data_dir=doc.get("data_dir") or "", argv=list(doc.get("argv") or []),
                   log=doc.get("log") or "", pid=int(doc.get("pid") or 0), index=int(doc.get("index") or 0),
                   kafka=doc.get("kafka") or "", kafka_listeners=dict(doc.get("kafka_listeners") or {}))


@dataclass
class ClusterState:
    """In-memory form of cluster.json; ``services`` is in start order (Redis first)."""

    data_dir: Path
    bootstrap: str
    redis: str
    object_store: str
    services: list[ServiceEntry] = field(default_factory=list)
    state: str = "running"  # "running" | "stopped": what the last up/down left behind
    config: dict[str, Any] = field(default_factory=dict)
    auth: dict[str, Any] = field(default_factory=dict)
    # With --with-prometheus: {"url", "pid", "dir"} of the cluster's Prometheus.
    prometheus: dict[str, Any] = field(default_factory=dict)
    # The front door's Kafka protocol listener: what Kafka clients take as bootstrap.servers
    # (with TLS, the SSL listener: the same address as kafka_bootstrap_ssl).
    kafka_bootstrap: str = ""
    # With TLS: the front door's SSL listener, and (with auth) its SASL_SSL one.
    kafka_bootstrap_ssl: str = ""
    kafka_bootstrap_sasl_ssl: str = ""
    # With TLS: {"ca", "dir", "client_auth", "client_cert", "client_key", "command_config"}.
    tls: dict[str, Any] = field(default_factory=dict)
    # The cluster metadata store: etcd://HOST:PORT[,HOST:PORT...] (its members are "etcd" services);
    # etcds://... on a --tls cluster (mutual TLS only).
    metadata: str = ""

    def to_json(self) -> dict[str, Any]:
        doc = {"bootstrap": self.bootstrap, "redis": self.redis, "metadata": self.metadata,
               "object_store": self.object_store,
               "services": [s.to_json() for s in self.services], "state": self.state,
               "data_dir": str(self.data_dir), "logs_dir": str(self.data_dir / "logs"), "config": self.config}
        if self.kafka_bootstrap:
            doc["kafka_bootstrap"] = self.kafka_bootstrap
        if self.kafka_bootstrap_ssl:
            doc["kafka_bootstrap_ssl"] = self.kafka_bootstrap_ssl
        if self.kafka_bootstrap_sasl_ssl:
            doc["kafka_bootstrap_sasl_ssl"] = self.kafka_bootstrap_sasl_ssl
        if self.auth:
            doc["auth"] = self.auth
        if self.tls:
            doc["tls"] = self.tls
        if self.prometheus:
            doc["prometheus"] = self.prometheus["url"]
            doc["prometheus_process"] = self.prometheus
        return doc

    @classmethod
    def from_json(cls, data_dir: Path, doc: dict[str, Any]) -> ClusterState:
        return cls(data_dir=data_dir, bootstrap=doc.get("bootstrap", ""), redis=doc.get("redis", ""),
                   object_store=doc.get("object_store", ""),
                   services=[ServiceEntry.from_json(s) for s in doc.get("services", [])],
                   state=doc.get("state", "running"), config=dict(doc.get("config") or {}),
                   auth=dict(doc.get("auth") or {}), prometheus=dict(doc.get("prometheus_process") or {}),
                   kafka_bootstrap=doc.get("kafka_bootstrap", ""), tls=dict(doc.get("tls") or {}),
                   kafka_bootstrap_ssl=doc.get("kafka_bootstrap_ssl", ""),
                   kafka_bootstrap_sasl_ssl=doc.get("kafka_bootstrap_sasl_ssl", ""),
                   metadata=doc.get("metadata", ""))

    def find(self, name: str) -> ServiceEntry | None:
        return next((s for s in self.services if s.name == name), None)


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write ``doc`` so readers see the old file or the new one, never a torn one, even on a crash:
    write a temporary sibling, fsync it, rename over ``path``, fsync the directory."""
    # A per-writer temporary name: a foreground supervisor and a `down` may write concurrently.
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    data = (json.dumps(doc, indent=2) + "\n").encode()
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_state(data_dir: Path) -> ClusterState | None:
    """The cluster recorded in ``data_dir``, or None when there is none."""
    path = data_dir / CLUSTER_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return ClusterState.from_json(data_dir, doc)


def write_state(state: ClusterState) -> None:
    write_json_atomic(state.data_dir / CLUSTER_FILE, state.to_json())
