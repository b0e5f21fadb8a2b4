"""Shared flags of the spark-jobs entry points (kept tiny: the jobs live in lowtide.spark.jobs)."""

from __future__ import annotations

import argparse
import json
import sys

from lowtide.spark.options import Connection, parse_connection


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT", help="lowtide front door")
    parser.add_argument("--command-config", metavar="FILE", help="properties file with lowtide.auth.token=...")
    parser.add_argument("--master", help="Spark master (default local[*], or spark-submit's --master)")
    parser.add_argument("--output", choices=("text", "json"), default="text")


def connection(args: argparse.Namespace) -> Connection:
    options = {"bootstrap.servers": args.bootstrap_server}
    if args.command_config:
        options["lowtide.command.config"] = args.command_config
    return parse_connection(options)


def progress(args: argparse.Namespace):
    return lambda message: print(message, file=sys.stderr, flush=True)


def emit(args: argparse.Namespace, report: dict, text: str) -> None:
    print(json.dumps(report) if args.output == "json" else text, flush=True)
