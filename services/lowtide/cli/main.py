"""Entry point of the `lowtide` command: registers each command group's module.

Every failure ends in the output contract of ``lowtide.cli.output``
(docs/operations.md#the-cli-output-contract), usage errors included: argparse's own "print usage,
exit 2" would put plain text where a json caller expects ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import grpc

from lowtide.cli.output import CliError, emit_error
from lowtide.common.procs import MissingToolError
from lowtide.errors import LowtideError
from lowtide.localcluster import ClusterError
from lowtide.rpc.status import error_from_rpc

# Each module exposes register(subparsers) and sets args.func(args) -> int exit code.
COMMAND_MODULES = [
    "lowtide.cli.cluster_cmd",
    "lowtide.cli.serve_cmd",
    "lowtide.cli.topics_cmd",
    "lowtide.cli.reassign_cmd",
    "lowtide.cli.data_cmd",
    "lowtide.cli.delete_records_cmd",
    "lowtide.cli.acls_cmd",
    "lowtide.cli.scram_cmd",
    "lowtide.cli.groups_cmd",
    "lowtide.cli.retention_cmd",
    "lowtide.cli.orphans_cmd",
    "lowtide.cli.demo_cmd",
]
# argparse's convention for a bad command line, kept so scripts can tell it from a failed request.
USAGE_EXIT_CODE = 2


class UsageError(CliError):
    """A command line argparse rejected; ``usage`` is the synopsis of the (sub)command."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__("INVALID_REQUEST", message, exit_code=USAGE_EXIT_CODE)
        self.usage = usage


class CliArgumentParser(argparse.ArgumentParser):
    """Raises UsageError instead of printing and exiting, so main() reports it in the chosen format.

    Sub-parsers inherit the class (argparse creates them with ``type(parent)``).
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}", self.format_usage())


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", choices=["text", "json"], default="text", help="output format")


def package_version() -> str:
    try:
        return importlib.metadata.version("lowtide")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (package metadata not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = CliArgumentParser(prog="lowtide", description="lowtide: logs that delete data correctly")
    parser.add_argument("--version", action="version", version=f"lowtide {package_version()}")
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


def requested_output(argv: Sequence[str]) -> str:
    """The ``--output`` a command line asks for, read without parsing it (parsing may be what failed).

    Accepts ``--output json``, ``--output=json`` and argparse's unambiguous prefixes (``--out json``).
    """
    chosen = "text"
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if len(name) >= 4 and "--output".startswith(name):
            if not sep:
                value = argv[i + 1] if i + 1 < len(argv) else ""
            if value in ("text", "json"):
                chosen = value
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as err:
        args = argparse.Namespace(output=requested_output(argv))
        if args.output == "text":
            sys.stderr.write(err.usage)
        return emit_error(args, err)
    except SystemExit as exc:  # --help and --version: argparse printed them; 0 is success
        return exc.code if isinstance(exc.code, int) else 0
    try:
        return int(args.func(args) or 0)
    except CliError as err:
        return emit_error(args, err)
    except LowtideError as err:
        return emit_error(args, CliError.from_lowtide(err))
    except grpc.RpcError as err:  # a command that called a stub directly: the same table as clients
        return emit_error(args, CliError.from_lowtide(error_from_rpc(err)))
    except ClusterError as err:  # cluster commands and the demo: their own Kafka-style code names
        return emit_error(args, CliError(err.code, err.message))
    except MissingToolError as err:
        return emit_error(args, CliError("MISSING_TOOL", str(err)))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: keep the traceback for the report, and the contract for callers
        traceback.print_exc(file=sys.stderr)
        return emit_error(args, CliError("UNKNOWN_SERVER_ERROR", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    sys.exit(main())
