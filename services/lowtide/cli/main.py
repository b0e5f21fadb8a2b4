"""Entry point of the `lowtide` command: registers each command group's module."""

from __future__ import annotations

import argparse
import importlib
import sys

import grpc

from lowtide.cli.output import CliError, emit_error
from lowtide.errors import LowtideError
from lowtide.rpc.status import error_from_rpc

# Each module exposes register(subparsers) and sets args.func(args) -> int exit code.
COMMAND_MODULES = [
    "lowtide.cli.cluster_cmd",
    "lowtide.cli.serve_cmd",
    "lowtide.cli.topics_cmd",
    "lowtide.cli.data_cmd",
    "lowtide.cli.delete_records_cmd",
    "lowtide.cli.acls_cmd",
    "lowtide.cli.groups_cmd",
    "lowtide.cli.retention_cmd",
    "lowtide.cli.demo_cmd",
]


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", choices=["text", "json"], default="text", help="output format")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lowtide", description="lowtide: logs that delete data correctly")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # command group not built yet
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as err:
        return emit_error(args, err)
    except LowtideError as err:
        return emit_error(args, CliError.from_lowtide(err))
    except grpc.RpcError as err:  # a command that called a stub directly: the same table as clients
        return emit_error(args, CliError.from_lowtide(error_from_rpc(err)))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
