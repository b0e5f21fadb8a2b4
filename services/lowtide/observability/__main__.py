"""``python -m lowtide.observability CHART_DIR`` (``make dashboards``): write the Grafana
dashboards to ``CHART_DIR/dashboards/*.json`` and the alert rules to
``CHART_DIR/rules/lowtide-alerts.yaml``. Both are generated: edit the Python, not the files."""

from __future__ import annotations

import sys
from pathlib import Path

from lowtide.observability.dashboards import write_dashboards
from lowtide.observability.rules import render_rules_yaml

RULES_NAME = "lowtide-alerts.yaml"


def main(argv: list[str]) -> int:
    chart = Path(argv[0] if argv else "charts/lowtide")
    written = write_dashboards(chart / "dashboards")
    rules = chart / "rules" / RULES_NAME
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text(render_rules_yaml())
    for path in [*written, rules]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
