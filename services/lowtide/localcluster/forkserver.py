"""Start a local cluster's Python services by forking a process that has already imported them.

Why: a service process spends about a CPU-second importing lowtide, gRPC, protobuf and the Kafka
protocol's classes before it serves; a cluster of three replicas, a front door, two coordinator
shards and the orphan scanner spends seven of its thirteen CPU-seconds of start-up there. The test
suite starts about eighty clusters and restarts services in many fault tests, on two cores: the
imports alone were a quarter of its CPU. A fork of a process that imported everything once costs
milliseconds. The forked service is the same program with the same argv (``python -m
lowtide.cli.main serve KIND ...``: its ``main(argv)``, called as the module's ``__main__`` does), in
its own session, working directory, environment and log file, and shows that command line in ``ps``
and ``/proc/PID/cmdline`` (setproctitle), which ``localcluster.control`` checks before signalling.

Opt-in (``LOWTIDE_LOCALCLUSTER_FORK=1``; tests/conftest.py sets it): the default stays one
``subprocess.Popen`` per service, the plainest thing for a user's ``lowtide cluster up``.

The server is ``python -c SERVER_CODE`` (this module's ``main``), one per process that starts clusters,
spoken to over its stdin and stdout (stdout itself is pointed at stderr once started, so nothing
but replies reaches the pipe)::

    frame    = length uint32 big-endian | JSON object (UTF-8)
    request    {"argv": [str, ...] after "-m lowtide.cli.main", "env": {str: str}, "cwd": str,
                "log": str (appended to; the child's stdout and stderr)}
    reply      {"pid": int}  or  {"error": str}
    EOF on stdin: the server exits; the services it started live on (own sessions, reparented).

It is single-threaded (a fork copies only the calling thread; nothing else may hold a lock then)
and reaps its children on SIGCHLD, so a killed service does not linger as a zombie that
``control.is_pid_alive`` would wait on. Its children reset that handler.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

FORK_ENV = "LOWTIDE_LOCALCLUSTER_FORK"
MAIN_MODULE = "lowtide.cli.main"
# What the services import before they serve (cli/serve_cmd.py maps kinds to these).
PRELOAD = ("lowtide.cli.main", "lowtide.cli.serve_cmd", "lowtide.replica.server", "lowtide.frontdoor.server",
           "lowtide.coordinator.server", "lowtide.scanner.server")
FRAME = struct.Struct(">I")
# Not ``-m``: runpy would run this module a second time as __main__, next to the package's copy.
SERVER_CODE = "from lowtide.localcluster.forkserver import main; main()"


def fork_requested() -> bool:
    return os.environ.get(FORK_ENV, "") not in ("", "0", "false", "no")


def service_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``-m lowtide.cli.main`` when ``argv`` runs it with this interpreter, else
    None (anything else is started with Popen)."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] == MAIN_MODULE:
        return list(argv[3:])
    return None


def _read_frame(stream: BinaryIO) -> dict | None:
    head = stream.read(FRAME.size)
    if len(head) < FRAME.size:
        return None
    (size,) = FRAME.unpack(head)
    body = stream.read(size)
    if len(body) < size:
        return None
    return json.loads(body)


def _write_frame(stream: BinaryIO, message: dict) -> None:
    body = json.dumps(message).encode()
    stream.write(FRAME.pack(len(body)) + body)
    stream.flush()


class ForkServer:
    """The client side: starts the server on first use and asks it for services.

    Thread-safety: ``spawn`` may be called from any thread (one request at a time on the pipe).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _server(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-c", SERVER_CODE], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, start_new_session=True)
        return self._proc

    def spawn(self, args: Sequence[str], *, env: dict[str, str], cwd: Path | str, log: Path | str) -> int:
        """Fork a service running ``python -m lowtide.cli.main *args``; its pid."""
        with self._lock:
            proc = self._server()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _write_frame(proc.stdin, {"argv": list(args), "env": env, "cwd": str(cwd), "log": str(log)})
                reply = _read_frame(proc.stdout)
            except OSError as exc:
                reply = {"error": f"the fork server is gone: {exc}"}
            if reply is None:
                reply = {"error": f"the fork server exited (code {proc.wait()})"}
        if "error" in reply:
            raise OSError(errno.ECHILD, f"cannot start {' '.join(args[:2])}: {reply['error']}")
        return int(reply["pid"])


_SHARED: ForkServer | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> ForkServer:
    """This process's fork server (started on first use, gone when this process is)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ForkServer()
        return _SHARED


# ---- the server -----------------------------------------------------------------------------------
def _reap(*_: object) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _become_service(request: dict, replies: BinaryIO, requests: BinaryIO) -> None:
    """In the forked child: become ``python -m lowtide.cli.main ARGV``; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        requests.close()
        replies.close()
        log_fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null_fd)
        # Unbuffered, as PYTHONUNBUFFERED makes a new interpreter's: logs reach the file as they happen.
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = [sys.executable, "-m", MAIN_MODULE, *request["argv"]]
        import setproctitle

        setproctitle.setproctitle(" ".join(argv))
        sys.argv = [MAIN_MODULE, *request["argv"]]
        # By name, as ``python -m`` finds it: the server launches the CLI (cli imports localcluster,
        # not the other way round); the module is already imported (PRELOAD).
        import importlib

        try:
            code = importlib.import_module(MAIN_MODULE).main(request["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - printed as the interpreter would, then the exit code 1
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import setproctitle

    # Claims the argv and environment area for titles now: once a child has cleared its environment
    # there is no knowing where that area was, and its title would not change.
    setproctitle.setproctitle(setproctitle.getproctitle())
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        request = _read_frame(requests)
        if request is None:
            return
        try:
            pid = os.fork()
        except OSError as exc:
            _write_frame(replies, {"error": f"fork: {exc}"})
            continue
        if pid == 0:
            _become_service(request, replies, requests)
        _write_frame(replies, {"pid": pid})


def main() -> None:
    # Replies go to a duplicate of stdout; stdout itself to stderr, so a stray print cannot corrupt one.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on a foreground `cluster up` is its supervisor's
    serve(sys.stdin.buffer, replies)
