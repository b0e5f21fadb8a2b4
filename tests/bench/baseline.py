"""``run.py --baseline REV``: the same sections, in the same run, on an older checkout, each figure
shown beside its old value (issue 47: "each beside today's value measured in the same run from a
checkout of today's main").

How: ``git worktree add --detach`` of REV under the run's data directory; its generated protobuf
package (``scripts/gen_protos.sh`` of that checkout) and its C extensions (``build_ext --inplace``)
are built there; then ``python -m tests.bench.run --only <the same sections>`` runs in a child with
``PYTHONPATH=<checkout>/services:<this repo>``: this repository's harness, the old checkout's
``lowtide`` (every service process the harness starts inherits that path, so the whole cluster is
the old code). ``LOWTIDE_BENCH_SKIP_KAFKA=1`` spares Apache Kafka's side (the same for both). The
child's ``results.json`` is read back; ``relate`` writes each old value into the matching current
figure (``params["old_main"]``, and the note), which ``report`` draws as a table of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.bench import request_cost
from tests.bench.common import Figure, say

REPO = Path(__file__).resolve().parents[2]


def prepare_checkout(rev: str, where: Path) -> tuple[Path, str]:
    """A worktree of ``rev`` at ``where``, its protobuf package and C extensions built; (path, short sha)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    if not where.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev], check=True,
                       capture_output=True)
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(["bash", "scripts/gen_protos.sh"], cwd=where, env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "build_ext", "--inplace"],
                   cwd=where, check=True, capture_output=True)
    return where, sha


def remove_checkout(where: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(where)], capture_output=True)


def run_sections(rev: str, only: list[str], data_dir: Path, *, quick: bool) -> tuple[str, list[dict]]:
    """Run ``only`` on ``rev``'s code in a child; (short sha, its figures as results.json has them)."""
    checkout, sha = prepare_checkout(rev, data_dir / "baseline-src")
    out = data_dir / "baseline-out"
    argv = [sys.executable, "-m", "tests.bench.run", "--only", ",".join(only), "--out", str(out),
            "--data-dir", str(data_dir / "baseline-data"), *(["--quick"] if quick else [])]
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'services'}:{REPO}", request_cost.SKIP_KAFKA_ENV: "1"}
    say(f"baseline: the same sections on {rev} ({sha}), in {checkout}")
    try:
        subprocess.run(argv, cwd=REPO, env=env, check=True)
        return sha, json.loads((out / "results.json").read_text())["figures"]
    finally:
        remove_checkout(checkout)


def relate(figures: list[Figure], sha: str, old: list[dict]) -> None:
    """Each current figure that the old run also has gets ``params["old_main"]`` and a note; the
    ratio figures of ``request_cost`` (left out of the old run) are computed from the old lowtide
    figure over this run's Kafka figure."""
    old_by_key = {d["key"]: d for d in old if d.get("value") is not None}
    now = {f.key: f for f in figures}
    for ours, (theirs, key, _goal) in request_cost.RATIOS.items():
        if ours in old_by_key and theirs in now and now[theirs].value and key not in old_by_key:
            old_by_key[key] = {"key": key, "value": old_by_key[ours]["value"] / now[theirs].value}
    for f in figures:
        was = old_by_key.get(f.key)
        if was is None or f.value is None:
            continue
        # A copy: figures of one section often share one params dict.
        f.params = {**f.params, "old_main": {"rev": sha, "value": was["value"]}}
        text = f"old main {sha}, same run: {was['value']:.3g} {f.unit}"
        f.note = f"{text}; {f.note}" if f.note else text
