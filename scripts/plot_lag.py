"""Plot the README's picture of LSO, HW, LW and the low-watermark lag around a DeleteRecords and a
stopped follower, from the Prometheus range queries the observability test saved.

    make test PYTEST_ARGS=tests/integration/observability   # writes tests/bench/out/observability/lag.json
    .venv/bin/pip install 'matplotlib>=3.8,<4'              # a one-off tool, not a project dependency
    .venv/bin/python scripts/plot_lag.py                    # writes docs/low-watermark-lag.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    source = ROOT / "tests" / "bench" / "out" / "observability" / "lag.json"
    doc = json.loads(source.read_text())
    series = doc["series"]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5), height_ratios=[2, 1])
    for name, label, style in [("hw", "high watermark", "-"), ("lso", "log start offset (leader)", "-"),
                               ("lw", "low watermark", "--")]:
        xs, ys = zip(*series[name], strict=True) if series[name] else ((), ())
        top.step(xs, ys, style, where="post", label=label)
    top.set_ylabel("offset")
    top.legend(loc="upper left")
    top.set_title(f"Topic '{doc['topic']}' in Prometheus: DeleteRecords, a SIGSTOPped follower, SIGCONT")
    xs, ys = zip(*series["lag"], strict=True) if series["lag"] else ((), ())
    bottom.step(xs, ys, "-", where="post", color="tab:red")
    bottom.fill_between(xs, ys, step="post", alpha=0.2, color="tab:red")
    bottom.set_ylabel("LW lag (records)")
    bottom.set_xlabel("seconds since the topic was created (1 s scrapes)")
    fig.tight_layout()
    out = ROOT / "docs" / "low-watermark-lag.png"
    out.parent.mkdir(exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
