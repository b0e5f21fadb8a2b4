"""`lowtide scram set|list|remove` against an in-process front door on a real Redis: JSON shape,
the password read from a file or stdin (never the command line), typed errors."""

from __future__ import annotations

import io

from lowtide.auth.scram import SCRAM_SHA_256, SCRAM_SHA_512
from lowtide.auth.scram_store import ScramStore, encode_credential
from tests.unit.cli.conftest import run_json


def test_scram_set_from_a_password_file_stores_a_credential_that_list_shows(front_door, capsys, tmp_path, store):
    password = tmp_path / "pw"
    password.write_text("alice-pw\nignored second line\n")
    code, docs = run_json(capsys, "scram", "set", "--bootstrap-server", front_door.address, "--user", "alice",
                          "--password-file", str(password), "--iterations", "4096")
    assert code == 0 and docs == [{"user": "alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096}]
    credential = ScramStore(metadata=store).get(SCRAM_SHA_256, "alice")
    assert credential is not None and credential.iterations == 4096
    assert "alice-pw" not in encode_credential(credential)  # what the store keeps: no password
    code, docs = run_json(capsys, "scram", "list", "--bootstrap-server", front_door.address)
    assert code == 0 and docs == [{"users": [{"user": "alice", "credentials": [
        {"mechanism": "SCRAM-SHA-256", "iterations": 4096}]}]}]


def test_scram_set_reads_the_password_from_stdin_for_sha_512(front_door, capsys, monkeypatch, store):
    monkeypatch.setattr("sys.stdin", io.StringIO("bob-pw\n"))
    code, _ = run_json(capsys, "scram", "set", "--bootstrap-server", front_door.address, "--user", "bob",
                       "--password-stdin", "--mechanism", "scram-sha-512")
    assert code == 0
    assert ScramStore(metadata=store).get(SCRAM_SHA_512, "bob").iterations == 8192


def test_scram_set_needs_a_password_source_and_accepts_none_on_the_command_line(front_door, capsys):
    code, docs = run_json(capsys, "scram", "set", "--bootstrap-server", front_door.address, "--user", "bob")
    assert code == 2 and docs[0]["error"]["code"] == "INVALID_REQUEST"
    code, docs = run_json(capsys, "scram", "set", "--bootstrap-server", front_door.address, "--user", "bob",
                          "--password", "x")
    assert code == 2 and "--password" in docs[0]["error"]["message"]


def test_scram_set_with_too_few_iterations_is_unacceptable_credential(front_door, capsys, tmp_path, store):
    password = tmp_path / "pw"
    password.write_text("pw\n")
    code, docs = run_json(capsys, "scram", "set", "--bootstrap-server", front_door.address, "--user", "alice",
                          "--password-file", str(password), "--iterations", "1000")
    assert code == 1 and docs[0]["error"]["code"] == "UNACCEPTABLE_CREDENTIAL"
    assert ScramStore(metadata=store).describe() == {}


def test_scram_remove_deletes_and_then_reports_resource_not_found(front_door, capsys, tmp_path):
    password = tmp_path / "pw"
    password.write_text("pw\n")
    run_json(capsys, "scram", "set", "--bootstrap-server", front_door.address, "--user", "alice",
             "--password-file", str(password))
    code, docs = run_json(capsys, "scram", "remove", "--bootstrap-server", front_door.address, "--user", "alice")
    assert code == 0 and docs == [{"user": "alice", "mechanism": "SCRAM-SHA-256"}]
    code, docs = run_json(capsys, "scram", "remove", "--bootstrap-server", front_door.address, "--user", "alice")
    assert code == 1 and docs[0]["error"]["code"] == "RESOURCE_NOT_FOUND"
    code, docs = run_json(capsys, "scram", "list", "--bootstrap-server", front_door.address, "--user", "alice")
    assert code == 1 and docs[0]["error"]["code"] == "RESOURCE_NOT_FOUND"
