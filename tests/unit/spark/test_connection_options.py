"""The data source's connection options: bootstrap, token and TLS, as Spark passes them."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from lowtide.errors import InvalidConfig
from lowtide.spark.jobs import _options
from lowtide.spark.options import parse_connection
from lowtide.tls.config import ClientTls


def test_tls_options_make_a_client_tls_that_travels_to_executors():
    connection = parse_connection({"bootstrap.servers": "fd:9090", "lowtide.ssl.ca.location": "/tls/ca.crt",
                                   "lowtide.ssl.certificate.location": "/tls/c.crt",
                                   "lowtide.ssl.key.location": "/tls/c.key"})
    assert connection.tls == ClientTls(ca=Path("/tls/ca.crt"), cert=Path("/tls/c.crt"), key=Path("/tls/c.key"))
    assert pickle.loads(pickle.dumps(connection)) == connection


def test_without_tls_options_the_connection_is_plaintext():
    assert parse_connection({"bootstrap.servers": "fd:9090"}).tls is None


def test_the_command_config_file_supplies_the_token_and_the_tls_settings(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("lowtide.auth.token=t0k\nsecurity.protocol=SSL\nssl.ca.location=/tls/ca.crt\n")
    connection = parse_connection({"kafka.bootstrap.servers": "fd:9090", "lowtide.command.config": str(config)})
    assert connection.token == "t0k" and connection.tls == ClientTls(ca=Path("/tls/ca.crt"))


def test_an_explicit_option_overrides_the_command_config(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("ssl.ca.location=/old/ca.crt\n")
    connection = parse_connection({"bootstrap.servers": "fd:9090", "lowtide.command.config": str(config),
                                   "lowtide.ssl.ca.location": "/new/ca.crt"})
    assert connection.tls.ca == Path("/new/ca.crt")


def test_a_certificate_without_its_key_is_an_invalid_config():
    with pytest.raises(InvalidConfig, match="needs its key"):
        parse_connection({"bootstrap.servers": "fd:9090", "lowtide.ssl.certificate.location": "/tls/c.crt"})


def test_the_jobs_pass_the_tls_settings_on_as_data_source_options():
    connection = parse_connection({"bootstrap.servers": "fd:9090", "lowtide.ssl.ca.location": "/tls/ca.crt"})
    options = _options(connection)
    assert options["lowtide.ssl.ca.location"] == "/tls/ca.crt"
    assert parse_connection(options) == connection
