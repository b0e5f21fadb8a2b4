"""The chart's dashboards and rules are what lowtide.observability generates, and Prometheus'
own checker accepts the rules and a generated configuration."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lowtide.observability import __main__ as generate
from lowtide.observability.dashboards import DASHBOARDS, build_dashboard, iter_exprs, render_dashboards
from lowtide.observability.prometheus import ScrapeTarget, write_config
from lowtide.observability.rules import ALERTS, render_rules_yaml

CHART = Path(__file__).resolve().parents[3] / "charts" / "lowtide"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (apt-get install prometheus; `make setup` does it)")
    return path


def test_the_committed_dashboards_are_the_generated_ones() -> None:
    for name, text in render_dashboards().items():
        assert (CHART / "dashboards" / name).read_text() == text, f"run `make dashboards`: {name} is stale"
    assert sorted(p.name for p in (CHART / "dashboards").glob("*.json")) == sorted(render_dashboards())


def test_the_committed_rules_are_the_generated_ones() -> None:
    assert (CHART / "rules" / generate.RULES_NAME).read_text() == render_rules_yaml(), "run `make dashboards`"


def test_every_panel_has_a_target_and_every_target_an_expression() -> None:
    for spec in DASHBOARDS:
        built = build_dashboard(spec)
        assert built["uid"] == spec.uid
        assert {v["name"] for v in built["templating"]["list"]} >= {"namespace", "topic", "partition"}
        exprs = list(iter_exprs(built))
        assert len(exprs) == sum(len(p.targets) for p in spec.panels()) > 0


def test_every_panel_title_is_unique_within_its_dashboard() -> None:
    for spec in DASHBOARDS:
        titles = [p.title for p in spec.panels()]
        assert len(titles) == len(set(titles)), spec.uid


def test_promtool_accepts_the_rules_file() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(CHART / "rules" / generate.RULES_NAME)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(ALERTS)} rules found" in out.stdout


def test_promtool_accepts_a_generated_local_cluster_config(tmp_path: Path) -> None:
    config = write_config(tmp_path, [ScrapeTarget(job="lowtide-replica", address="127.0.0.1:9100",
                                                  labels={"service": "replica-0"}),
                                     ScrapeTarget(job="lowtide-frontdoor", address="127.0.0.1:9101",
                                                  labels={"service": "frontdoor-0"})],
                          rule_for_override="3s")
    out = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr


def test_a_tls_cluster_config_scrapes_etcd_with_a_client_certificate_and_promtool_accepts_it(tmp_path: Path) -> None:
    from lowtide.tls.certs import CertificateAuthority

    ca = CertificateAuthority.create(tmp_path / "tls")
    client = ca.issue("prometheus")
    config = write_config(tmp_path, [
        ScrapeTarget(job="lowtide-etcd", address="127.0.0.1:9102", labels={"service": "etcd-0"},
                     ca_file=str(ca.ca_path), cert_file=str(client.cert), key_file=str(client.key)),
        ScrapeTarget(job="lowtide-replica", address="127.0.0.1:9100", labels={"service": "replica-0"},
                     ca_file=str(ca.ca_path))], rule_for_override="3s")
    text = config.read_text()
    assert f"cert_file: {client.cert}" in text and f"key_file: {client.key}" in text
    assert text.count("cert_file") == 1, "only etcd's /metrics asks for a client certificate"
    out = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_json_round_trips_through_json() -> None:
    for name, text in render_dashboards().items():
        assert json.loads(text)["title"].startswith("lowtide / "), name
