"""Delayed operations: a request that waits for a condition or a deadline (Kafka's DelayedOperation).

A ``DelayedOperation`` is created by a gRPC handler (DeleteRecords waiting for LW >= target, an
acks=all Produce waiting for HW), handed to a :class:`~lowtide.purgatory.purgatory.Purgatory`, and
then the handler thread blocks in :meth:`DelayedOperation.wait`. Exactly one of three things ends it:

* the condition holds: ``try_complete`` (called by the purgatory when the domain says the condition
  may have changed) calls ``force_complete``;
* the deadline passes: the purgatory's reaper calls ``on_expiration`` then ``on_complete``;
* the domain gives up on it (leadership moved, shutdown): ``fail(exc)`` records the error and
  completes it.

Whichever comes first wins; the others are no-ops. ``on_complete`` runs exactly once.
"""

from __future__ import annotations

import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable

from lowtide.errors import LowtideError

logger = logging.getLogger(__name__)

# Called by DelayedOperation once it has completed; set by the purgatory that watches it.
CompletionListener = Callable[["DelayedOperation"], None]


class DelayedOperation(ABC):
    """An operation that completes when its condition holds, or expires at ``deadline_ms``.

    Contract:

    * ``deadline_ms`` is wall-clock epoch milliseconds (not monotonic) because the deadline is
      shared with other processes through Redis; it is read against the purgatory's ``clock``, so
      compute it from that same clock (``lowtide.clock.now_ms`` unless a test injects another).
    * Subclasses implement ``try_complete`` (check the condition; if it holds, return
      ``self.force_complete()``; otherwise return False), ``on_complete`` (build the result; called
      exactly once, also after expiration or ``fail``) and ``on_expiration`` (called once, before
      ``on_complete``, only when the deadline passed first; typically records REQUEST_TIMED_OUT).
    * ``error`` is the exception passed to ``fail`` (or None); ``expired`` says the deadline won.

    Thread-safety: every public method may be called from any thread. Completion is decided by one
    compare-and-set under an internal lock, so ``force_complete``/``fail``/expiry race safely and
    exactly one caller gets True. ``try_complete`` is never run concurrently with itself for the same
    operation when called through the purgatory (it holds the operation's try-lock), so subclasses
    need no locking of their own for the check. ``on_expiration`` and ``on_complete`` run on the
    thread that won the race, outside the completion lock.
    """

    def __init__(self, *, deadline_ms: int, op_id: str | None = None) -> None:
        self.deadline_ms = int(deadline_ms)
        # The op id is part of the Redis member ``{owner}|{op_id}``; '|' would make it ambiguous.
        self.op_id = op_id if op_id is not None else uuid.uuid4().hex
        if "|" in self.op_id:
            raise ValueError(f"op_id must not contain '|': {self.op_id!r}")
        self.expired = False
        self.error: LowtideError | BaseException | None = None
        self._completed = False
        self._state_lock = threading.Lock()
        # Reentrant: try_complete -> force_complete -> on_complete may call back into the op.
        self._try_lock = threading.RLock()
        self._done = threading.Event()
        self._listener: CompletionListener | None = None

    # -- to implement ------------------------------------------------------------------------------

    @abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; if it holds, return ``self.force_complete()``, else False."""

    @abstractmethod
    def on_complete(self) -> None:
        """Produce the result; runs exactly once, whatever ended the operation."""

    @abstractmethod
    def on_expiration(self) -> None:
        """The deadline passed before the condition held; runs once, just before ``on_complete``."""

    # -- state -------------------------------------------------------------------------------------

    @property
    def is_completed(self) -> bool:
        return self._completed

    def force_complete(self) -> bool:
        """Complete the operation now; True only for the one caller that actually completed it."""
        return self._finish(expired=False, error=None)

    def fail(self, exc: LowtideError | BaseException) -> bool:
        """Complete the operation with ``exc`` as its error (e.g. NOT_LEADER_OR_FOLLOWER).

        The error is recorded only if this call wins the race, so a result computed by a concurrent
        successful completion is never overwritten. Returns True if this call completed it.
        """
        return self._finish(expired=False, error=exc)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until completed (or ``timeout_s`` passes); True if completed."""
        return self._done.wait(timeout_s)

    def remaining_ms(self, *, now_ms: int) -> int:
        """Milliseconds until the deadline (negative once it passed)."""
        return self.deadline_ms - now_ms

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(op_id={self.op_id!r}, deadline_ms={self.deadline_ms}, "
                f"completed={self._completed}, expired={self.expired})")

    # -- used by the purgatory ---------------------------------------------------------------------

    def run_try_complete(self) -> bool:
        """Run ``try_complete`` under the operation's try-lock (no concurrent checks of one op)."""
        if self._completed:
            return False
        with self._try_lock:
            if self._completed:
                return False
            return bool(self.try_complete())

    def expire(self) -> bool:
        """Expire the operation: ``on_expiration`` then ``on_complete``; True if this call won."""
        return self._finish(expired=True, error=None)

    def attach_listener(self, listener: CompletionListener) -> bool:
        """Register the purgatory's completion listener; False if the op already completed.

        Checked under the completion lock so a completion racing with watching is never missed: either
        the listener is attached before completion (and will be called) or attaching fails.
        """
        with self._state_lock:
            if self._completed:
                return False
            self._listener = listener
            return True

    # -- internals ---------------------------------------------------------------------------------

    def _finish(self, *, expired: bool, error: LowtideError | BaseException | None) -> bool:
        with self._state_lock:
            if self._completed:
                return False
            self._completed = True
            self.expired = expired
            if error is not None:
                self.error = error
            listener, self._listener = self._listener, None
        try:
            if expired:
                self._call_safely(self.on_expiration, "on_expiration")
            self._call_safely(self.on_complete, "on_complete")
        finally:
            # Tell the purgatory before waking the waiter, so when wait() returns the operation is no
            # longer counted as pending and its Redis timer is gone (best effort if Redis is down).
            if listener is not None:
                try:
                    listener(self)
                except Exception:  # a bookkeeping failure must not hide the result from the waiter
                    logger.exception("purgatory completion listener failed", extra={"op_id": self.op_id})
            self._done.set()
        return True

    def _call_safely(self, fn: Callable[[], None], what: str) -> None:
        # A bug in one callback must not leave the waiter blocked until its own timeout.
        try:
            fn()
        except Exception:
            logger.exception("delayed operation %s failed", what,
                             extra={"op_id": self.op_id, "operation": type(self).__name__})
