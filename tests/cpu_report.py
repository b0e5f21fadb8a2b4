"""Opt-in: CPU seconds per test module, to find what makes ``make test`` slow on 2 cores.

``LOWTIDE_TEST_CPU_OUT=DIR make test`` writes ``DIR/<worker>.json``: for every module, its wall
seconds, the CPU seconds of the pytest process itself and those of every process it started
meanwhile. As root on a machine with cgroup v1's cpuacct controller, each worker moves into a cgroup
of its own, so every descendant counts, JVMs that outlive their parent and the worker's shared
cluster (its CPU while a module runs goes to that module) included. Elsewhere only the children the
worker reaped count (``RUSAGE_CHILDREN``). A module-scoped fixture's teardown runs in its last
test's teardown, so it is counted. ``python -m tests.cpu_report DIR`` prints the modules by CPU."""

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


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _join_own_cgroup(name: str) -> Path | None:
    """A fresh cpuacct cgroup holding this process (and so its descendants), or None."""
    try:
        group = CPUACCT / f"lowtide-tests-{name}-{os.getpid()}"
        group.mkdir()
        (group / "cgroup.procs").write_text(str(os.getpid()))
        return group
    except OSError:
        return None


class CpuClock:
    """(this process's CPU s, its descendants' CPU s), from the cgroup when there is one."""

    def __init__(self, group: Path | None) -> None:
        self.group = group

    def read(self) -> tuple[float, float]:
        me = resource.getrusage(resource.RUSAGE_SELF)
        mine = me.ru_utime + me.ru_stime
        if self.group is not None:
            return mine, int((self.group / "cpuacct.usage").read_text()) / 1e9 - mine
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return mine, kids.ru_utime + kids.ru_stime


class CpuReport:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.clock = CpuClock(_join_own_cgroup(os.environ.get("PYTEST_XDIST_WORKER", "main")))
        self.modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        wall0, (self0, kids0) = time.monotonic(), self.clock.read()
        yield
        wall1, (self1, kids1) = time.monotonic(), self.clock.read()
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
        if self.clock.group is not None:  # leave it and remove it (best effort: a straggler keeps it)
            try:
                (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
                self.clock.group.rmdir()
            except OSError:
                pass


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
