"""The local cluster's fork server (localcluster/forkserver.py): a forked command runs as
``python -m lowtide.cli.main ARGS`` would, in its own session, working directory, environment and log
file, shows that command line, and is reaped when it ends (no zombie for is_pid_alive to wait on)."""

from __future__ import annotations

import os
import sys

from lowtide.localcluster import control
from lowtide.localcluster.forkserver import ForkServer, service_args
from tests.waiting import wait_until


def test_only_this_interpreters_lowtide_cli_is_forked():
    assert service_args([sys.executable, "-m", "lowtide.cli.main", "serve", "replica", "--id", "0"]) == [
        "serve", "replica", "--id", "0"]
    assert service_args(["/usr/bin/python3", "-m", "lowtide.cli.main", "serve"]) is None
    assert service_args([sys.executable, "-m", "lowtide.other"]) is None
    assert service_args(["redis-server", "--port", "1"]) is None


def test_a_forked_command_writes_its_output_to_its_log_in_its_directory_and_is_reaped(tmp_path):
    server = ForkServer()
    log = tmp_path / "cli.log"
    pid = server.spawn(["--help"], env={"PATH": os.environ["PATH"]}, cwd=tmp_path, log=log)
    wait_until(lambda: not control.is_pid_alive(pid), timeout_s=30, what="the forked command to end")
    assert "usage:" in log.read_text()
    # The server outlives its children and serves the next request.
    pid2 = server.spawn(["no-such-command"], env={"PATH": os.environ["PATH"]}, cwd=tmp_path, log=log)
    wait_until(lambda: not control.is_pid_alive(pid2), timeout_s=30, what="the failing command to end")
    assert "invalid choice: 'no-such-command'" in log.read_text()


def test_a_forked_service_shows_its_own_command_line_in_its_own_session_and_directory(tmp_path):
    server = ForkServer()
    log = tmp_path / "service.log"
    # A service that waits: the front door without Redis retries its connection until stopped.
    args = ["serve", "frontdoor", "--grpc-addr", "127.0.0.1:1", "--metrics-addr", "127.0.0.1:0",
            "--redis-url", "redis://127.0.0.1:1/0"]
    pid = server.spawn(args, env={"PATH": os.environ["PATH"]}, cwd=tmp_path, log=log)
    try:
        wait_until(lambda: "serve frontdoor --grpc-addr 127.0.0.1:1" in (control.read_cmdline(pid) or ""),
                   timeout_s=10, what="the service's command line")
        assert os.getsid(pid) == pid
        assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
    finally:
        control.send_signal(pid, 9)
    wait_until(lambda: not control.is_pid_alive(pid), timeout_s=10, what="the killed service to be reaped")
