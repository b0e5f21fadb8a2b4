"""The event loops of the request paths: uvloop's when it is installed, else asyncio's own.

A replica's (and the front door's) Kafka listener loop, which also serves the replica's
replication listener and runs its fetchers, a coordinator shard's pipeline loop and a standalone
framed listener's loop are made here.

Why uvloop (issue 32; docs/testing.md#where-time-goes-per-16-kib-produce-request): on those loops
every request costs a few callbacks, a timer, a transport read and a write, each of them Python in
asyncio's selector loop; uvloop serves the same interface from libuv with those parts compiled.
A bare framed round (tests.bench.loop_round) costs about a quarter less CPU on each side.

Which loop: ``--event-loop`` of every server (``LOWTIDE_EVENT_LOOP``): ``auto`` (the default)
is uvloop when it can be imported, ``uvloop`` insists on it, ``asyncio`` picks asyncio's loop (to
compare, or to rule the loop out when chasing a fault). Thread-safety: ``use_event_loop`` once at
start-up, before any loop is made; ``new_event_loop`` from any thread.
"""

from __future__ import annotations

import asyncio
import os

EVENT_LOOP_ENV = "LOWTIDE_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")

_chosen: str | None = None  # set by use_event_loop (the server's flag); None: the env, else auto


def use_event_loop(choice: str) -> str:
    """Make ``new_event_loop`` follow ``choice`` (one of CHOICES); returns the kind it will make.
    Raises ValueError naming the choices for another value, or for ``uvloop`` when it is missing."""
    global _chosen
    kind = _resolve(choice)
    _chosen = choice.strip().lower()
    return kind


def loop_kind() -> str:
    """``"uvloop"`` or ``"asyncio"``: what ``new_event_loop`` makes."""
    return _resolve(_chosen if _chosen is not None else os.environ.get(EVENT_LOOP_ENV, "auto"))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop of ``loop_kind()``'s kind (not set as any thread's current loop)."""
    if loop_kind() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _resolve(choice: str) -> str:
    choice = (choice or "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(f"event loop {choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError("event loop 'uvloop' asked for, but uvloop is not installed "
                             "(pip install 'uvloop>=0.21,<0.24')") from None
        return "asyncio"
    return "uvloop"
