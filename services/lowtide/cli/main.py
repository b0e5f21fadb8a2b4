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
    "lowtide.cli.share_groups_cmd",
    "lowtide.cli.retention_cmd",
    "lowtide.cli.orphans_cmd",
    "lowtide.cli.demo_cmd",
    "lowtide.cli.metadata_cmd",
    "lowtide.cli.strays_cmd",
]
# The top-level commands each module registers. A command line naming one imports only its module:
# the service processes (`lowtide serve ...`) and every CLI call in scripts and tests start without
# importing the Kafka listener, the local-cluster supervisor and the servers of the other commands
# (about half a second of CPU per start). tests/unit/cli/test_main.py keeps this table in step
# with what the modules register.
COMMANDS = {
    "cluster": "lowtide.cli.cluster_cmd",
    "serve": "lowtide.cli.serve_cmd",
    "topics": "lowtide.cli.topics_cmd",
    "reassign": "lowtide.cli.reassign_cmd",
    "drain": "lowtide.cli.reassign_cmd",
    "rebalance": "lowtide.cli.reassign_cmd",
    "produce": "lowtide.cli.data_cmd",
    "consume": "lowtide.cli.data_cmd",
    "offsets": "lowtide.cli.data_cmd",
    "delete-records": "lowtide.cli.delete_records_cmd",
    "acls": "lowtide.cli.acls_cmd",
    "scram": "lowtide.cli.scram_cmd",
    "groups": "lowtide.cli.groups_cmd",
    "share-groups": "lowtide.cli.share_groups_cmd",
    "retention": "lowtide.cli.retention_cmd",
    "orphans": "lowtide.cli.orphans_cmd",
    "metadata": "lowtide.cli.metadata_cmd",
    "strays": "lowtide.cli.strays_cmd",
    "demo": "lowtide.cli.demo_cmd",
}
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


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or (given a command line naming a known command) of that one
    command's module only: see ``COMMANDS``."""
    parser = CliArgumentParser(prog="lowtide", description="lowtide: logs that delete data correctly")
    parser.add_argument("--version", action="version", version=f"lowtide {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    command = next((a for a in argv or () if not a.startswith("-")), None)
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
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
    parser = build_parser(argv)
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
    except MissingToolError as err:
        return emit_error(args, CliError("MISSING_TOOL", str(err)))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        cluster_error = _loaded_cluster_error()
        if cluster_error is not None and isinstance(exc, cluster_error):
            # cluster commands and the demo: their own Kafka-style code names
            return emit_error(args, CliError(exc.code, exc.message))
        # a bug: keep the traceback for the report, and the contract for callers
        traceback.print_exc(file=sys.stderr)
        return emit_error(args, CliError("UNKNOWN_SERVER_ERROR", f"{type(exc).__name__}: {exc}"))


def _loaded_cluster_error() -> type[Exception] | None:
    """``ClusterError`` if the local-cluster supervisor was imported (only then can it be raised)."""
    module = sys.modules.get("lowtide.localcluster.cluster")
    return getattr(module, "ClusterError", None)


if __name__ == "__main__":
    sys.exit(main())
