"""Helpers for integration tests: raw gRPC stubs to the services of a running LocalCluster."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from lowtide.common.procs import require_tool
from lowtide.localcluster import LocalCluster
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import MetadataStore
from lowtide.record import decode_batches, encode_batch
from lowtide.rpc.channels import open_channel
from lowtide_pb import admin_pb2, admin_pb2_grpc, common_pb2, replica_pb2, replica_pb2_grpc
from tests import waiting


def channel(cluster: LocalCluster, address: str) -> grpc.Channel:
    """A channel to one of ``cluster``'s services: TLS with the admin certificate when the cluster
    runs TLS (``LocalCluster.client_tls``), plaintext otherwise."""
    return open_channel(address, cluster.client_tls)


def admin(cluster: LocalCluster) -> admin_pb2_grpc.AdminStub:
    return admin_pb2_grpc.AdminStub(channel(cluster, cluster.bootstrap))


def replica(cluster: LocalCluster, broker_id: int) -> replica_pb2_grpc.ReplicaStub:
    entry = cluster.service(f"replica-{broker_id}")
    return replica_pb2_grpc.ReplicaStub(channel(cluster, entry.grpc))


def store(cluster: LocalCluster) -> MetadataStore:
    """The test process's store on the cluster's etcd (shared, closed by ``cluster.down()``),
    caught up with etcd first: a test reads what another process wrote a moment ago."""
    metadata = cluster.metadata_store()
    metadata.sync()
    return metadata


def etcd_client(cluster: LocalCluster, endpoints: list[str] | None = None, *, timeout_s: float = 5.0) -> EtcdClient:
    """A raw etcd client on ``endpoints`` (default: every member) that dials as the cluster's
    clients do: over mutual TLS with the admin certificate on a ``--tls`` cluster. The caller
    closes it."""
    tls = cluster.client_tls
    return EtcdClient(list(endpoints) if endpoints else [e.grpc for e in cluster.services("etcd")],
                      timeout_s=timeout_s, credentials=tls.channel_credentials() if tls else None)


def auth_metadata(cluster: LocalCluster) -> list[tuple[str, str]]:
    """The generated admin's bearer token of a cluster started with auth on (no tokens file); []
    without auth. Pass it as ``metadata`` to the helpers below."""
    token_file = cluster.state.auth.get("admin_token_file")
    return [("authorization", f"Bearer {Path(token_file).read_text().strip()}")] if token_file else []


def create_topic(cluster: LocalCluster, name: str, *, partitions: int = 1, rf: int = 3,
                 config: dict[str, str] | None = None, metadata: list[tuple[str, str]] = ()) -> None:
    resp = admin(cluster).CreateTopics(admin_pb2.CreateTopicsRequest(topics=[admin_pb2.TopicSpec(
        name=name, partitions=partitions, replication_factor=rf, config=config or {})]), metadata=metadata)
    assert resp.topics[0].error_code == 0, resp
    # every replica has picked up its assignment once the leader answers DescribeLogs for it
    wait_until(lambda: all(_hosted(cluster, name, p, metadata) for p in range(partitions)), what=f"{name} hosted")


def _hosted(cluster: LocalCluster, topic: str, partition: int, metadata: list[tuple[str, str]] = ()) -> bool:
    st = store(cluster).partition_state(topic, partition)
    for r in st.replicas:
        logs = replica(cluster, r).DescribeLogs(replica_pb2.DescribeLogsRequest(
            partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)]), metadata=metadata).logs
        if not logs or logs[0].role not in ("leader", "follower"):
            return False
    return True


def leader_of(cluster: LocalCluster, topic: str, partition: int = 0) -> int:
    return store(cluster).partition_state(topic, partition).leader


def produce(cluster: LocalCluster, topic: str, values: list[bytes | None], *, partition: int = 0, acks: int = -1,
            timeout_ms: int = 10000, leader: int | None = None, metadata: list[tuple[str, str]] = (),
            keys: list[bytes | None] | None = None) -> replica_pb2.ProduceResult:
    lid = leader_of(cluster, topic, partition) if leader is None else leader
    records = encode_batch(values, keys=keys)
    resp = replica(cluster, lid).Produce(replica_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms, partitions=[
        replica_pb2.ProducePartition(topic=topic, partition=partition, records=records)]),
        timeout=timeout_ms / 1000 + 10, metadata=metadata)
    return resp.partitions[0]


def fetch(cluster: LocalCluster, topic: str, offset: int, *, partition: int = 0,
          max_bytes: int = 1 << 20) -> replica_pb2.FetchResult:
    lid = leader_of(cluster, topic, partition)
    resp = replica(cluster, lid).Fetch(replica_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, partitions=[
        replica_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset,
                                   partition_max_bytes=max_bytes)]))
    return resp.partitions[0]


def read_all(cluster: LocalCluster, topic: str, *, partition: int = 0, start: int = 0) -> list[tuple[int, bytes]]:
    """Every record from ``start`` to the HW, read from the leader as a consumer."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while True:
        r = fetch(cluster, topic, offset, partition=partition)
        assert r.error_code == 0, r
        if not r.records:
            return out
        for _header, records in decode_batches(r.records):
            for rec in records:
                if rec.offset >= offset:
                    out.append((rec.offset, rec.value))
        offset = out[-1][0] + 1
        if offset >= r.high_watermark:
            return out


def describe(cluster: LocalCluster, broker_id: int, topic: str, partition: int = 0, *,
             metadata: list[tuple[str, str]] = ()) -> replica_pb2.LogInfo:
    logs = replica(cluster, broker_id).DescribeLogs(replica_pb2.DescribeLogsRequest(
        partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)]), metadata=metadata).logs
    assert logs, f"{topic}-{partition} not hosted on replica {broker_id}"
    return logs[0]


def delete_records(cluster: LocalCluster, items: list[tuple[str, int, int]], *, timeout_ms: int = 10000,
                   metadata: list[tuple[str, str]] | None = None) -> list[common_pb2.DeleteRecordsResult]:
    resp = admin(cluster).DeleteRecords(common_pb2.DeleteRecordsRequest(
        partitions=[common_pb2.DeleteRecordsPartition(topic=t, partition=p, offset=o) for t, p, o in items],
        timeout_ms=timeout_ms), metadata=metadata or (), timeout=timeout_ms / 1000 + 10)
    return list(resp.partitions)


def segment_files(cluster: LocalCluster, broker_id: int, topic: str, partition: int = 0) -> list[int]:
    d = Path(cluster.service(f"replica-{broker_id}").data_dir) / f"{topic}-{partition}"
    return sorted(int(f.name.split(".")[0]) for f in d.iterdir() if f.name.endswith(".log"))


# The suite's wait_until with cluster defaults: services take seconds to settle, and while they do a
# check may hit a replica that is not (yet) the leader (RpcError) or a failed assert in a helper.
wait_until = functools.partial(waiting.wait_until, timeout_s=20.0, interval_s=0.05,
                               retry_on=(grpc.RpcError, AssertionError))


def lowtide_cli(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real `lowtide` command (the console script of this venv)."""
    exe = Path(sys.executable).with_name("lowtide")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lowtide.cli.main"]
    return subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def cli_json(*args: str, ok: bool = True) -> dict:
    proc = lowtide_cli(*args, "--output", "json")
    if ok:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout.strip().splitlines()[-1])


def metrics_text(cluster: LocalCluster, service: str) -> str:
    """``service``'s /metrics page; on a ``--tls`` cluster over HTTPS, verified with its CA and
    presenting the admin certificate (an etcd member asks for one; the lowtide services do not)."""
    entry = cluster.service(service)
    context = cluster.client_tls.ssl_context() if entry.metrics_tls else None
    with urllib.request.urlopen(entry.metrics_url, timeout=5, context=context) as reply:
        return reply.read().decode()


def etcdctl(cluster: LocalCluster, *args: str, endpoint: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """The real ``etcdctl`` (API v3) on ``endpoint``, one of ``cluster``'s etcd members, dialling
    as the cluster's clients do: over mutual TLS with the admin certificate on a ``--tls`` cluster.
    Raises ``CalledProcessError`` when it fails."""
    exe = require_tool("etcdctl", "apt-get install etcd-client (make setup does this)")
    tls = cluster.client_tls
    flags = [f"--endpoints=https://{endpoint}", f"--cacert={tls.ca}", f"--cert={tls.cert}", f"--key={tls.key}"] \
        if tls is not None else [f"--endpoints={endpoint}"]
    return subprocess.run([exe, *flags, *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "ETCDCTL_API": "3"}, timeout=timeout_s)


def metric(cluster: LocalCluster, service: str, sample: str, **labels: str) -> float:
    """The first sample named ``sample`` (e.g. ``..._total``) whose labels include ``labels`` on
    ``service``'s /metrics; 0 when no such series exists yet."""
    text = metrics_text(cluster, service)
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == sample and labels.items() <= found.labels.items():
                return float(found.value)
    return 0.0


# Ample for an ACL change to reach every service: their metadata watches deliver it (normally
# within milliseconds) and the authorizers reload on it (auth/acl.py Authorizer).
ACL_CHECK_INTERVAL_S = 0.25


def wait_acls_in_force() -> None:
    """After an ACL change: every other service sees it once its metadata watch delivered it, so a
    request right after the change may still be judged by the ACLs before it."""
    time.sleep(ACL_CHECK_INTERVAL_S)
