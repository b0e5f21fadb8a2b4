"""Opt-in: CPU seconds per test module, to find what makes ``make test`` slow on 2 cores.

``LOWTIDE_TEST_CPU_OUT=DIR make test`` writes ``DIR/<worker>.json``: for every module, its wall
seconds and the CPU seconds of the pytest process itself and of the children it reaped meanwhile
(``RUSAGE_CHILDREN``: the services, JVMs and tools the module's tests and fixtures started and
stopped; a module-scoped fixture's teardown runs in its last test's teardown, so it is counted).
A child still running when the module ends (the worker's shared cluster) is not counted.
``python -m tests.cpu_report DIR`` prints the modules by CPU, most first."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUT_ENV = "LOWTIDE_TEST_CPU_OUT"


def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


class CpuReport:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        wall0, (self0, kids0) = time.monotonic(), _cpu()
        yield
        wall1, (self1, kids1) = time.monotonic(), _cpu()
        row = self.modules[item.nodeid.split("::", 1)[0]]
        row[0] += wall1 - wall0
        row[1] += self1 - self0
        row[2] += kids1 - kids0

    def pytest_sessionfinish(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (self.out / f"{worker}.json").write_text(json.dumps(
            {m: {"wall_s": w, "self_cpu_s": s, "children_cpu_s": c} for m, (w, s, c) in self.modules.items()},
            indent=1))


def register(config: pytest.Config) -> None:
    out = os.environ.get(OUT_ENV)
    if out:
        config.pluginmanager.register(CpuReport(Path(out)), "lowtide-cpu-report")


def main(directory: str) -> None:
    rows = []
    for path in Path(directory).glob("*.json"):
        for module, r in json.loads(path.read_text()).items():
            rows.append((r["self_cpu_s"] + r["children_cpu_s"], r["wall_s"], r["self_cpu_s"], module, path.stem))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"{'cpu_s':>7} {'wall_s':>7} {'self_s':>7}  worker  module   (total CPU {total:.0f} s)")
    for cpu, wall, me, module, worker in rows:
        print(f"{cpu:7.1f} {wall:7.1f} {me:7.1f}  {worker:6}  {module}")


if __name__ == "__main__":
    main(sys.argv[1])
