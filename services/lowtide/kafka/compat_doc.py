"""The table of Kafka APIs and versions the Kafka listener serves, written into the docs.

``python -m lowtide.kafka.compat_doc [PATH]`` (``make docs``) rewrites the part of PATH (default
``docs/kafka-compatibility.md``) between the two marker comments below with the table generated
from the ``Api`` rows the listener is built with (``lowtide.kafka.server.all_apis`` plus the
ApiVersions row ``KafkaBroker`` adds), so the page cannot drift from what ApiVersions advertises.
Prose around the markers is kept. ``--check`` writes nothing and exits 1 when the file differs.

tests/unit/kafka/test_compat_doc.py checks that the committed page equals what this generates.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lowtide.kafka.broker import Api, KafkaBroker
from lowtide.kafka.server import all_apis

BEGIN = "<!-- BEGIN GENERATED: kafka-apis (python -m lowtide.kafka.compat_doc) -->"
END = "<!-- END GENERATED: kafka-apis -->"
DEFAULT_PATH = Path("docs/kafka-compatibility.md")
COMMAND = "make docs  (or: .venv/bin/python -m lowtide.kafka.compat_doc docs/kafka-compatibility.md)"


class MarkersMissing(ValueError):
    """The page lacks the BEGIN/END marker pair (or has them out of order)."""


def served_apis() -> list[Api]:
    """Every API a lowtide Kafka listener answers, by API key: the rows it is built with, and the
    ApiVersions row the broker adds itself."""
    broker = KafkaBroker(services=None, apis=all_apis())  # type: ignore[arg-type]  # rows only
    return sorted(broker.apis.values(), key=lambda a: a.key)


def _versions(api: Api) -> str:
    if api.min_version == api.max_version:
        return str(api.min_version)
    return f"{api.min_version}–{api.max_version}"


def table(apis: list[Api] | None = None) -> str:
    """The Markdown table, one row per API key."""
    rows = ["| API | key | versions served |", "|---|---:|---|"]
    for api in apis if apis is not None else served_apis():
        rows.append(f"| {api.name} | {api.key} | {_versions(api)} |")
    return "\n".join(rows)


def render(text: str, apis: list[Api] | None = None) -> str:
    """``text`` with the block between the markers replaced by the generated table."""
    start = text.find(BEGIN)
    end = text.find(END)
    if start < 0 or end < 0 or end < start:
        raise MarkersMissing(f"the page needs the lines\n{BEGIN}\n{END}\nwhere the table goes")
    head = text[: start + len(BEGIN)]
    return f"{head}\n{table(apis)}\n{text[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lowtide.kafka.compat_doc", description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path, default=DEFAULT_PATH,
                        help=f"the Markdown page holding the markers (default {DEFAULT_PATH})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    old = args.path.read_text(encoding="utf-8")
    try:
        new = render(old)
    except MarkersMissing as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != old:
            print(f"{args.path} is out of date; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if new != old:
        args.path.write_text(new, encoding="utf-8")
        print(f"{args.path}: table of {len(served_apis())} Kafka APIs rewritten")
    else:
        print(f"{args.path}: table of {len(served_apis())} Kafka APIs up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
