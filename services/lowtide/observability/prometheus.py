"""A real Prometheus (Debian's ``prometheus`` package) for a local cluster, and a small client of
its HTTP API.

``lowtide cluster up --with-prometheus`` writes ``DIR/prometheus/prometheus.yml`` scraping every
service of the cluster (job ``lowtide-<kind>``, label ``service=<name>``) and
``DIR/prometheus/lowtide-alerts.yaml`` (``rules.render_rules_yaml``), then starts::

    prometheus --config.file=DIR/prometheus/prometheus.yml --storage.tsdb.path=DIR/prometheus/data
               --web.listen-address=127.0.0.1:PORT --web.enable-lifecycle

in its own session (it outlives a detached ``cluster up``), and waits for ``/-/ready``.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lowtide.common.procs import require_tool
from lowtide.observability.rules import render_rules_yaml

CONFIG_FILE = "prometheus.yml"
RULES_FILE = "lowtide-alerts.yaml"


class PrometheusError(RuntimeError):
    """Prometheus did not start or its API answered an error; the message says which."""


@dataclass(frozen=True)
class ScrapeTarget:
    job: str  # e.g. lowtide-replica
    address: str  # host:port of the /metrics endpoint
    labels: dict[str, str] = field(default_factory=dict)
    # Set (a TLS cluster's CA): /metrics is HTTPS, its certificate verified with this CA.
    ca_file: str = ""
    # With ca_file, for a /metrics that asks for a client certificate (etcd's): Prometheus' own.
    cert_file: str = ""
    key_file: str = ""


def render_config(targets: Sequence[ScrapeTarget], *, scrape_interval: str = "2s",
                  rules_file: str = RULES_FILE) -> dict[str, Any]:
    """prometheus.yml as a dict: one job per kind, a static target per service (over HTTPS when
    the job's targets name a CA, presenting a client certificate when they name one)."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    tls: dict[str, dict[str, Any]] = {}
    for target in targets:
        jobs.setdefault(target.job, []).append({"targets": [target.address], "labels": dict(target.labels)})
        if target.ca_file:
            tls_config = {"ca_file": target.ca_file}
            if target.cert_file:
                tls_config |= {"cert_file": target.cert_file, "key_file": target.key_file}
            tls[target.job] = {"scheme": "https", "tls_config": tls_config}
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                   "scrape_timeout": scrape_interval},
        "rule_files": [rules_file],
        "scrape_configs": [{"job_name": job, **tls.get(job, {}), "static_configs": configs}
                           for job, configs in sorted(jobs.items())],
    }


def write_config(directory: Path, targets: Sequence[ScrapeTarget], *, scrape_interval: str = "2s",
                 rule_for_override: str | None = None) -> Path:
    """Write prometheus.yml and the rules file into ``directory``; returns the config's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RULES_FILE).write_text(render_rules_yaml(for_override=rule_for_override))
    config = directory / CONFIG_FILE
    config.write_text(yaml.safe_dump(render_config(targets, scrape_interval=scrape_interval), sort_keys=False))
    return config


def start_prometheus(directory: Path, *, port: int, timeout_s: float = 30.0) -> subprocess.Popen:
    """Start Prometheus on the config already in ``directory``; wait until it is ready."""
    exe = require_tool("prometheus", "install it with 'apt-get install prometheus' (make setup does this)")
    log = open(directory / "prometheus.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        [exe, f"--config.file={directory / CONFIG_FILE}", f"--storage.tsdb.path={directory / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, cwd=directory)
    api = PrometheusApi(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout_s
    while not api.is_ready():
        if proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with {proc.returncode}; see {directory / 'prometheus.log'}")
        if time.monotonic() > deadline:
            proc.kill()
            raise PrometheusError(f"prometheus not ready after {timeout_s}s; see {directory / 'prometheus.log'}")
        time.sleep(0.1)
    return proc


class PrometheusApi:
    """The parts of Prometheus' HTTP API (``/api/v1``) lowtide's tools and tests use. Thread-safe."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1.0) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=self.timeout_s) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace")
            try:
                doc = json.loads(body)
            except ValueError:
                raise PrometheusError(f"GET {path}: HTTP {exc.code}: {body[:300]}") from None
        if doc.get("status") != "success":
            raise PrometheusError(f"GET {path} {params}: {doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def query(self, expr: str, *, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; raises PrometheusError (``bad_data``) when ``expr`` does not parse."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        return self._get("/api/v1/query", params)["result"]

    def query_range(self, expr: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]

    def alerts(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/alerts")["alerts"]

    def rule_groups(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/rules")["groups"]

    def targets(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/targets")["activeTargets"]
