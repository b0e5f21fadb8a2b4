"""docs/kafka-compatibility.md's table of Kafka APIs is what the listener serves
(``lowtide.kafka.compat_doc``), and the generator keeps the prose around its markers."""

from __future__ import annotations

from pathlib import Path

import pytest

from lowtide.kafka import compat_doc
from lowtide.kafka.broker import Api

PAGE = Path(__file__).resolve().parents[3] / "docs" / "kafka-compatibility.md"


def _noop(call, body):  # pragma: no cover - never called
    return None


def test_committed_table_equals_what_the_code_serves():
    text = PAGE.read_text(encoding="utf-8")
    assert compat_doc.render(text) == text, (
        f"{PAGE.relative_to(PAGE.parents[1])} does not list the Kafka APIs the listener serves; "
        f"run: {compat_doc.COMMAND}")


def test_table_has_a_row_per_served_api_with_its_advertised_range():
    apis = compat_doc.served_apis()
    names = [a.name for a in apis]
    assert "ApiVersions" in names and "DeleteRecords" in names and "Produce" in names
    assert len(names) == len(set(names))
    table = compat_doc.table(apis)
    for api in apis:
        versions = f"{api.min_version}–{api.max_version}" if api.min_version < api.max_version else f"{api.min_version}"
        assert f"| {api.name} | {api.key} | {versions} |" in table


def test_render_replaces_only_between_the_markers():
    apis = [Api(21, "DeleteRecords", 0, 2, _noop), Api(47, "OffsetDelete", 0, 0, _noop)]
    page = f"# Title\n\nprose before\n\n{compat_doc.BEGIN}\n| stale |\n{compat_doc.END}\n\nprose after\n"
    out = compat_doc.render(page, apis)
    assert out.startswith("# Title\n\nprose before\n\n")
    assert out.endswith(f"{compat_doc.END}\n\nprose after\n")
    assert "| stale |" not in out
    assert "| DeleteRecords | 21 | 0–2 |" in out and "| OffsetDelete | 47 | 0 |" in out
    assert compat_doc.render(out, apis) == out  # idempotent


def test_a_page_without_markers_is_refused():
    with pytest.raises(compat_doc.MarkersMissing):
        compat_doc.render("# no markers here\n")


def test_main_check_reports_a_stale_page_with_the_command(tmp_path, capsys):
    page = tmp_path / "compat.md"
    page.write_text(f"intro\n{compat_doc.BEGIN}\n| old |\n{compat_doc.END}\n", encoding="utf-8")
    assert compat_doc.main([str(page), "--check"]) == 1
    assert "make docs" in capsys.readouterr().err
    assert compat_doc.main([str(page)]) == 0
    assert compat_doc.main([str(page), "--check"]) == 0
    assert "| Produce | 0 |" in page.read_text(encoding="utf-8")
