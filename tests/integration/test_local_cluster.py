"""The local-cluster supervisor against real processes: redis-server and every built service kind.

Checks the cluster.json contract (docs/operations.md#clusterjson), health and metrics endpoints, down/up reuse of data
directories and ports, single-process control (kill/stop/start/pause/resume), startup failure
cleanup, and the real `lowtide cluster` CLI in detached and foreground modes.

A cluster start is seconds of CPU: the checks that only look read the worker's shared cluster (the
``cluster`` configuration); the single-process control and the down/up reuse share one 2-replica
cluster, down/up last.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lowtide.localcluster import KINDS, ClusterConfig, ClusterError, LocalCluster, ServiceKind
from lowtide.localcluster.config import is_module_available
from lowtide.metadata.store import MetadataStore
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, require_redis_server, running_cluster

CLI = [sys.executable, "-m", "lowtide.cli.main"]
BUILT_KINDS = {k.kind for k in KINDS if k.is_available()}


def grpc_health(address: str, *, timeout_s: float = 2.0) -> str:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def is_listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def is_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (reaped) since the kill(0)
        return False
    return not stat or stat.rpartition(")")[2].split()[0] != "Z"


def run_cli(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout_s)


def assert_all_stopped(doc: dict) -> None:
    for service in doc["services"]:
        assert not is_pid_alive(service["pid"]), f"{service['name']} (pid {service['pid']}) still alive"
        assert not is_listening(service["grpc"]), f"{service['name']} still listening on {service['grpc']}"


@pytest.fixture(scope="module")
def two_replicas(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 2-replica cluster for the tests that kill, stop, pause and restart its services: single-process
    control first, then down and up again (the module's last use of it)."""
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("two-replicas"), replicas=2,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG)))


def test_up_writes_cluster_json_with_live_healthy_services(shared_cluster: LocalCluster) -> None:
    cluster = shared_cluster  # looks only
    doc = json.loads((cluster.data_dir / "cluster.json").read_text())
    assert doc == cluster.to_json()
    kinds = {s["kind"] for s in doc["services"]}
    assert kinds == {"redis", "etcd"} | BUILT_KINDS
    assert {"redis", "replica", "frontdoor"} <= kinds
    if is_module_available("lowtide.coordinator.server"):
        assert "coordinator" in kinds
    by_name = {s["name"]: s for s in doc["services"]}
    assert {"replica-0", "replica-1", "replica-2", "frontdoor-0", "redis"} <= set(by_name)
    assert doc["bootstrap"] == by_name["frontdoor-0"]["grpc"]
    assert doc["redis"].startswith("redis://127.0.0.1:")
    members = [s for s in doc["services"] if s["kind"] == "etcd"]
    assert doc["metadata"] == "etcd://" + ",".join(m["grpc"] for m in members) and len(members) == 1
    assert doc["object_store"] == (cluster.data_dir / "objects").as_uri()
    assert Path(doc["object_store"].removeprefix("file://")).is_dir()

    assert redis_lib.Redis.from_url(doc["redis"]).ping()
    for service in doc["services"]:
        assert set(service) >= {"name", "kind", "grpc", "metrics", "pid", "data_dir"}
        assert is_pid_alive(service["pid"]), service["name"]
        if service["kind"] == "redis":
            continue
        assert grpc_health(service["grpc"]) == "SERVING", service["name"]
        assert service["metrics"] == f"http://{service['metrics'].removeprefix('http://')}"
        with urllib.request.urlopen(service["metrics"], timeout=5) as reply:
            assert reply.status == 200
            assert reply.headers.get_content_type() == "text/plain"
            assert "# TYPE" in reply.read().decode()
        assert Path(service["log"]) == cluster.data_dir / "logs" / f"{service['name']}.log"
    for index in range(3):
        replica = by_name[f"replica-{index}"]
        assert replica["data_dir"] == str(cluster.data_dir / f"replica-{index}")
        assert Path(replica["data_dir"]).is_dir()
        assert "--id" in replica["argv"] and replica["argv"][replica["argv"].index("--id") + 1] == str(index)
        # broker defaults pass through: segment.bytes as a topic-config default, the ISR limit as a flag
        assert "segment.bytes=65536" in replica["argv"]
        assert replica["argv"][replica["argv"].index("--replica-lag-time-max-ms") + 1] == "3000"


def test_up_refuses_a_directory_with_a_running_cluster(shared_cluster: LocalCluster) -> None:
    cluster = shared_cluster  # the refused up must leave it as it was
    second = LocalCluster(ClusterConfig(data_dir=cluster.data_dir, replicas=1))
    with pytest.raises(ClusterError) as info:
        second.up(detach=True)
    assert info.value.code == "CLUSTER_ALREADY_RUNNING"
    assert "cluster down" in info.value.message
    assert cluster.status()["healthy"], "the refused up must not disturb the running cluster"


def test_kill_start_stop_pause_resume_one_service(two_replicas: LocalCluster) -> None:
    cluster = two_replicas
    victim = cluster.service("replica-1")
    old_pid, address = victim.pid, victim.grpc

    cluster.kill("replica-1")
    assert not is_pid_alive(old_pid)
    assert not cluster.is_running("replica-1")
    assert not cluster.status()["healthy"]

    cluster.start_service("replica-1")
    assert cluster.service("replica-1").grpc == address
    new_pid = cluster.service("replica-1").pid
    assert new_pid != old_pid and is_pid_alive(new_pid)
    on_disk = {s["name"]: s for s in json.loads((cluster.data_dir / "cluster.json").read_text())["services"]}
    assert on_disk["replica-1"]["pid"] == new_pid
    assert grpc_health(address) == "SERVING"

    assert cluster.stop_service("replica-1") == "stopped"
    assert not is_pid_alive(new_pid)
    cluster.start_service("replica-1")

    cluster.pause("replica-0")
    try:
        assert is_pid_alive(cluster.service("replica-0").pid)
        assert grpc_health(cluster.service("replica-0").grpc, timeout_s=0.5) == "DEADLINE_EXCEEDED"
    finally:
        cluster.resume("replica-0")
    cluster.wait_until_healthy(timeout_s=15)
    assert cluster.status()["healthy"]

    # Redis restarts on its port; the cluster metadata is not in it.
    cluster.kill("redis")
    assert not cluster.is_running("redis")
    cluster.start_service("redis")
    cluster.wait_until_healthy(timeout_s=15)

    # The etcd member restarts on its ports with its data: the brokers registered are still there.
    store = MetadataStore.from_url(cluster.metadata_url, tls=cluster.client_tls)
    try:
        brokers_before = set(store.brokers())
        cluster.kill("etcd-0")
        assert not cluster.is_running("etcd-0")
        cluster.start_service("etcd-0")
        store.sync()
        assert set(store.brokers()) == brokers_before == {0, 1}
    finally:
        store.close()
    cluster.wait_until_healthy(timeout_s=15)


def test_status_down_and_up_again_reuse_data_dirs_ids_and_ports(two_replicas: LocalCluster) -> None:
    cluster = two_replicas  # the module's last test of it: it stays down
    status = cluster.status()
    assert status["healthy"] and status["state"] == "running"
    assert all(s["alive"] and s["health"] == "SERVING" for s in status["services"])

    before = cluster.to_json()
    marker = Path(cluster.service("replica-1").data_dir) / "kept-across-restart"
    marker.write_text("x")

    report = cluster.down()
    assert {r["result"] for r in report["services"]} <= {"stopped", "killed"}
    assert [r["name"] for r in report["services"]][-1] == "redis", "redis must stop last"
    assert_all_stopped(before)
    assert not cluster.status()["healthy"]
    assert json.loads((cluster.data_dir / "cluster.json").read_text())["state"] == "stopped"
    assert cluster.down()["services"][0]["result"] == "not running", "down must be idempotent"

    again = LocalCluster.load(cluster.data_dir)
    after = again.up(detach=True)
    try:
        assert marker.read_text() == "x"
        old = {s["name"]: s for s in before["services"]}
        for service in after["services"]:
            assert service["data_dir"] == old[service["name"]]["data_dir"]
            assert service["argv"] == old[service["name"]]["argv"], "same ids, ports and flags"
            assert service["pid"] != old[service["name"]]["pid"]
        assert again.status()["healthy"]
    finally:
        again.down()


def test_failed_start_stops_everything_and_reports_the_log_tail(tmp_path: Path) -> None:
    require_redis_server()
    broken = ServiceKind(
        kind="broken", module="lowtide.localcluster", count=lambda _config: 1, build_flags=lambda _ctx: [],
        command=lambda _ctx: [sys.executable, "-c", "import sys; print('broken: cannot start'); sys.exit(3)"])
    cluster = LocalCluster(ClusterConfig(data_dir=tmp_path, replicas=1), kinds=[KINDS[0], broken])
    with pytest.raises(ClusterError) as info:
        cluster.up(detach=True)
    assert info.value.code == "CLUSTER_START_FAILED"
    assert "broken-0 exited with code 3" in info.value.message
    assert "broken: cannot start" in info.value.message
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert doc["state"] == "stopped"
    assert {s["name"] for s in doc["services"]} == {"redis", "etcd-0", "replica-0", "broken-0"}
    assert_all_stopped(doc)


def test_cli_up_detach_status_and_down(tmp_path: Path) -> None:
    require_redis_server()
    data_dir = tmp_path / "cli"
    up = run_cli("cluster", "up", "--data-dir", str(data_dir), "--replicas", "1", "--detach", "--output", "json")
    try:
        assert up.returncode == 0, up.stderr
        doc = json.loads(up.stdout)
        assert doc == json.loads((data_dir / "cluster.json").read_text())
        assert "replica-0 healthy" in up.stderr and "starting redis-server" in up.stderr
        assert all(is_pid_alive(s["pid"]) for s in doc["services"]), "detached services outlive the CLI"

        status = run_cli("cluster", "status", "--data-dir", str(data_dir), "--output", "json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert json.loads(status.stdout)["healthy"] is True

        again = run_cli("cluster", "up", "--data-dir", str(data_dir), "--detach", "--output", "json")
        assert again.returncode != 0
        assert json.loads(again.stdout)["error"]["code"] == "CLUSTER_ALREADY_RUNNING"
    finally:
        down = run_cli("cluster", "down", "--data-dir", str(data_dir), "--output", "json")
    assert down.returncode == 0, down.stderr
    assert_all_stopped(doc)
    status = run_cli("cluster", "status", "--data-dir", str(data_dir))
    assert status.returncode == 1
    assert "UNHEALTHY" in status.stdout


def test_cli_up_tls_runs_etcd_over_mutual_tls_and_topics_work_through_the_cli(tmp_path: Path) -> None:
    """``lowtide cluster up --tls``: the etcd member too speaks only mutual TLS (its own certificate
    from the cluster's CA on the client and the peer port), every service dials ``etcds://`` with
    its certificate, ``cluster status`` (another process) checks the member over TLS, and topics
    are created, produced to and consumed through the CLI with the cluster's client.properties."""
    require_redis_server()
    data_dir = tmp_path / "tls"
    up = run_cli("cluster", "up", "--data-dir", str(data_dir), "--replicas", "1", "--tls", "--detach",
                 "--output", "json")
    try:
        assert up.returncode == 0, up.stderr
        doc = json.loads(up.stdout)
        [member] = [s for s in doc["services"] if s["kind"] == "etcd"]
        assert doc["metadata"] == f"etcds://{member['grpc']}"
        argv = member["argv"]
        ca, own = data_dir / "tls" / "ca.crt", data_dir / "tls" / "etcd-0"
        for flag, value in (("--cert-file", own / "tls.crt"), ("--key-file", own / "tls.key"),
                            ("--trusted-ca-file", ca), ("--peer-cert-file", own / "tls.crt"),
                            ("--peer-key-file", own / "tls.key"), ("--peer-trusted-ca-file", ca)):
            assert argv[argv.index(flag) + 1] == str(value), flag
        assert "--client-cert-auth" in argv and "--peer-client-cert-auth" in argv
        assert not [a for a in argv if "http://" in a], argv
        assert member["metrics"] == f"https://{member['grpc']}/metrics"
        lowtide = [s for s in doc["services"] if s["kind"] not in ("redis", "etcd")]
        assert lowtide and all(s["argv"][s["argv"].index("--metadata-url") + 1] == doc["metadata"] for s in lowtide)
        assert grpc_health(member["grpc"]) == "UNAVAILABLE"  # plaintext gets nothing

        status = run_cli("cluster", "status", "--data-dir", str(data_dir), "--output", "json")
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["healthy"] is True
        assert {s["name"]: s["health"] for s in report["services"]}["etcd-0"] == "SERVING"

        client = ["--bootstrap-server", doc["bootstrap"], "--command-config", doc["tls"]["command_config"]]
        created = run_cli("topics", "create", "--topic", "over-tls", "--partitions", "2", *client)
        assert created.returncode == 0, created.stdout + created.stderr
        produced = subprocess.run([*CLI, "produce", "--topic", "over-tls", "--partition", "1", *client],
                                  input="".join(f"r{i}\n" for i in range(50)), capture_output=True, text=True,
                                  timeout=120)
        assert produced.returncode == 0, produced.stdout + produced.stderr
        consumed = run_cli("consume", "--topic", "over-tls", "--partition", "1", "--offset", "earliest",
                           "--max-records", "50", *client)
        assert consumed.returncode == 0, consumed.stdout + consumed.stderr
        assert consumed.stdout.split() == [f"r{i}" for i in range(50)]
    finally:
        down = run_cli("cluster", "down", "--data-dir", str(data_dir), "--output", "json")
    assert down.returncode == 0, down.stderr
    assert_all_stopped(doc)


def _start_foreground(data_dir: Path) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen([*CLI, "cluster", "up", "--data-dir", str(data_dir), "--replicas", "1",
                             "--output", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # printed once the cluster is healthy
    if not line:
        proc.wait(10)
        pytest.fail(f"foreground cluster up failed: {proc.stderr.read()}")
    return proc, json.loads(line)


@pytest.mark.parametrize("stopper", ["sigterm", "cluster-down"])
def test_cli_foreground_up_stops_everything(tmp_path: Path, stopper: str) -> None:
    require_redis_server()
    data_dir = tmp_path / "fg"
    proc, doc = _start_foreground(data_dir)
    try:
        assert (data_dir / "cluster.pid").read_text().strip() == str(proc.pid)
        if stopper == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            down = run_cli("cluster", "down", "--data-dir", str(data_dir))
            assert down.returncode == 0, down.stderr
        assert proc.wait(60) == 0
        assert_all_stopped(doc)
        assert not (data_dir / "cluster.pid").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        run_cli("cluster", "down", "--data-dir", str(data_dir))
