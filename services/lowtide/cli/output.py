"""Output contract of the CLI (docs/operations.md#the-cli-output-contract).

Every command takes ``--output text|json``. Success prints a result (text: human table/lines;
json: one JSON document, or one JSON object per line for streams). Failure: text mode prints
``error: NAME: message`` to stderr; json mode prints ``{"error": {"code": NAME, "message": ...}}``
on stdout; the exit code is non-zero in both.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from lowtide.errors import LowtideError


class CliError(Exception):
    """A failure the CLI reports with a Kafka-style code name and exits on."""

    def __init__(self, code: str, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.exit_code = exit_code

    @classmethod
    def from_lowtide(cls, err: LowtideError) -> CliError:
        return cls(err.name, err.message)


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def emit(args: Any, doc: Any, text: str | None = None) -> None:
    """Print ``doc`` as JSON in json mode, else ``text`` (or a readable rendering of doc)."""
    if getattr(args, "output", "text") == "json":
        emit_json(doc)
    else:
        sys.stdout.write((text if text is not None else json.dumps(doc, indent=2)) + "\n")
        sys.stdout.flush()


def emit_error(args: Any, err: CliError) -> int:
    """Report ``err`` in the chosen format; returns its (non-zero) exit code."""
    # The contract promises a message: an empty one (a bare exception, a server that sent no
    # details) becomes the code's own name rather than "".
    code = err.code or "UNKNOWN_SERVER_ERROR"
    message = (err.message or "").strip() or f"{code} (no details were given)"
    if getattr(args, "output", "text") == "json":
        emit_json({"error": {"code": code, "message": message}})
    else:
        sys.stderr.write(f"error: {code}: {message}\n")
    return err.exit_code or 1


def progress(args: Any, message: str) -> None:
    """Progress for long CLI work: always on stderr, so json stdout stays parseable."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
