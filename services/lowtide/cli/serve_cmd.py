"""`lowtide serve <service>`: run one service process in the foreground.

Each service package exposes ``server.add_arguments(parser)`` and ``server.run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib

SERVICES = {
    "replica": "lowtide.replica.server",
    "frontdoor": "lowtide.frontdoor.server",
    "coordinator": "lowtide.coordinator.server",
    "orphan-scanner": "lowtide.scanner.server",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    serve = subparsers.add_parser("serve", help="run one lowtide service in the foreground")
    kinds = serve.add_subparsers(dest="service", required=True)
    for kind, module_name in SERVICES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # service not built yet
            raise
        p = kinds.add_parser(kind, help=(module.__doc__ or "").strip().splitlines()[0] if module.__doc__ else "")
        module.add_arguments(p)
        p.set_defaults(func=module.run)
