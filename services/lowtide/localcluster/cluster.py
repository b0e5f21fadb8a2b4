"""``LocalCluster``: start, inspect, stop and disturb a complete lowtide cluster of real processes.

Layout of ``DIR`` (the cluster's data directory)::

    cluster.json          the record of the cluster (docs/operations.md#clusterjson), rewritten atomically
    cluster.lock          flock held while ``up`` starts processes (two ``up`` never interleave)
    cluster.pid           pid of a foreground ``cluster up`` supervisor (absent when detached)
    secrets/              with auth on (mode 0700): NAME.token per service, admin.token and
                          admin.properties (a ready --command-config) unless the user gave a
                          tokens file; every file 0600, reused by later ``up``s
    logs/NAME.log         stdout+stderr of each service (appended across restarts)
    redis/                redis-server data (AOF) and its log; logs/redis.log links to it
    etcd/etcd-N/          etcd member N's data (the cluster metadata); its log is logs/etcd-N.log
    tls/                  with --tls (mode 0700): the CA (ca.crt, ca.key), NAME/tls.crt|tls.key|ca.crt
                          per service and per store (redis, etcd-N), admin/ and client.properties
    replica-N/            replica N's data directory, reused by every later ``up``
    coordinator-K/        DC shard K's local state
    objects/              the local object store (``file://`` URL)
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lowtide.auth.identity import (
    ADMIN_PRINCIPAL,
    ServiceIdentity,
    provision_identities,
    read_token_file,
    write_command_config,
)
from lowtide.common.procs import etcd_member_argv, find_free_port, start_redis
from lowtide.localcluster import control, forkserver
from lowtide.localcluster.config import ClusterConfig
from lowtide.localcluster.kinds import KINDS, InstanceContext, ServiceKind, supported_flags
from lowtide.localcluster.state import ETCD_KIND, REDIS_KIND, ClusterState, ServiceEntry, read_state, write_state
from lowtide.metadata.store import MetadataStore
from lowtide.metadata.store import metadata_url as store_metadata_url
from lowtide.observability.prometheus import ScrapeTarget, start_prometheus
from lowtide.observability.prometheus import write_config as write_prometheus_config
from lowtide.tls.certs import CertFiles, CertificateAuthority
from lowtide.tls.config import ClientTls

Progress = Callable[[str], None]

LOCK_FILE = "cluster.lock"
SUPERVISOR_PID_FILE = "cluster.pid"
LOG_TAIL_LINES = 40
# With --tls and --with-prometheus: DIR/tls/prometheus/, Prometheus' client certificate.
PROMETHEUS_CERT = "prometheus"


class ClusterError(RuntimeError):
    """A local-cluster operation failed; ``code`` is a Kafka-style name for the CLI's error output."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _ignore_progress(_message: str) -> None:
    pass


def is_port_free(port: int) -> bool:
    # SO_REUSEADDR like the services' own listeners, so TIME_WAIT leftovers of a previous run
    # do not make a port look taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalCluster:
    """A local cluster in ``config.data_dir``: redis-server, replicas, frontdoor(s) and the other
    kinds of ``kinds`` whose service module exists, each a separate process.

    Contract:
      * ``up`` starts redis first, then each kind in ``kinds`` order, waits until each answers
        ``grpc.health.v1.Health/Check`` with SERVING, writes ``DIR/cluster.json`` and returns its
        content. It refuses when the directory already has a running cluster, and on failure stops
        what it started and raises ``ClusterError`` carrying the failing service's log tail.
      * Restarts (``start_service``, and ``up`` on a directory after ``down``) reuse each service's
        argv, ports, replica id and data directory, so on-disk state (segments, LSO checkpoints)
        and Redis metadata (AOF) survive.
      * ``down`` is idempotent and works from any process: it only needs cluster.json.
      * Processes run in their own session: they outlive a detached CLI, and Ctrl-C on the CLI does
        not hit them all at once, so the supervisor can stop them in reverse start order.

    Thread-safety: every public method takes one re-entrant lock, so tests may call ``kill`` or
    ``status`` from several threads; calls are serialized.
    """

    def __init__(self, config: ClusterConfig, *, kinds: Sequence[ServiceKind] = KINDS) -> None:
        self.config = config
        self._kinds = tuple(kinds)
        self._kind_by_name = {k.kind: k for k in self._kinds}
        self._lock = threading.RLock()
        self._state: ClusterState | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._metadata: MetadataStore | None = None

    # ----------------------------------------------------------------------------------- lookup

    @classmethod
    def load(cls, data_dir: Path | str, *, kinds: Sequence[ServiceKind] = KINDS) -> LocalCluster:
        """The cluster recorded in ``data_dir/cluster.json`` (running or stopped)."""
        data_dir = Path(data_dir).expanduser().resolve()
        state = read_state(data_dir)
        if state is None:
            raise ClusterError("CLUSTER_NOT_FOUND", f"no cluster in {data_dir} (no cluster.json)")
        cluster = cls(ClusterConfig.from_json(data_dir, state.config), kinds=kinds)
        cluster._state = state
        return cluster

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def state(self) -> ClusterState:
        with self._lock:
            if self._state is None:
                raise ClusterError("CLUSTER_NOT_FOUND", f"no cluster has been started in {self.data_dir}")
            return self._state

    @property
    def bootstrap(self) -> str:
        return self.state.bootstrap

    @property
    def kafka_bootstrap(self) -> str:
        """The front door's Kafka protocol listener (Kafka clients' bootstrap.servers): with TLS on,
        its SSL listener (there is no plaintext one)."""
        return self.state.kafka_bootstrap

    def kafka_bootstrap_for(self, protocol: str) -> str:
        """The front door's Kafka listener of ``protocol``: PLAINTEXT (SASL_PLAINTEXT with auth)
        without TLS, SSL and (with auth) SASL_SSL with TLS on; "" when the cluster has none."""
        protocol = protocol.upper()
        state = self.state
        if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
            return "" if state.tls else state.kafka_bootstrap
        return {"SSL": state.kafka_bootstrap_ssl, "SASL_SSL": state.kafka_bootstrap_sasl_ssl}.get(protocol, "")

    @property
    def redis_url(self) -> str:
        return self.state.redis

    @property
    def metadata_url(self) -> str:
        """The cluster metadata store (etcd://HOST:PORT,..., with TLS etcds://...), as every service
        is given it (a service dials an etcds:// URL with its own certificate)."""
        return self.state.metadata

    def metadata_store(self) -> MetadataStore:
        """One MetadataStore on this cluster's etcd for the calling process (tools, tests): opened
        on first use, shared, closed by ``down()``; with TLS it dials as the admin (``client_tls``).
        A store follows etcd with a watch (threads and a copy of every key), so a process looking
        often shares one rather than opening one per look."""
        with self._lock:
            if self._metadata is None:
                self._metadata = MetadataStore.from_url(self.metadata_url, tls=self.client_tls)
            return self._metadata

    @property
    def object_store_url(self) -> str:
        return self.state.object_store

    def services(self, kind: str | None = None) -> list[ServiceEntry]:
        return [s for s in self.state.services if kind is None or s.kind == kind]

    def service(self, name: str) -> ServiceEntry:
        entry = self.state.find(name)
        if entry is None:
            known = ", ".join(s.name for s in self.state.services)
            raise ClusterError("UNKNOWN_SERVICE", f"no service {name!r} in this cluster (have: {known})")
        return entry

    def is_running(self, name: str) -> bool:
        entry = self.service(name)
        return control.is_service_running(entry.pid, entry.grpc)

    def to_json(self) -> dict[str, Any]:
        return self.state.to_json()

    # ------------------------------------------------------------------------------- lifecycle

    def up(self, *, detach: bool = True, progress: Progress | None = None) -> dict[str, Any]:
        """Start every service, wait until all are healthy, write cluster.json; returns its content.

        ``detach=False`` records this process in ``cluster.pid`` as the foreground supervisor, so a
        ``down`` from elsewhere stops it too; the caller then blocks and calls ``down`` itself.
        """
        say = progress or _ignore_progress
        self.config.validate()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        with self._lock, self._startup_lock():
            previous = read_state(self.data_dir)
            if previous is not None:
                running = [s.name for s in previous.services if control.is_service_running(s.pid, s.grpc)]
                if running:
                    raise ClusterError(
                        "CLUSTER_ALREADY_RUNNING",
                        f"{self.data_dir} already has a running cluster ({', '.join(running)}); "
                        f"stop it first with: lowtide cluster down --data-dir {self.data_dir}")
            self._state = self.plan(previous=previous, progress=say)
            started: list[ServiceEntry] = []
            try:
                if self.config.tls:  # before Redis: it serves TLS with the cluster's certificate too
                    self._state.tls = self._provision_tls(say)
                self._start_redis(self._state.services[0], say)
                started.append(self._state.services[0])
                write_state(self._state)  # a crash from here on still leaves `down` something to stop
                members = [e for e in self._state.services if e.is_etcd]
                say(f"starting etcd ({len(members)} member{'s' if len(members) > 1 else ''})...")
                for entry in members:
                    self._spawn(entry)
                    started.append(entry)
                write_state(self._state)
                self._wait_healthy(members, timeout_s=self.config.health_timeout_s, progress=say)
                if self.config.auth_enabled:
                    self._state.auth = self._provision_auth(say)
                    write_state(self._state)
                # Kinds marked ``start_with_previous`` start alongside the kind before them and
                # are waited for together (coordinators need the replicas, not the front door).
                groups: list[set[str]] = []
                for kind in self._kinds:
                    if groups and kind.start_with_previous:
                        groups[-1].add(kind.kind)
                    else:
                        groups.append({kind.kind})
                for names in groups:
                    batch = [s for s in self._state.services if s.kind in names]
                    if not batch:
                        continue
                    for entry in batch:
                        say(f"starting {entry.name} (grpc {entry.grpc})...")
                        self._spawn(entry)
                        started.append(entry)
                    write_state(self._state)
                    self._wait_healthy(batch, timeout_s=self.config.health_timeout_s, progress=say)
            except BaseException:
                say("start failed; stopping what was started...")
                self._stop_prometheus(self._state, timeout_s=10.0, progress=say)
                self._stop_entries(started, timeout_s=10.0, progress=say)
                self._state.state = "stopped"
                write_state(self._state)
                raise
            if self.config.with_prometheus:
                self._start_prometheus(previous, say)
            self._state.state = "running"
            write_state(self._state)
            if not detach:
                (self.data_dir / SUPERVISOR_PID_FILE).write_text(f"{os.getpid()}\n")
            return self._state.to_json()

    def down(self, *, timeout_s: float = 15.0, progress: Progress | None = None) -> dict[str, Any]:
        """Stop every service (reverse start order; redis last): SIGTERM, then SIGKILL after
        ``timeout_s``. Idempotent: services already gone are reported as ``"not running"``."""
        say = progress or _ignore_progress
        with self._lock:
            state = self._state or read_state(self.data_dir)
            if state is None:
                return {"data_dir": str(self.data_dir), "services": [], "message": "no cluster here"}
            self._state = state
            if self._metadata is not None:  # before etcd stops: its watch would retry meanwhile
                self._metadata.close()
                self._metadata = None
            self._stop_foreground_supervisor(timeout_s=timeout_s, progress=say)
            results = self._stop_prometheus(state, timeout_s=timeout_s, progress=say)
            results += self._stop_entries(state.services, timeout_s=timeout_s, progress=say)
            state.state = "stopped"
            write_state(state)
            (self.data_dir / SUPERVISOR_PID_FILE).unlink(missing_ok=True)
            return {"data_dir": str(self.data_dir), "services": results}

    def status(self) -> dict[str, Any]:
        """Each service's pid liveness and health; ``healthy`` is True only if all are SERVING."""
        with self._lock:
            state = self._state or read_state(self.data_dir)
            if state is None:
                raise ClusterError("CLUSTER_NOT_FOUND", f"no cluster in {self.data_dir} (no cluster.json)")
            rows = []
            for entry in state.services:
                alive = control.is_service_running(entry.pid, entry.grpc)
                rows.append({"name": entry.name, "kind": entry.kind, "grpc": entry.grpc, "pid": entry.pid,
                             "alive": alive, "health": self._check_health(entry) if alive else control.STOPPED,
                             "metrics": entry.metrics_url, "log": entry.log})
            healthy = bool(rows) and all(r["alive"] and r["health"] == control.SERVING for r in rows)
            report = {"data_dir": str(self.data_dir), "state": state.state, "bootstrap": state.bootstrap,
                      "healthy": healthy, "services": rows}
            if state.prometheus:
                report["prometheus"] = {"url": state.prometheus["url"], "pid": state.prometheus["pid"],
                                        "alive": control.is_pid_alive(int(state.prometheus["pid"]))}
            return report

    # ------------------------------------------------------------------ single-process control

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one service; for SIGKILL, return once the process is gone."""
        with self._lock:
            entry = self.service(name)
            if not control.is_service_running(entry.pid, entry.grpc):
                raise ClusterError("SERVICE_NOT_RUNNING", f"{name} is not running")
            control.send_signal(entry.pid, sig)
            if sig == signal.SIGKILL:
                control.wait_for_exit(entry.pid, timeout_s=10.0, proc=self._procs.get(name))

    def stop_service(self, name: str, *, timeout_s: float = 15.0) -> str:
        """SIGTERM one service and wait (SIGKILL after ``timeout_s``); returns the outcome."""
        with self._lock:
            entry = self.service(name)
            return control.terminate(entry.pid, address=entry.grpc, timeout_s=timeout_s,
                                     proc=self._procs.get(name))

    def start_service(self, name: str, *, timeout_s: float | None = None) -> ServiceEntry:
        """Start a stopped service again with the same argv, ports and data directory, wait until it
        is healthy, and record its new pid in cluster.json."""
        with self._lock:
            entry = self.service(name)
            if control.is_service_running(entry.pid, entry.grpc):
                raise ClusterError("SERVICE_ALREADY_RUNNING", f"{name} is already running (pid {entry.pid})")
            if entry.is_redis:
                self._start_redis(entry, _ignore_progress)
            else:
                self._spawn(entry)  # an etcd member too: same argv, ports and data directory
                write_state(self.state)
                self._wait_healthy([entry], timeout_s=timeout_s or self.config.health_timeout_s,
                                   progress=_ignore_progress)
                if entry.kind == ETCD_KIND and self._metadata is not None:
                    # Its data may be a backup restored meanwhile: this process's store loads again.
                    self._metadata.image.reload()
            write_state(self.state)
            return entry

    def pause(self, name: str) -> None:
        """SIGSTOP: the process stays alive but answers nothing (a hung broker); returns once
        every thread of it is stopped."""
        self._signal_running(name, signal.SIGSTOP)
        control.wait_until_stopped(self.service(name).pid)

    def resume(self, name: str) -> None:
        self._signal_running(name, signal.SIGCONT)

    def wait_until_healthy(self, names: Sequence[str] | None = None, *, timeout_s: float = 60.0) -> None:
        """Block until the named services (default: all) answer health SERVING."""
        with self._lock:
            entries = [self.service(n) for n in names] if names else list(self.state.services)
            self._wait_healthy(entries, timeout_s=timeout_s, progress=_ignore_progress)

    # ---------------------------------------------------------------------------------- planning

    def plan(self, *, previous: ClusterState | None = None, progress: Progress | None = None) -> ClusterState:
        """Decide every service's name, ports, data dir and argv, starting nothing (``up`` uses it).
        Services known from ``previous`` keep their ports when still free; ids and data dirs are
        fixed by name (``replica-N`` is broker N in ``DIR/replica-N``)."""
        say = progress or _ignore_progress
        taken: set[int] = set()

        def pick_port(old_addr: str) -> int:
            old = int(old_addr.rpartition(":")[2]) if old_addr else 0
            if old and old not in taken and is_port_free(old):
                taken.add(old)
                return old
            while True:
                port = find_free_port()
                if port not in taken:
                    taken.add(port)
                    return port

        def old_entry(name: str) -> ServiceEntry | None:
            return previous.find(name) if previous else None

        redis_old = old_entry("redis")
        redis_port = pick_port(redis_old.grpc if redis_old else "")
        redis_addr = f"127.0.0.1:{redis_port}"
        # With TLS, Redis too speaks only TLS; clients verify it with the cluster's CA.
        redis_url = (f"rediss://{redis_addr}/0?ssl_ca_certs={self.config.tls_dir / 'ca.crt'}" if self.config.tls
                     else f"redis://{redis_addr}/0")
        redis_dir = self.data_dir / "redis"
        services = [ServiceEntry(name="redis", kind=REDIS_KIND, grpc=redis_addr, metrics_addr="",
                                 data_dir=str(redis_dir), argv=[], log=str(redis_dir / "redis.log"))]
        # The metadata store: etcd members on loopback (one by default). Their peer ports are in
        # their argv; a restarted cluster keeps both ports and every member's data.
        etcd_ports = []
        for i in range(self.config.metadata_members):
            old = old_entry(f"etcd-{i}")
            old_peer = ""
            if old is not None and "--listen-peer-urls" in old.argv:
                old_peer = old.argv[old.argv.index("--listen-peer-urls") + 1].rpartition("/")[2]
            etcd_ports.append((pick_port(old.grpc if old else ""), pick_port(old_peer)))
        # With TLS every member speaks mutual TLS only, on its client and its peer port, with its
        # own certificate from the cluster's CA (DIR/tls/etcd-N, made by _provision_tls): clients
        # (every service with its own certificate, the supervisor and tools with the admin's) and
        # the other members must present one the CA signed.
        scheme = "https" if self.config.tls else "http"
        initial = ",".join(f"etcd-{i}={scheme}://127.0.0.1:{peer}" for i, (_, peer) in enumerate(etcd_ports))
        for i, (client_port, peer_port) in enumerate(etcd_ports):
            name = f"etcd-{i}"
            member_dir = self.data_dir / "etcd" / name
            member_dir.parent.mkdir(parents=True, exist_ok=True)
            files = self.config.tls_dir / name
            tls = (files / "tls.crt", files / "tls.key", self.config.tls_dir / "ca.crt") if self.config.tls else None
            # etcd serves its Prometheus /metrics on the client port: Prometheus scrapes it too; with
            # TLS over HTTPS, and like every request there only from a client with a certificate.
            services.append(ServiceEntry(
                name=name, kind=ETCD_KIND, grpc=f"127.0.0.1:{client_port}",
                metrics_addr=f"127.0.0.1:{client_port}", metrics_tls=self.config.tls,
                data_dir=str(member_dir), index=i, log=str(self.logs_dir / f"{name}.log"),
                argv=etcd_member_argv(name=name, data_dir=member_dir, client_port=client_port,
                                      peer_port=peer_port, initial_cluster=initial, tls=tls)))
        metadata_url = store_metadata_url([f"127.0.0.1:{c}" for c, _ in etcd_ports], tls=self.config.tls)
        for kind in self._kinds:
            count = kind.count(self.config)
            if count <= 0:
                continue
            if not kind.is_available():
                say(f"skipping {kind.kind}: {kind.module} is not built yet")
                continue
            for index in range(count):
                name = kind.name(index)
                old = old_entry(name)
                grpc_addr = f"127.0.0.1:{pick_port(old.grpc if old else '')}"
                metrics_addr = f"127.0.0.1:{pick_port(old.metrics_addr if old else '')}"
                data_dir = self.data_dir / name if kind.has_data_dir else None
                if data_dir is not None:
                    data_dir.mkdir(parents=True, exist_ok=True)
                ctx = InstanceContext(config=self.config, index=index, data_dir=data_dir, redis_url=redis_url,
                                      metadata_url=metadata_url)
                argv = kind.build_argv(ctx, grpc_addr=grpc_addr, metrics_addr=metrics_addr)
                kafka_addr = ""
                kafka_tls: dict[str, str] = {}
                if kind.command is None and "--kafka-listener" in supported_flags(kind.module):
                    if not self.config.tls:
                        kafka_addr = f"127.0.0.1:{pick_port(old.kafka if old else '')}"
                        argv += ["--kafka-listener", kafka_addr]
                    elif "--kafka-listeners" in supported_flags(kind.module):
                        # With TLS no plaintext listener at all (issue 51): Kafka's SSL listener (client
                        # certificates as identities), and SASL_SSL with auth; ``kafka`` names the SSL one.
                        for listener in ("SSL", "SASL_SSL") if self.config.auth_enabled else ("SSL",):
                            old_addr = old.kafka_listeners.get(listener, "") if old else ""
                            kafka_tls[listener] = f"127.0.0.1:{pick_port(old_addr)}"
                        kafka_addr = kafka_tls["SSL"]
                        argv += ["--kafka-listeners", ",".join(f"{n}://{a}" for n, a in kafka_tls.items()),
                                 "--kafka-ssl-client-auth", "required" if self.config.mutual_tls else "requested"]
                services.append(ServiceEntry(
                    name=name, kind=kind.kind, grpc=grpc_addr, metrics_addr=metrics_addr,
                    data_dir=str(data_dir or ""), index=index, log=str(self.logs_dir / f"{name}.log"),
                    argv=argv, kafka=kafka_addr, kafka_listeners=kafka_tls, metrics_tls="--metrics-tls" in argv))
        frontdoors = [s for s in services if s.kind == "frontdoor"]
        modules = {k.kind: k.module for k in self._kinds}
        for entry in services:
            # A replica's Kafka listener forwards topic, group and DeleteRecords requests there.
            if not entry.kafka or "--frontdoor-addr" not in supported_flags(modules[entry.kind]):
                continue
            if frontdoors:
                entry.argv += ["--frontdoor-addr", frontdoors[0].grpc]
            else:
                # No front door to forward to (a cluster of replicas only): no Kafka listener.
                for flag in ("--kafka-listener", "--kafka-listeners", "--kafka-ssl-client-auth"):
                    if flag in entry.argv:
                        at = entry.argv.index(flag)
                        del entry.argv[at:at + 2]
                entry.kafka, entry.kafka_listeners = "", {}
        (self.data_dir / "objects").mkdir(exist_ok=True)
        return ClusterState(data_dir=self.data_dir, bootstrap=frontdoors[0].grpc if frontdoors else "",
                            kafka_bootstrap=frontdoors[0].kafka if frontdoors else "",
                            kafka_bootstrap_ssl=frontdoors[0].kafka_listeners.get("SSL", "") if frontdoors else "",
                            kafka_bootstrap_sasl_ssl=(frontdoors[0].kafka_listeners.get("SASL_SSL", "")
                                                      if frontdoors else ""), redis=redis_url,
                            metadata=metadata_url,
                            object_store=self.config.object_store_url, services=services,
                            state="starting", config=self.config.to_json())

    # --------------------------------------------------------------------------------- helpers

    def _start_prometheus(self, previous: ClusterState | None, say: Progress) -> None:
        """Start a real Prometheus scraping every service, on the port it had before if free."""
        directory = self.data_dir / "prometheus"
        old_url = (previous.prometheus.get("url", "") if previous else "") or ""
        old_port = int(old_url.rpartition(":")[2]) if old_url else 0
        port = old_port if old_port and is_port_free(old_port) else find_free_port()
        ca_file = str(self.state.tls.get("ca", "")) if self.state.tls else ""
        # etcd's /metrics, on its client port, answers only a client with a certificate (the
        # lowtide services' HTTPS /metrics ask for none): Prometheus has its own (_provision_tls).
        client = self.config.tls_dir / PROMETHEUS_CERT
        targets = [ScrapeTarget(job=f"lowtide-{s.kind}", address=s.metrics_addr, labels={"service": s.name},
                                ca_file=ca_file if s.metrics_tls else "",
                                cert_file=str(client / "tls.crt") if s.metrics_tls and s.is_etcd else "",
                                key_file=str(client / "tls.key") if s.metrics_tls and s.is_etcd else "")
                   for s in self.state.services if s.metrics_addr]
        write_prometheus_config(directory, targets, scrape_interval=self.config.prometheus_scrape_interval,
                                rule_for_override=self.config.prometheus_rule_for)
        say(f"starting prometheus on 127.0.0.1:{port}...")
        proc = start_prometheus(directory, port=port)
        self._procs["prometheus"] = proc
        self.state.prometheus = {"url": f"http://127.0.0.1:{port}", "pid": proc.pid, "dir": str(directory)}
        say(f"prometheus ready: http://127.0.0.1:{port} (alert rules: {directory / 'lowtide-alerts.yaml'})")

    def _stop_prometheus(self, state: ClusterState | None, *, timeout_s: float,
                         progress: Progress) -> list[dict[str, Any]]:
        if state is None or not state.prometheus:
            return []
        pid = int(state.prometheus["pid"])
        address = state.prometheus["url"].removeprefix("http://")
        if control.is_pid_alive(pid):
            progress("stopping prometheus...")
        outcome = control.terminate(pid, address=address, timeout_s=timeout_s, proc=self._procs.get("prometheus"))
        return [{"name": "prometheus", "kind": "prometheus", "pid": pid, "result": outcome}]

    @contextmanager
    def _startup_lock(self) -> Iterator[None]:
        with open(self.data_dir / LOCK_FILE, "a") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise ClusterError("CLUSTER_ALREADY_RUNNING",
                                       f"another 'cluster up' is starting a cluster in {self.data_dir}") from None
                raise
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Logs must reach the log file as they happen, not when a buffer fills.
        env["PYTHONUNBUFFERED"] = "1"
        # Flags fall back to LOWTIDE_<FLAG> (common.server.add_flag): services that take these
        # settings pick them up, the others ignore them, so argv stays valid for every kind.
        env["LOWTIDE_OBJECT_STORE"] = self.config.object_store_url
        env.update(self.config.extra_env)
        return env

    def _spawn(self, entry: ServiceEntry) -> None:
        log_path = Path(entry.log)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {entry.name}: "
                      f"{' '.join(entry.argv)}\n".encode())
            log.flush()
            args = forkserver.service_args(entry.argv) if forkserver.fork_requested() else None
            if args is None:
                proc = subprocess.Popen(entry.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=self.data_dir, env=self._child_env(), start_new_session=True)
                self._procs[entry.name] = proc
                entry.pid = proc.pid
                return
        # A fork of an interpreter that imported the services (localcluster.forkserver): no Popen.
        self._procs.pop(entry.name, None)
        entry.pid = forkserver.shared().spawn(args, env=self._child_env(), cwd=self.data_dir, log=log_path)

    def _start_redis(self, entry: ServiceEntry, say: Progress) -> None:
        say(f"starting redis-server on {entry.grpc}...")
        began = time.monotonic()
        port = int(entry.grpc.rpartition(":")[2])
        try:
            tls_dir = self.config.tls_dir / entry.name
            redis = start_redis(Path(entry.data_dir), port=port, detach=True,
                                tls=(tls_dir / "tls.crt", tls_dir / "tls.key", tls_dir / "ca.crt")
                                if self.config.tls else None)
        except TimeoutError as exc:
            tail = control.tail_file(entry.log, lines=LOG_TAIL_LINES)
            raise ClusterError("CLUSTER_START_FAILED", f"redis-server did not start: {exc}\n"
                               f"--- last lines of {entry.log} ---\n{tail}") from exc
        if redis.proc is not None:
            self._procs[entry.name] = redis.proc
        entry.pid = redis.pid
        link = self.logs_dir / "redis.log"
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(Path(entry.log))
        say(f"redis healthy ({time.monotonic() - began:.1f}s)")

    def _provision_auth(self, say: Progress) -> dict[str, Any]:
        """Before any service starts (etcd is up): a token per service that takes one
        (``User:broker-N`` for replica N, ``User:<kind>`` otherwise) with CLUSTER_ACTION on the
        CLUSTER, and unless the user brought a tokens file an admin super user for the CLI; the
        digests and ACLs go to the metadata store. Returns cluster.json's "auth"."""
        config = self.config
        config.secrets_dir.mkdir(mode=0o700, exist_ok=True)
        by_service: dict[str, ServiceIdentity] = {}
        for entry in self.state.services:
            kind = self._kind_by_name.get(entry.kind)
            if kind is not None and kind.takes_token_file():
                by_service[entry.name] = ServiceIdentity(principal=kind.principal_of(entry.index),
                                                         token_file=config.token_file(entry.name))
        identities = list(by_service.values())
        auth: dict[str, Any] = {
            "enabled": True, "secrets_dir": str(config.secrets_dir),
            "tokens_file": str(config.tokens_file) if config.tokens_file else None,
            "super_users": config.effective_super_users,
            "services": {name: {"principal": i.principal, "token_file": str(i.token_file)}
                         for name, i in by_service.items()},
        }
        metadata = MetadataStore.from_url(self.state.metadata, tls=self.client_tls)
        try:
            provision_identities(metadata, identities)
            if config.generates_admin:
                admin = ServiceIdentity(principal=ADMIN_PRINCIPAL, token_file=config.secrets_dir / "admin.token")
                provision_identities(metadata, [admin], cluster_action=False)  # a super user needs no ACL
                command_config = config.secrets_dir / "admin.properties"
                write_command_config(command_config, read_token_file(admin.token_file))
                if self.state.tls:  # one file for the CLI: the admin's token and its TLS settings
                    with open(command_config, "a", encoding="utf-8") as fh:
                        fh.write("".join(f"{k}={v}\n" for k, v in self.client_tls.to_properties().items()))
                auth.update(admin_principal=admin.principal, admin_token_file=str(admin.token_file),
                            admin_command_config=str(command_config))
        finally:
            metadata.close()
        say(f"auth on: {len(identities)} service identities in {config.secrets_dir}"
            + (f"; CLI: --command-config {auth['admin_command_config']}" if config.generates_admin else ""))
        return auth

    def _provision_tls(self, say: Progress) -> dict[str, Any]:
        """Before any service starts: a CA in DIR/tls and a certificate per service whose subject
        is ``CN=<its principal's name>,O=lowtide`` (replica N: ``CN=broker-N``), plus an admin
        client certificate (``CN=admin``) and ``DIR/tls/client.properties`` for the CLI. Existing
        files are kept: a restarted cluster keeps its certificates. Returns cluster.json's "tls"."""
        tls_dir = self.config.tls_dir
        tls_dir.mkdir(mode=0o700, exist_ok=True)
        ca = CertificateAuthority.create(tls_dir)
        issued = 0
        for entry in self.state.services:
            kind = self._kind_by_name.get(entry.kind)
            if (kind is None and not entry.is_store) or (tls_dir / entry.name / "tls.crt").exists():
                continue
            # The stores: redis-server's CN=redis, each etcd member's CN=etcd-N (its server and peer
            # certificate; etcd maps no certificate to a user, as its auth is off).
            ca.issue(entry.name, common_name=kind.principal_of(entry.index).removeprefix("User:") if kind
                     else "redis" if entry.is_redis else entry.name)
            issued += 1
        if self.config.with_prometheus and not (tls_dir / PROMETHEUS_CERT / "tls.crt").exists():
            ca.issue(PROMETHEUS_CERT)  # the client certificate it scrapes etcd's /metrics with
            issued += 1
        admin_name = ADMIN_PRINCIPAL.removeprefix("User:")
        admin = CertFiles(cert=tls_dir / admin_name / "tls.crt", key=tls_dir / admin_name / "tls.key",
                          ca=tls_dir / admin_name / "ca.crt")
        if not admin.cert.exists():
            admin = ca.issue(admin_name)
        client = ClientTls(ca=ca.ca_path, cert=admin.cert, key=admin.key)
        command_config = tls_dir / "client.properties"
        command_config.write_text("# lowtide client settings for this cluster (TLS as User:admin)\n"
                                  + "".join(f"{k}={v}\n" for k, v in client.to_properties().items()))
        say(f"TLS on ({self.config.tls_client_auth} client auth): CA {ca.ca_path}, {issued} certificates issued")
        return {"ca": str(ca.ca_path), "dir": str(tls_dir), "client_auth": self.config.tls_client_auth,
                "client_cert": str(admin.cert), "client_key": str(admin.key), "command_config": str(command_config)}

    @property
    def client_tls(self) -> ClientTls | None:
        """How a client of this cluster dials it (the admin certificate); None without TLS."""
        tls = self.state.tls
        if not tls:
            return None
        return ClientTls(ca=Path(tls["ca"]), cert=Path(tls["client_cert"]), key=Path(tls["client_key"]))

    def _check_health(self, entry: ServiceEntry, *, timeout_s: float = 1.0) -> str:
        if entry.is_redis:
            return control.check_redis_health(self.state.redis if self._state else f"redis://{entry.grpc}/0",
                                              timeout_s=timeout_s)
        if entry.is_etcd:
            return control.check_etcd_health(entry.grpc, timeout_s=timeout_s,
                                             tls=self.client_tls if self._state else None)
        return control.check_grpc_health(entry.grpc, timeout_s=timeout_s, tls=self.client_tls if self._state else None)

    def _wait_healthy(self, entries: Sequence[ServiceEntry], *, timeout_s: float, progress: Progress) -> None:
        """Poll every entry's health until all are SERVING. Fails fast when a process exits."""
        began = time.monotonic()
        deadline = began + timeout_s
        pending = list(entries)
        last: dict[str, str] = {}
        while pending:
            for entry in list(pending):
                proc = self._procs.get(entry.name)
                exit_code = proc.poll() if proc is not None else None
                if exit_code is not None or not control.is_pid_alive(entry.pid):
                    self._raise_start_failure(entry, f"exited with code {exit_code} before becoming healthy")
                status = self._check_health(entry, timeout_s=0.5)
                kind = self._kind_by_name.get(entry.kind)
                ctx = InstanceContext(config=self.config, index=entry.index, data_dir=None,
                                      redis_url=self.state.redis, metadata_url=self.state.metadata,
                                      metadata=self.metadata_store() if kind and kind.is_ready and
                                      self.state.metadata else None, client_tls=self.client_tls)
                if status == control.SERVING and kind and kind.is_ready and not kind.is_ready(entry.index, ctx):
                    status = "SERVING but not ready (not registered yet)"
                last[entry.name] = status
                if status == control.SERVING:
                    pending.remove(entry)
                    progress(f"{entry.name} healthy ({time.monotonic() - began:.1f}s)")
            if pending and time.monotonic() > deadline:
                entry = pending[0]
                self._raise_start_failure(entry, f"not healthy after {timeout_s:.0f}s "
                                                 f"(health: {last.get(entry.name, 'unknown')})")
            if pending:
                time.sleep(0.1)

    def _raise_start_failure(self, entry: ServiceEntry, reason: str) -> None:
        tail = control.tail_file(entry.log, lines=LOG_TAIL_LINES)
        raise ClusterError("CLUSTER_START_FAILED",
                           f"{entry.name} {reason}\n--- last lines of {entry.log} ---\n{tail}")

    def _stop_entries(self, entries: Sequence[ServiceEntry], *, timeout_s: float,
                      progress: Progress) -> list[dict[str, Any]]:
        """Stop ``entries`` in reverse start order, one kind at a time: instances of one kind stop in
        parallel (each may spend its shutdown grace on in-flight calls), redis stops last."""
        groups: list[list[ServiceEntry]] = []
        for entry in reversed(entries):
            if groups and groups[-1][0].kind == entry.kind:
                groups[-1].append(entry)
            else:
                groups.append([entry])
        results: list[dict[str, Any]] = []
        for group in groups:
            running = [e.name for e in group if control.is_service_running(e.pid, e.grpc)]
            if running:
                progress(f"stopping {', '.join(running)}...")
            outcomes: dict[str, str] = {}
            threads = [threading.Thread(target=self._stop_one, args=(e, timeout_s, outcomes),
                                        name=f"stop-{e.name}", daemon=True) for e in group]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for entry in group:
                outcome = outcomes.get(entry.name, "unknown")
                results.append({"name": entry.name, "kind": entry.kind, "pid": entry.pid, "result": outcome})
        return results

    def _stop_one(self, entry: ServiceEntry, timeout_s: float, outcomes: dict[str, str]) -> None:
        outcomes[entry.name] = control.terminate(entry.pid, address=entry.grpc, timeout_s=timeout_s,
                                                 proc=self._procs.get(entry.name))

    def _stop_foreground_supervisor(self, *, timeout_s: float, progress: Progress) -> None:
        pid_file = self.data_dir / SUPERVISOR_PID_FILE
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        cmdline = control.read_cmdline(pid) or ""
        if pid == os.getpid() or not control.is_pid_alive(pid) or "cluster" not in cmdline:
            return
        # The foreground `cluster up` stops the services itself on SIGTERM; give it the chance so
        # its terminal shows the shutdown, then finish whatever it left.
        progress(f"stopping the foreground supervisor (pid {pid})...")
        control.send_signal(pid, signal.SIGTERM)
        control.wait_for_exit(pid, timeout_s=timeout_s * 2)

    def _signal_running(self, name: str, sig: int) -> None:
        with self._lock:
            entry = self.service(name)
            if not control.is_service_running(entry.pid, entry.grpc):
                raise ClusterError("SERVICE_NOT_RUNNING", f"{name} is not running")
            control.send_signal(entry.pid, sig)
