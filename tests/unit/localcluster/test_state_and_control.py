"""cluster.json persistence and the process primitives of the supervisor (on throwaway processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lowtide.cli.cluster_cmd import format_cluster, format_status
from lowtide.localcluster import ClusterState, ServiceEntry, control
from lowtide.localcluster.cluster import is_port_free
from lowtide.localcluster.state import read_state, write_json_atomic, write_state
from tests.waiting import wait_until


def sample_state(data_dir: Path) -> ClusterState:
    services = [
        ServiceEntry(name="redis", kind="redis", grpc="127.0.0.1:7000", metrics_addr="",
                     data_dir=str(data_dir / "redis"), argv=[], log=str(data_dir / "redis" / "redis.log"), pid=11),
        ServiceEntry(name="replica-0", kind="replica", grpc="127.0.0.1:7001", metrics_addr="127.0.0.1:7002",
                     data_dir=str(data_dir / "replica-0"), argv=["python", "-m", "x"],
                     log=str(data_dir / "logs" / "replica-0.log"), pid=12),
    ]
    return ClusterState(data_dir=data_dir, bootstrap="127.0.0.1:7003", redis="redis://127.0.0.1:7000/0",
                        object_store=(data_dir / "objects").as_uri(), services=services, config={"replicas": 1})


def test_cluster_json_has_the_brief_shape_and_round_trips(tmp_path: Path) -> None:
    state = sample_state(tmp_path)
    write_state(state)
    doc = json.loads((tmp_path / "cluster.json").read_text())
    assert {"bootstrap", "redis", "object_store", "services"} <= set(doc)
    replica = doc["services"][1]
    assert replica["metrics"] == "http://127.0.0.1:7002/metrics"
    assert {"name", "kind", "grpc", "metrics", "pid", "data_dir"} <= set(replica)
    assert doc["services"][0]["metrics"] == ""
    assert read_state(tmp_path) == state
    assert [p.name for p in tmp_path.iterdir()] == ["cluster.json"], "no temporary file left behind"


def test_cluster_json_has_an_auth_key_only_with_auth_on_and_the_cli_shows_the_admin_config(tmp_path: Path) -> None:
    state = sample_state(tmp_path)
    assert "auth" not in state.to_json()
    state.auth = {"enabled": True, "secrets_dir": str(tmp_path / "secrets"), "admin_principal": "User:admin",
                  "admin_command_config": str(tmp_path / "secrets" / "admin.properties")}
    write_state(state)
    again = read_state(tmp_path)
    assert again == state and again.to_json()["auth"] == state.auth
    assert f"--command-config {tmp_path / 'secrets' / 'admin.properties'}" in format_cluster(again.to_json())


def test_read_state_of_an_empty_directory_is_none(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None


def test_write_json_atomic_replaces_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    write_json_atomic(path, {"a": "x" * 10000})
    write_json_atomic(path, {"b": 1})
    assert json.loads(path.read_text()) == {"b": 1}


def test_pid_liveness_and_zombies_are_dead() -> None:
    assert control.is_pid_alive(os.getpid())
    assert not control.is_pid_alive(0)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # Not waited for: the exited child is a zombie, which must count as dead (and gets reaped).
    wait_until(lambda: not control.is_pid_alive(child.pid), timeout_s=10, interval_s=0.02,
               what="the exited child to count as dead")
    assert not control.is_pid_alive(child.pid)


# The child's main thread ends (pthread_exit) while another thread goes on holding a listening socket:
# the leader shows as a zombie ("Z") although the process still runs and its files are open. That is
# the window a SIGKILLed multi-threaded service passes through (its threads exit one by one, the
# descriptors close with the last); a restart bound in it failed with EADDRINUSE (CI, session 31).
_MAIN_THREAD_EXITS = """
import ctypes, socket, sys, threading, time
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
def hold():
    sys.stdin.readline()  # until the test closes our stdin
    sock.close()
threading.Thread(target=hold).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_a_process_whose_main_thread_exited_but_whose_other_threads_run_is_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", _MAIN_THREAD_EXITS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        wait_until(lambda: _state_of(child.pid) == "Z", timeout_s=10, interval_s=0.02,
                   what="the child's main thread to exit")
        assert control.is_pid_alive(child.pid), "a thread still runs and still holds the port"
        assert not control.wait_for_exit(child.pid, timeout_s=0.3)
        assert _port_is_held(port)
        child.stdin.close()  # the last thread exits
        assert control.wait_for_exit(child.pid, timeout_s=10)
        assert not _port_is_held(port)
    finally:
        child.kill()
        child.wait()


def _state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _port_is_held(port: int) -> bool:
    return not is_port_free(port)


def test_ownership_needs_the_address_on_the_command_line() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--grpc-addr", "127.0.0.1:65001"])
    try:
        wait_until(lambda: "65001" in (control.read_cmdline(child.pid) or ""), timeout_s=10, interval_s=0.02,
                   what="the child's command line to show its address")
        assert control.is_service_running(child.pid, "127.0.0.1:65001")
        assert not control.is_service_running(child.pid, "127.0.0.1:65002"), "a recycled pid is not ours"
        assert control.terminate(child.pid, address="127.0.0.1:65002", timeout_s=1, proc=child) == "not running"
        assert control.terminate(child.pid, address="127.0.0.1:65001", timeout_s=5, proc=child) == "stopped"
        assert child.returncode is not None
    finally:
        child.kill()
        child.wait()


def test_terminate_kills_what_ignores_sigterm() -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", code, "--port", "65003"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert control.terminate(child.pid, address="127.0.0.1:65003", timeout_s=0.3, proc=child) == "killed"
        assert not control.is_pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_tail_file(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert control.tail_file(log, lines=2) == "line 98\nline 99\n"
    assert control.tail_file(tmp_path / "missing.log").startswith("(no log:")


def test_health_of_nothing_listening_is_unreachable() -> None:
    assert control.check_grpc_health("127.0.0.1:1", timeout_s=0.3) == control.UNREACHABLE
    assert control.check_redis_health("redis://127.0.0.1:1/0", timeout_s=0.3) == control.UNREACHABLE


def test_text_renderings_name_every_service(tmp_path: Path) -> None:
    doc = sample_state(tmp_path).to_json()
    text = format_cluster(doc)
    assert "replica-0" in text and "http://127.0.0.1:7002/metrics" in text and str(tmp_path / "logs") in text
    status = {"data_dir": str(tmp_path), "state": "running", "bootstrap": "b", "healthy": False,
              "services": [{"name": "replica-0", "kind": "replica", "grpc": "g", "pid": 1, "alive": False,
                            "health": "STOPPED"}]}
    assert "UNHEALTHY" in format_status(status) and "STOPPED" in format_status(status)
