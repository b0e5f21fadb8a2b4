"""Configuration of a replica server (flags and LOWTIDE_* environment variables)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lowtide.replica.parking import FetchLimits


@dataclass(frozen=True)
class ReplicaConfig:
    broker_id: int
    data_dir: Path
    advertised_host: str = "127.0.0.1"
    grpc_port: int = 9092
    # The Kafka protocol listener's port on advertised_host (lowtide.kafka); 0 = none.
    kafka_port: int = 0
    # Every Kafka listener by name -> its advertised "host:port" (Kafka's advertised.listeners).
    kafka_listeners: dict[str, str] = field(default_factory=dict)
    metrics_url: str = ""
    rack: str = ""
    # Liveness: a broker is live while its session lease in etcd lives (renewed every heartbeat).
    session_timeout_ms: int = 6000
    # Stray partitions (set aside, never served) are removed after this long; -1 = kept until the
    # operator removes them (`lowtide strays remove`), the default.
    stray_retention_ms: int = -1
    # Threads that open (and, at shutdown, close) partition logs, as Kafka's
    # num.recovery.threads.per.data.dir: an open is mostly fsyncs, which run in parallel.
    log_open_threads: int = 8
    heartbeat_interval_ms: int = 1000
    # ISR: a follower that has not caught up for this long leaves the ISR (Kafka's default is 30 s).
    replica_lag_time_max_ms: int = 10000
    # How long a follower's fetch parks at the leader when there is nothing new.
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 8 * 1024 * 1024
    # "socket": one connection per follower-leader pair to the leader's replication listener
    # (the Replicate stream where a leader advertises none); "stream": one Replicate stream per
    # pair; "fetch": a unary Fetch per round (docs/design/kip-107-delete-records.md#replication-and-the-low-watermark).
    replication_transport: str = "socket"
    # KIP-227 incremental fetch sessions: a follower round lists and gets only what changed
    # (replica/fetch_session.py); off = every round lists every followed partition.
    replica_fetch_sessions: bool = True
    # This broker's replication listener port (lowtide.rpc.framed.listener); 0 = none.
    replication_port: int = 0
    # How long a woken follower fetch may wait for Produce requests about to append (requests.py).
    replication_linger_ms: int = 5
    # HW/LSO checkpoint period; LSO is also checkpointed on every change (see manager).
    checkpoint_interval_ms: int = 5000
    retention_check_interval_ms: int = 5000
    # KIP-854: how often idle producers are forgotten (producer.id.expiration.ms, a LogConfig key
    # set with --config, says after how long). Kafka's default: 10 minutes.
    producer_id_expiration_check_interval_ms: int = 600000
    # A segment unused this long gives its file descriptor back (log/segment.py; 0 = never): a
    # replica of many idle partitions holds no descriptor for them (issue 48).
    segment_file_idle_ms: int = 30000
    min_insync_replicas: int = 1
    # Server-side bounds on consumer fetches (replica/parking.py).
    fetch_limits: FetchLimits = field(default_factory=FetchLimits)
    # Broker-level defaults of topic configs (segment.bytes, retention.ms, ...).
    log_defaults: dict[str, str] = field(default_factory=dict)
    # Authentication and ACLs on this replica's port (auth/access.py); off = everything allowed.
    auth_enabled: bool = False
    tokens_file: Path | None = None
    super_users: frozenset[str] = frozenset()
    # This broker's own identity (User:broker-<id>) for its calls to other brokers; with auth on
    # a follower without it cannot replicate, so the server refuses to start without it.
    token_file: Path | None = None
