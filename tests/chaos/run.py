"""Randomized fault injection against a local 3-replica cluster, checked against its history.

    python -m tests.chaos.run --minutes 30 --seed 7 --out tests/chaos/RESULTS.md
    python -m tests.chaos.run --diskless --minutes 30 --out tests/chaos/RESULTS.md

Starts a cluster (3 s session timeout, 3 s ISR lag limit), creates an RF 3 topic with
min.insync.replicas=2, runs the workload (acks=all producers, a DeleteRecords caller, readers) and a
random nemesis (kill -9 / SIGSTOP of replicas, the leader especially, redis-server restarts) for the
given time, heals everything, reads every partition in full from its leader and runs the checker.
Prints a summary table, appends it to ``--out`` (date, seed, duration, commit) and exits 1 on any
violation, 2 when the harness itself failed.

``--diskless`` runs the same workload and checker on a diskless topic (issue 13): produce answered
once the WAL file is committed by its coordinator shard, DeleteRecords and ListOffsets answered by
the shard, fetch through whichever replica Metadata names. The nemesis then also kills -9 and
SIGSTOPs the two coordinator shards, and its leader faults aim at the leaders of the shards'
metadata log partitions (``__diskless_metadata``), where the shards' whole state lives. Last, each
shard's SQLite tables must equal a rebuild from its metadata log (``shard_state_diverged``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lowtide.coordinator.metadata_log import METADATA_TOPIC
from lowtide.errors import OffsetOutOfRange
from lowtide.localcluster import LocalCluster
from tests.chaos.checker import VIOLATION_KINDS, History, Summary, Violation, check
from tests.chaos.harness import SESSION_TIMEOUT_MS, ChaosEnv, log_tails, start_cluster, wait_until
from tests.chaos.nemesis import DISKLESS_FAULT_KINDS, FAULT_KINDS, Nemesis, RandomNemesis
from tests.chaos.workload import Workload
from tests.integration.coordinator.dc import metadata_log, rebuilt_state, served_state

TOPIC = "chaos"
DISKLESS_TOPIC = "chaos-diskless"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class RunResult:
    seed: int
    minutes: float
    started_at: str
    elapsed_s: float
    commit: str
    faults: dict[str, int]
    summary: Summary
    violations: list[Violation]
    harness_errors: list[str] = field(default_factory=list)
    fault_log: list[str] = field(default_factory=list)
    diskless: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations and not self.harness_errors

    def table(self) -> str:
        s = self.summary
        rows = [("date", self.started_at), ("seed", str(self.seed)),
                ("duration", f"{self.minutes:g} min of faults, {self.elapsed_s:.0f} s in all"),
                ("commit", self.commit), ("topic", "diskless" if self.diskless else "classic (RF 3)")]
        rows += [(f"faults: {k}", str(self.faults.get(k, 0)))
                 for k in (DISKLESS_FAULT_KINDS if self.diskless else FAULT_KINDS)]
        rows += [("records acknowledged", f"{s.records_acked} ({s.produces_acked} acks=all batches)"),
                 ("deletes acknowledged", f"{s.deletes_acked} of {s.deletes_attempted} attempted"),
                 ("reads", f"{s.reads} ({s.records_read} records served)"),
                 ("final read", f"{s.final_records} records"),
                 ("client errors", ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "none")]
        kinds = (*VIOLATION_KINDS, SHARD_STATE_DIVERGED) if self.diskless else VIOLATION_KINDS
        rows += [(f"violations: {k}", str(s.violations.get(k, 0))) for k in kinds]
        rows.append(("result", "PASS" if self.ok else ("FAIL" if self.violations else "HARNESS ERROR")))
        out = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
        if self.violations:
            out += ["", "Violations (first 20):", ""] + [f"- {v}" for v in self.violations[:20]]
        if self.harness_errors:
            out += ["", "Harness errors:", ""] + [f"- {e}" for e in self.harness_errors]
        return "\n".join(out)


def git_commit() -> str:
    # Read-only: GIT_OPTIONAL_LOCKS=0 keeps `git status` from refreshing the index.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10, env=env).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, env=env).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (+ uncommitted changes)" if dirty else "")


def _settle(env: ChaosEnv, partitions: int, replicas: int, say: Callable[[str], None], *,
            diskless: bool = False) -> None:
    """After healing: every replica live, every partition led with the full ISR (for a diskless
    topic: its shards' metadata log partitions, and every partition answering ListOffsets)."""
    replicated = [(METADATA_TOPIC, k) for k in range(len(env.cluster.services("coordinator")))] if diskless \
        else [(TOPIC, p) for p in range(partitions)]
    try:
        wait_until(lambda: len(env.live_brokers()) == replicas, timeout_s=30, what="every replica live")
        for topic, p in replicated:
            wait_until(lambda t=topic, p=p: env.leader(t, p) >= 0 and len(env.state(t, p).isr) == replicas
                       and not env.state(t, p).reassigning, timeout_s=30, what=f"{topic}-{p} led with a full ISR")
        if diskless:
            wait_until(lambda: env.diskless_served(DISKLESS_TOPIC, partitions),
                       timeout_s=60, what=f"every {DISKLESS_TOPIC} partition served by its shard")
    except AssertionError as exc:
        say(f"settle: {exc} (checking anyway)")


SHARD_STATE_DIVERGED = "shard_state_diverged"


def _shard_state_violations(cluster: LocalCluster, work: Path) -> list[Violation]:
    """After healing, each coordinator shard's SQLite tables, row for row, against a state rebuilt
    from its metadata log (from scratch while the log still starts at 0, else from the shard's
    newest snapshot plus the log after it): docs/design/invariants.md#diskless, a shard's state is a
    function of its metadata log, here after a whole run of shard and replica faults. A background step
    (a file hand-over or deletion) may append while the two are read: compared until the tables
    read before and after the rebuild and the rebuild agree."""
    found = []
    work.mkdir(parents=True, exist_ok=True)
    for shard in range(len(cluster.services("coordinator"))):
        log = metadata_log(cluster, shard)
        try:
            truncated = log.read(0).log_start_offset > 0
        except OffsetOutOfRange:  # a snapshot took the log's start past 0
            truncated = True
        finally:
            log.replicas.close()
            log.store.close()
        # The log's HW passes an entry before the shard has applied it (it applies on the
        # append's answer): a rebuild read in that moment holds one entry more than the tables,
        # even when the tables read before and after it agree. Compared until all three agree (a
        # real divergence never goes away), for up to 10 s.
        for _ in range(20):
            served = served_state(cluster, shard, work)
            rebuilt = rebuilt_state(cluster, shard, work, from_snapshot=truncated)
            if served == served_state(cluster, shard, work) == rebuilt:
                break
            time.sleep(0.5)
        if served != rebuilt:
            tables = sorted(t for t in set(served) | set(rebuilt) if served.get(t) != rebuilt.get(t))
            found.append(Violation(SHARD_STATE_DIVERGED, METADATA_TOPIC, shard, -1, -1,
                                   f"coordinator-{shard}'s tables {tables} differ from a rebuild from its "
                                   f"metadata log ({'snapshot + tail' if truncated else 'from offset 0'})"))
    return found


def run_chaos(*, minutes: float, seed: int, data_dir: Path | None = None, partitions: int = 3,
              say: Callable[[str], None] = print, keep_data: bool = False, diskless: bool = False) -> RunResult:
    started_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    t0 = time.monotonic()
    own_dir = data_dir is None
    data_dir = Path(data_dir or tempfile.mkdtemp(prefix="lowtide-chaos-"))
    history = History()
    harness_errors: list[str] = []
    clusters: list[LocalCluster] = []
    nemesis: Nemesis | None = None
    violations: list[Violation] = []
    env: ChaosEnv | None = None
    topic = DISKLESS_TOPIC if diskless else TOPIC
    say(f"chaos: seed {seed}, {minutes:g} min, {'diskless' if diskless else 'classic'} topic, cluster in {data_dir}")
    try:
        # Diskless: the coordinators stand by for each other's shards, so a coordinator_pause past
        # the 1.5 s lease is a takeover, and the woken shard a zombie the epoch must fence.
        cluster = start_cluster(data_dir, register=clusters.append, coordinator_standbys=diskless)
        env = ChaosEnv(cluster)
        nemesis = Nemesis(cluster, say=say)
        if diskless:
            env.create_diskless_topic(topic, partitions=partitions)
            # The leader faults aim at the shards' metadata log: their state.
            random_nemesis = RandomNemesis(nemesis, seed=seed, topic=METADATA_TOPIC,
                                           partitions=len(cluster.services("coordinator")),
                                           session_timeout_ms=SESSION_TIMEOUT_MS, kinds=DISKLESS_FAULT_KINDS)
        else:
            env.create_topic(topic, partitions=partitions, rf=3)
            random_nemesis = RandomNemesis(nemesis, seed=seed, topic=topic, partitions=partitions,
                                           session_timeout_ms=SESSION_TIMEOUT_MS)
        workload = Workload(bootstrap=cluster.bootstrap, history=history, topic=topic, partitions=partitions,
                            seed=seed, say=say)
        workload.start()
        stop = threading.Event()
        thread = threading.Thread(target=random_nemesis.run, args=(stop,), name="nemesis", daemon=True)
        time.sleep(2.0)  # some acknowledged records before the first fault
        thread.start()
        stop.wait(minutes * 60)
        stop.set()
        thread.join(60)
        say("chaos: healing")
        nemesis.heal()
        if random_nemesis.error is not None:
            harness_errors.append(f"nemesis: {random_nemesis.error!r}")
        _settle(env, partitions, len(cluster.services("replica")), say, diskless=diskless)
        time.sleep(1.0)  # the workload keeps going on the healed cluster for a moment
        workload.stop()
        workload.join()
        harness_errors += workload.crashes
        say("chaos: final read")
        for p in range(partitions):
            try:
                if diskless:
                    env.final_read_diskless(history, topic, p)
                else:
                    env.final_read(history, topic, p)
            except AssertionError as exc:
                harness_errors.append(str(exc))
        violations = check(history)
        if diskless:
            say("chaos: coordinator shard states against rebuilds from their metadata logs")
            violations += _shard_state_violations(cluster, data_dir / "state-check")
    except Exception as exc:  # noqa: BLE001 - reported as a harness error with the log tails
        harness_errors.append(f"{type(exc).__name__}: {exc}")
        for c in clusters:
            say(log_tails(c))
    finally:
        if env is not None:
            env.close()
        for c in clusters:
            if violations or harness_errors:
                say(log_tails(c, lines=30))
            c.down(timeout_s=10)
        if own_dir and not keep_data and not (violations or harness_errors):
            shutil.rmtree(data_dir, ignore_errors=True)
    result = RunResult(seed=seed, minutes=minutes, started_at=started_at, elapsed_s=time.monotonic() - t0,
                       commit=git_commit(), faults=dict(nemesis.counts()) if nemesis else {},
                       summary=Summary.of(history, violations), violations=violations,
                       harness_errors=harness_errors,
                       fault_log=[f.describe() for f in nemesis.faults] if nemesis else [], diskless=diskless)
    return result


def write_results(result: RunResult, out: Path) -> None:
    header = "" if out.exists() else "# Chaos runs\n\nAppended by `python -m tests.chaos.run` (`make chaos`).\n"
    kind = ", diskless topic" if result.diskless else ""
    section = f"\n## {result.started_at} — seed {result.seed}, {result.minutes:g} min{kind}\n\n{result.table()}\n"
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(header + section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to inject faults")
    parser.add_argument("--seed", type=int, default=None, help="nemesis/workload seed (default: random)")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to append the summary to")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=None, help="cluster directory (default: a temp dir)")
    parser.add_argument("--keep-data", action="store_true", help="keep the cluster directory after a pass")
    parser.add_argument("--diskless", action="store_true",
                        help="a diskless topic, with coordinator shard faults besides the replica ones")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    result = run_chaos(minutes=args.minutes, seed=seed, data_dir=args.data_dir, partitions=args.partitions,
                       keep_data=args.keep_data, diskless=args.diskless)
    print(result.table())
    if args.out is not None:
        write_results(result, args.out)
        print(f"appended to {args.out}")
    if result.harness_errors:
        return 2
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
