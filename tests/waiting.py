"""The test suite's one polling helper: wait, boundedly, for an effect that happens on another thread
or in another process (a background unlink, a reaped Redis member, a replica catching up)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], *, timeout_s: float = 5.0, interval_s: float = 0.01,
               what: str = "condition", retry_on: tuple[type[BaseException], ...] = (),
               explain: Callable[[], str] | None = None) -> None:
    """Poll ``predicate`` every ``interval_s`` until it returns something truthy.

    Raises AssertionError naming ``what`` and ``timeout_s`` if it never did; the predicate gets one
    last look after the deadline, so a check that became true while we slept still counts.
    Exceptions of the types in ``retry_on`` mean "not yet" (e.g. a gRPC call to a leader that is
    being re-elected); the last one is chained to the AssertionError. Any other exception propagates.
    ``explain``, called only on a timeout, adds what the test can tell about the state it ended in
    (the logs of a run on a loaded CI machine are often all there is).
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            if predicate():
                return
            last_error = None
        except retry_on as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f"; {explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{detail}") from last_error
        time.sleep(interval_s)
