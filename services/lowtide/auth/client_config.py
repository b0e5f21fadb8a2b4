"""Kafka-style ``--command-config`` properties files for CLI and client credentials.

Accepted syntax (the subset of ``java.util.Properties`` that Kafka tool configs use)::

    # comment            ! comment
    lowtide.auth.token=s3cr3t
    sasl.oauthbearer.token: s3cr3t      (alias of lowtide.auth.token)
    long.value=first \\
               second                   (a trailing backslash continues the line)

Keys and values are stripped; the first ``=`` or ``:`` separates them. Unknown keys are kept and
ignored by lowtide (so a file shared with Kafka tools works). Errors name the path and line.
"""

from __future__ import annotations

from pathlib import Path

from lowtide.errors import InvalidConfig

TOKEN_KEY = "lowtide.auth.token"
TOKEN_KEY_ALIASES = ("sasl.oauthbearer.token",)


def parse_properties(text: str, *, source: str = "<string>") -> dict[str, str]:
    """Parse properties text; ``source`` names the origin in error messages."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].strip()
        i += 1
        if not line or line[0] in "#!":
            continue
        # Join continuation lines: an odd number of trailing backslashes escapes the newline.
        while line.endswith("\\") and (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            line = line[:-1]
            if i >= len(lines):
                break
            line += lines[i].strip()
            i += 1
        cut = min((p for p in (line.find("="), line.find(":")) if p >= 0), default=-1)
        if cut < 0:
            raise InvalidConfig(f"{source}:{lineno}: expected 'key=value' or 'key: value', got {line!r}")
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if not key:
            raise InvalidConfig(f"{source}:{lineno}: empty key")
        out[key] = value
    return out


def load_command_config(path: str | Path) -> dict[str, str]:
    """Read a properties file; a missing/unreadable file or bad line raises InvalidConfig."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidConfig(f"cannot read command config {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidConfig(f"command config {str(path)!r} is not UTF-8 text: {exc}") from None
    return parse_properties(text, source=str(path))


def bearer_metadata(token: str | None) -> list[tuple[str, str]]:
    """gRPC call metadata presenting ``token``; ``[]`` for no token."""
    return [("authorization", f"Bearer {token}")] if token else []


def call_metadata(config: dict[str, str] | None) -> list[tuple[str, str]]:
    """gRPC call metadata carrying the configured token; ``[]`` when no token is configured."""
    if not config:
        return []
    for key in (TOKEN_KEY, *TOKEN_KEY_ALIASES):
        token = config.get(key, "").strip()
        if token:
            return bearer_metadata(token)
    return []
