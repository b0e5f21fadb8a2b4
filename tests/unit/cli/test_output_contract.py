"""The CLI's output contract (docs/operations.md#the-cli-output-contract) on every failure path,
and `lowtide --version`.

Each failure must end as ``{"error": {"code", "message"}}`` on stdout in json mode (a non-empty
message, non-zero exit) and as ``error: CODE: message`` on stderr in text mode, including command
lines argparse rejects and a bootstrap server nobody listens on.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import socket

import pytest

from lowtide.cli.main import USAGE_EXIT_CODE, main, requested_output
from lowtide.cli.output import CliError, emit_error


def closed_port_address() -> str:
    """A loopback address nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def json_error(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert len(lines) == 1, f"json mode prints exactly one document, got stdout={captured.out!r}"
    return code, json.loads(lines[0])


def test_version_prints_the_installed_package_version_and_exits_zero(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"lowtide {importlib.metadata.version('lowtide')}"


@pytest.mark.parametrize("argv", [
    ["topics", "list", "--output", "json"],                                        # required flag missing
    ["produce", "--bootstrap-server", "h:1", "--topic", "t", "--num-records", "x", "--output", "json"],
    ["topics", "frobnicate", "--output", "json"],                                  # unknown action
    ["topics", "list", "--bootstrap-server", "h:1", "--bogus", "--output=json"],   # unknown flag, = form
    ["consume", "--bootstrap-server", "h:1", "--topic", "t", "--out", "json", "--partition"],  # prefix, no value
])
def test_a_rejected_command_line_in_json_mode_is_a_json_error_on_stdout(capsys, argv):
    code, doc = json_error(capsys, argv)
    assert code == USAGE_EXIT_CODE
    assert doc["error"]["code"] == "INVALID_REQUEST"
    assert doc["error"]["message"].strip()


def test_a_rejected_command_line_in_text_mode_prints_usage_and_the_error_on_stderr(capsys):
    code = main(["topics", "list"])
    captured = capsys.readouterr()
    assert code == USAGE_EXIT_CODE and captured.out == ""
    assert captured.err.startswith("usage: lowtide topics list")
    assert "error: INVALID_REQUEST: lowtide topics list: the following arguments are required: " \
           "--bootstrap-server" in captured.err


def test_the_output_format_is_read_from_a_command_line_that_does_not_parse():
    assert requested_output(["x", "--output", "json"]) == "json"
    assert requested_output(["x", "--output=json"]) == "json"
    assert requested_output(["x", "--outp", "json"]) == "json"
    assert requested_output(["x", "--output", "yaml"]) == "text"
    assert requested_output(["x", "--offset", "json"]) == "text"  # another flag, not an --output prefix
    assert requested_output(["x", "--output"]) == "text"


@pytest.mark.parametrize("argv", [
    ["topics", "list"], ["topics", "describe", "--topic", "t"], ["produce", "--topic", "t", "--num-records", "1"],
    ["consume", "--topic", "t"], ["offsets", "--topic", "t"], ["groups", "list"], ["acls", "list"],
    ["retention", "run", "--topic", "t"],
])
def test_an_unreachable_bootstrap_server_is_a_json_error_naming_its_address(capsys, argv):
    address = closed_port_address()
    code, doc = json_error(capsys, [*argv, "--bootstrap-server", address, "--output", "json"])
    assert code == 1
    assert doc["error"]["code"] == "NETWORK_EXCEPTION"
    assert address in doc["error"]["message"]


def test_a_malformed_bootstrap_address_is_a_json_error(capsys):
    code, doc = json_error(capsys, ["topics", "list", "--bootstrap-server", "nohost", "--output", "json"])
    assert (code, doc["error"]["code"]) == (1, "INVALID_REQUEST") and "nohost" in doc["error"]["message"]


@pytest.mark.parametrize("output", ["json", "text"])
def test_an_error_with_an_empty_message_still_carries_one(capsys, output):
    assert emit_error(argparse.Namespace(output=output), CliError("REQUEST_TIMED_OUT", "  ")) == 1
    captured = capsys.readouterr()
    if output == "json":
        assert json.loads(captured.out)["error"]["message"] == "REQUEST_TIMED_OUT (no details were given)"
    else:
        assert captured.err == "error: REQUEST_TIMED_OUT: REQUEST_TIMED_OUT (no details were given)\n"


def test_a_cluster_command_on_a_missing_cluster_is_a_json_error(capsys, tmp_path):
    code, doc = json_error(capsys, ["cluster", "status", "--data-dir", str(tmp_path / "none"), "--output", "json"])
    assert code == 1 and doc["error"]["code"] == "CLUSTER_NOT_FOUND" and doc["error"]["message"]
