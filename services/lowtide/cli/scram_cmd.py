"""`lowtide scram set|list|remove`: SCRAM credentials for SASL/SCRAM logins on the Kafka listeners
(what ``kafka-configs --entity-type users --alter --add-config 'SCRAM-SHA-256=[...]'`` does).

    lowtide scram set    --bootstrap-server B --user alice --password-file F [--mechanism scram-sha-256]
                         [--iterations 8192]               (or --password-stdin)
    lowtide scram list   --bootstrap-server B [--user alice ...]
    lowtide scram remove --bootstrap-server B --user alice [--mechanism scram-sha-256]

Talks to the front door's Admin service (AlterUserScramCredentials / DescribeUserScramCredentials)
with the bearer token from ``--command-config``; the caller needs ALTER (set, remove) or DESCRIBE
(list) on the CLUSTER. The password is salted and hashed here and never leaves this process; it is
read from a file or stdin, never from the command line (which other users can see in ``ps``).

JSON output: set/remove ``{"user", "mechanism", "iterations"?}``; list
``{"users": [{"user", "credentials": [{"mechanism", "iterations"}]}]}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lowtide.auth.scram import DEFAULT_ITERATIONS, MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS
from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import CliError, emit

MECHANISM_CHOICES = [name.lower() for name in MECHANISMS]
DEFAULT_TIMEOUT_MS = 30_000


def register(subparsers: argparse._SubParsersAction) -> None:
    scram = subparsers.add_parser("scram", help="set, list and remove SCRAM credentials (SASL/SCRAM logins)")
    actions = scram.add_subparsers(dest="scram_action", required=True)

    set_parser = add_cluster_command(actions, "set", help="create or replace a user's SCRAM credential", func=run_set)
    _add_timeout_flag(set_parser)
    set_parser.add_argument("--user", required=True, metavar="NAME", help="user name (principal User:NAME)")
    set_parser.add_argument("--mechanism", choices=MECHANISM_CHOICES, default="scram-sha-256")
    set_parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                            help=f"PBKDF2 iterations, {MIN_ITERATIONS}..{MAX_ITERATIONS} "
                                 f"(default {DEFAULT_ITERATIONS})")
    password = set_parser.add_mutually_exclusive_group(required=True)
    password.add_argument("--password-file", metavar="FILE", help="file whose first line is the password")
    password.add_argument("--password-stdin", action="store_true", help="read the password from stdin")

    list_parser = add_cluster_command(actions, "list", func=run_list,
                                      help="list users' SCRAM credentials (all users when no --user)")
    _add_timeout_flag(list_parser)
    list_parser.add_argument("--user", action="append", metavar="NAME", help="user name (repeatable)")

    remove_parser = add_cluster_command(actions, "remove", help="remove a user's SCRAM credential", func=run_remove)
    _add_timeout_flag(remove_parser)
    remove_parser.add_argument("--user", required=True, metavar="NAME", help="user name")
    remove_parser.add_argument("--mechanism", choices=MECHANISM_CHOICES, default="scram-sha-256")


def _add_timeout_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout-ms", type=int, default=DEFAULT_TIMEOUT_MS, help="RPC deadline")


def read_password(args: argparse.Namespace) -> str:
    """The password from --password-file (its first line) or stdin (its first line)."""
    if args.password_file:
        try:
            text = Path(args.password_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError("INVALID_CONFIG", f"cannot read --password-file {args.password_file!r}: {exc}") from None
    else:
        text = sys.stdin.readline()
    password = text.splitlines()[0] if text else ""
    if not password:
        raise CliError("INVALID_REQUEST", "the password is empty")
    return password


def run_set(args: argparse.Namespace) -> int:
    password = read_password(args)
    mechanism = args.mechanism.upper()
    with build_admin(args, timeout_s=args.timeout_ms / 1000.0) as admin:
        error = admin.upsert_user_scram_credential(args.user, password, mechanism=mechanism,
                                                   iterations=args.iterations)
    if error is not None:
        raise CliError.from_lowtide(error)
    emit(args, {"user": args.user, "mechanism": mechanism, "iterations": args.iterations},
         f"Completed updating the {mechanism} credential of user {args.user!r} ({args.iterations} iterations).")
    return 0


def run_list(args: argparse.Namespace) -> int:
    with build_admin(args, timeout_s=args.timeout_ms / 1000.0) as admin:
        found = admin.describe_user_scram_credentials(args.user or ())
    failed = [r for r in found.values() if r.error is not None]
    if failed:
        raise CliError(failed[0].error.name, "; ".join(f"{r.user}: {r.error.message}" for r in failed))
    users = [{"user": r.user, "credentials": [{"mechanism": m, "iterations": i} for m, i in r.credentials]}
             for r in found.values()]
    lines = [f"SCRAM credential configs for user-principal '{u['user']}' are "
             + ", ".join(f"{c['mechanism']}=iterations={c['iterations']}" for c in u["credentials"]) for u in users]
    emit(args, {"users": users}, "\n".join(lines) or "No SCRAM credentials.")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    mechanism = args.mechanism.upper()
    with build_admin(args, timeout_s=args.timeout_ms / 1000.0) as admin:
        error = admin.delete_user_scram_credential(args.user, mechanism=mechanism)
    if error is not None:
        raise CliError.from_lowtide(error)
    emit(args, {"user": args.user, "mechanism": mechanism},
         f"Completed removing the {mechanism} credential of user {args.user!r}.")
    return 0
