"""Writing the results: ``results.json`` (machine-readable) and ``RESULTS.md`` (the readable table)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from tests.bench.common import Figure, placeholder

# §11 targets of features that are not built yet: shown in the table with value null.
PLACEHOLDERS = [
    ("dc_commitfile_batches_s", "DC CommitFile throughput per shard", "batches/s", ">= 20,000 batches/s per shard",
     "diskless coordinator, KIP-1164"),
    ("dc_commitfile_p99_ms", "DC CommitFile p99, 100-batch file", "ms", "p99 <= 20 ms",
     "diskless coordinator, KIP-1164"),
    ("dc_findbatches_p99_ms", "DC FindBatches p99", "ms", "p99 <= 5 ms", "diskless coordinator, KIP-1164"),
    ("orphan_scan_s", "orphan scan of 100,000 objects (local store)", "s", "<= 10 s", "orphan scanner, KIP-1164"),
]


def placeholders(present: set[str]) -> list[Figure]:
    return [placeholder(k, n, u, t, i) for k, n, u, t, i in PLACEHOLDERS if k not in present]


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 100:
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return f"{text} {unit}".strip()


def _ratio(fig: Figure) -> str:
    if fig.ratio is None:
        return "—"
    want = f" (target ≥ {fig.ratio_target:g}×)" if fig.ratio_target is not None else ""
    return f"{fig.ratio:.2f}× {fig.ratio_of}{want}"


STATUS = {"pass": "✅ pass", "falls short": "❌ falls short", "not built yet": "⏳ not built yet",
          "error": "⚠️ error", "info": ""}


def write_results(out_dir: Path, machine: dict[str, Any], figures: list[Figure], *, elapsed_s: float,
                  argv: list[str]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"machine": machine, "elapsed_s": elapsed_s, "argv": argv, "figures": [f.to_json() for f in figures]}
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(_clean(doc), indent=2, default=str, allow_nan=False) + "\n")
    md_path = out_dir / "RESULTS.md"
    md_path.write_text(render_markdown(machine, figures, elapsed_s=elapsed_s, argv=argv))
    return json_path, md_path


def _clean(doc: Any) -> Any:
    """NaN/inf become null so results.json is strict JSON."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {str(k): _clean(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_clean(v) for v in doc]
    return doc


def _beside_old_main(figures: list[Figure]) -> list[str]:
    """``run.py --baseline REV``: every figure the old checkout also measured, old and new side by side."""
    rows = [f for f in figures if "old_main" in f.params]
    if not rows:
        return []
    rev = rows[0].params["old_main"]["rev"]
    lines = ["", f"## Beside the old main ({rev}, measured in this run)", "",
             f"| figure | now | old main {rev} | now / old | target | status |", "|---|---|---|---|---|---|"]
    for f in sorted(rows, key=lambda f: f.target is None):
        old = f.params["old_main"]["value"]
        change = f"{f.value / old:.2f}×" if old else "—"
        lines.append(f"| {f.name} | {_fmt(f.value, f.unit)} | {_fmt(old, f.unit)} | {change} | {f.target or '—'} | "
                     f"{STATUS.get(f.status, f.status)} |")
    return lines


def render_markdown(machine: dict[str, Any], figures: list[Figure], *, elapsed_s: float, argv: list[str]) -> str:
    targeted = [f for f in figures if f.target is not None]
    passed = sum(1 for f in targeted if f.status == "pass")
    short = sum(1 for f in targeted if f.status == "falls short")
    lines = [
        "# lowtide benchmark results",
        "",
        f"`python -m tests.bench.run {' '.join(argv)}`".replace("  ", " "),
        f"— mode **{machine['mode']}**, {machine['date']}, commit `{machine['git_commit']}`, "
        f"{elapsed_s:.0f} s wall clock.",
        "",
        f"Targets (docs/testing.md#targets): **{passed} pass, {short} fall short**, "
        f"{sum(1 for f in targeted if f.status == 'not built yet')} not built yet, "
        f"{sum(1 for f in targeted if f.status == 'error')} errors.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {machine['cpu']} |",
        f"| cores | {machine['cores']} |",
        f"| RAM | {machine['ram_gib']} GiB |",
        f"| disk (cluster data dir) | {machine['disk']} |",
        f"| kernel | {machine['kernel']} |",
        f"| Python | {machine['python']} |",
        "",
        "Every service is a separate process on this machine, and so are the load generators: on few "
        "cores they compete for CPU, so throughput figures are a floor for the servers, not a ceiling.",
        "",
        "## Targets",
        "",
        "| figure | value | target | status | ratio to physical reference |",
        "|---|---|---|---|---|",
    ]
    for f in targeted:
        value = _fmt(f.value, f.unit) if f.value is not None else (f.note or "—")
        lines.append(f"| {f.name} | {value} | {f.target} | {STATUS.get(f.status, f.status)} | {_ratio(f)} |")
    lines += _beside_old_main(figures)
    lines += ["", "## All figures", "", "| figure | value | ratio | note |", "|---|---|---|---|"]
    for f in figures:
        note = f.note
        if f.status == "error":
            note = note or "error"
        lines.append(f"| {f.name} | {_fmt(f.value, f.unit)} | {_ratio(f)} | {note.replace('|', '/')} |")
    lines += ["", "## How each figure is measured", "",
              "See the module docstrings in `tests/bench/` (physical.py, ceiling.py, produce.py, delete.py, "
              "soak.py). Parameters of every figure (counts, batch sizes, processes, raw percentiles) are in "
              "`results.json`. All figures are real gRPC on loopback to real processes started by "
              "`lowtide.localcluster`, except the transport ceiling: the same produce load over plain TCP "
              "sockets between three plain-Python processes; latencies are percentiles of raw per-call "
              "samples taken after a warm-up. CPU figures are utime + stime from `/proc/PID/stat` over "
              "the measured window, per MiB acknowledged.",
              ""]
    return "\n".join(lines)
