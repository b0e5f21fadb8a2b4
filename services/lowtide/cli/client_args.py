"""Flags and client construction shared by the CLI commands that talk to a cluster.

Every such command takes ``--bootstrap-server HOST:PORT`` (the front door), ``--command-config
FILE`` (Kafka-style properties; ``lowtide.auth.token=...`` becomes the bearer token sent on every
call; ``ssl.ca.location`` / ``ssl.certificate.location`` / ``ssl.key.location`` make every channel
the command opens TLS, verifying servers with that CA: lowtide.tls.config) and ``--output
text|json``. Without TLS keys, ``LOWTIDE_TLS_CA`` etc. still apply.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lowtide.auth.client_config import call_metadata, load_command_config
from lowtide.cli.main import add_output_flag
from lowtide.client import Admin
from lowtide.rpc.channels import validate_address
from lowtide.tls.config import ClientTls, set_default_client_tls


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT", help="front door address")
    parser.add_argument("--command-config", metavar="FILE",
                        help="properties file with client settings, e.g. lowtide.auth.token=...")
    add_output_flag(parser)


def add_cluster_command(subparsers: argparse._SubParsersAction, name: str, *,
                        func: Callable[[argparse.Namespace], int], **parser_options: Any) -> argparse.ArgumentParser:
    """A (sub)command that talks to a cluster: its parser (``parser_options``: ``help``,
    ``description``...), the connection flags first in its help, running ``func``. The caller adds
    the command's own flags to what it returns."""
    parser = subparsers.add_parser(name, **parser_options)
    add_connection_flags(parser)
    parser.set_defaults(func=func)
    return parser


def read_call_metadata(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The gRPC metadata (bearer token) from ``--command-config``; [] without one. Its TLS keys
    become the process's default TLS (a CLI process talks to one cluster)."""
    path = getattr(args, "command_config", None)
    if not path:
        return []
    config = load_command_config(path)
    tls = ClientTls.from_properties(config)
    if tls is not None:
        set_default_client_tls(tls)
    return call_metadata(config)


def build_admin(args: argparse.Namespace, *, timeout_s: float = 30.0) -> Admin:
    return Admin(validate_address(args.bootstrap_server), metadata=read_call_metadata(args), timeout_s=timeout_s)
