"""`--command-config` properties files and the gRPC metadata they produce."""

from __future__ import annotations

import pytest

from lowtide.auth.client_config import call_metadata, load_command_config, parse_properties
from lowtide.errors import InvalidConfig


def test_properties_accept_equals_colon_comments_and_blank_lines(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text(
        "# kafka-style comment\n! also a comment\n\n"
        "lowtide.auth.token = s3cr3t\n"
        "security.protocol: SASL_PLAINTEXT\n"
        "url=http://host:8080/x=y\n"
        "empty=\n"
    )
    assert load_command_config(path) == {
        "lowtide.auth.token": "s3cr3t",
        "security.protocol": "SASL_PLAINTEXT",
        "url": "http://host:8080/x=y",
        "empty": "",
    }


def test_a_trailing_backslash_continues_the_value_on_the_next_line():
    assert parse_properties("key=first \\\n    second\n") == {"key": "first second"}


def test_a_missing_file_is_an_error_naming_the_path(tmp_path):
    path = tmp_path / "missing.properties"
    with pytest.raises(InvalidConfig, match=f"cannot read command config '{path}'"):
        load_command_config(path)


def test_a_line_without_separator_is_an_error_naming_path_and_line(tmp_path):
    path = tmp_path / "bad.properties"
    path.write_text("a=1\n\njust-a-word\n")
    with pytest.raises(InvalidConfig, match=f"{path}:3: expected 'key=value'"):
        load_command_config(path)


def test_a_line_with_an_empty_key_is_an_error_naming_path_and_line(tmp_path):
    path = tmp_path / "bad.properties"
    path.write_text("=value\n")
    with pytest.raises(InvalidConfig, match=f"{path}:1: empty key"):
        load_command_config(path)


def test_the_token_becomes_a_bearer_authorization_header():
    assert call_metadata({"lowtide.auth.token": "abc"}) == [("authorization", "Bearer abc")]


def test_the_oauthbearer_key_is_an_alias_for_the_token():
    assert call_metadata({"sasl.oauthbearer.token": "abc"}) == [("authorization", "Bearer abc")]


def test_no_token_means_no_metadata():
    assert call_metadata({}) == []
    assert call_metadata(None) == []
    assert call_metadata({"lowtide.auth.token": "  "}) == []
