"""Shared by the CLI tests: run a command in JSON mode, and a front door with one stub replica."""

from __future__ import annotations

import json

import pytest

from lowtide.cli.main import main
from tests.unit.frontdoor.harness import register_broker


def run_json(capsys, *argv: str) -> tuple[int, list[dict]]:
    """Exit code and the JSON documents (one per line) ``lowtide ARGV --output json`` printed."""
    code = main([*argv, "--output", "json"])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture
def cluster(front_door, stub_replicas, store):
    """(front door address, stub replica) with the replica registered as broker 0."""
    replica, address = stub_replicas()
    register_broker(store, 0, address)
    return front_door.address, replica
