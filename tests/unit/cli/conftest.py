"""Shared by the CLI tests: run a command in JSON mode, and a front door with the real replicas."""

from __future__ import annotations

import json

import pytest

from lowtide.cli.main import main


def run_json(capsys, *argv: str) -> tuple[int, list[dict]]:
    """Exit code and the JSON documents (one per line) ``lowtide ARGV --output json`` printed."""
    code = main([*argv, "--output", "json"])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def cluster(front_door, replica_set):
    """(front door address, the real replicas); a module using it points ``redis_url`` at
    ``replica_set.clean()``, so the front door and ``store`` share the replicas' Redis."""
    return front_door.address, replica_set
