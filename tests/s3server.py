"""A real S3-compatible server for tests and benchmarks: moto's server mode
(``python -m moto.server``) on a free loopback port, from the test extra (``moto[server]``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lowtide.common.procs import MissingToolError, find_free_port, wait_for_port

MISSING = "moto's S3 server is not installed (pip install 'moto[server]'; the test extra has it)"


def is_available() -> bool:
    return importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None


@contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """Run the server while the block runs; yields its endpoint URL. MissingToolError without moto."""
    if not is_available():
        raise MissingToolError(MISSING)
    port = find_free_port()
    with open(Path(log_dir) / "moto.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port("127.0.0.1", port, timeout_s=30)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
