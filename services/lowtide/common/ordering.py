"""A request's ordering point: when a caller serving one connection's requests in order may start
the next one.

Why: a Kafka producer keeps up to ``max.in.flight.requests.per.connection`` (5) Produce requests
in flight on one connection, and with acks=all most of a request's time is spent waiting for the
followers (the HW), not appending. Serving a connection one request at a time left a 16 KiB
request's replication round to itself: the followers fetched once per request and the producer's
pipelining was lost. What must happen in request order is only the appends (sequence numbers,
offsets); so a Produce says, once its appends are done, that the next request of its connection
may start, and waits for the HW while the next one appends. The answers still go back in request
order (``kafka/listener.py``), and what an acks=all answer acknowledges is unchanged.

The caller (the Kafka listener's worker) installs a release callback for the thread running the
request with ``serving``; the produce path calls ``release()`` after its appends. Without a
callback installed (a gRPC call) ``release()`` does nothing. ``held()`` suspends the release for a
request whose appends are not all done when the classic produce path returns from them (a Produce
that also writes diskless partitions, appended after the classic ones).

Appends on the way (issue 32): the listener counts the Produce requests it has read and whose
appends are not done yet, and their pace (``ProduceArrivals``, one per process: ``ARRIVALS``).
A leader's follower fetch woken by an append looks at them (``next_append_due``): while another
Produce is about to append, or is due soon at the pace Produce requests have been arriving,
answering now would give the next append a replication round of its own (replica/requests.py,
the replication linger).

Thread-safety: the ordering point is per thread; the count of appends on the way is process-wide
and thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_state = threading.local()


@contextmanager
def serving(on_release: Callable[[], None]) -> Iterator[None]:
    """Run a request on this thread with ``on_release`` as its ordering point (called at most
    once, by ``release()``; the caller releases at the end of the request itself if not)."""
    _state.release = on_release
    try:
        yield
    finally:
        _state.release = None


def release() -> None:
    """This request's appends are done: the next request of its connection may start."""
    callback = getattr(_state, "release", None)
    if callback is not None:
        _state.release = None
        callback()


@contextmanager
def held() -> Iterator[None]:
    """Within the block ``release()`` does nothing; the release stays pending for after it."""
    callback = getattr(_state, "release", None)
    _state.release = None
    try:
        yield
    finally:
        _state.release = callback


class ProduceArrivals:
    """Produce requests on their way to an append, and the pace at which they arrive.

    Contract: ``expect_append`` when a Produce is read whose appends are not done yet, matched by
    one ``appended`` when they are (or the request ended without them); ``next_append_due`` says
    when the next append is due. Thread-safety: thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._expected = 0
        self._last_arrival = 0.0  # time.monotonic() of the latest expect_append
        self._gap = -1.0  # seconds between the two latest (-1: fewer than two so far)

    def expect_append(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._expected += 1
            if self._last_arrival:
                self._gap = now - self._last_arrival
            self._last_arrival = now

    def appended(self) -> None:
        with self._lock:
            self._expected = max(0, self._expected - 1)

    @property
    def on_the_way(self) -> int:
        """Produce requests counted and not yet appended."""
        return self._expected

    def next_append_due(self) -> float | None:
        """When the next append is due (``time.monotonic()``): now while a Produce read is not yet
        appended; else the latest arrival plus the gap before it (producers sending at a steady
        pace); None before two arrivals."""
        with self._lock:
            if self._expected:
                return time.monotonic()
            return self._last_arrival + self._gap if self._gap >= 0 else None


# The process's Produce requests on their way: counted by the Kafka listener, read by the leader's
# follower fetches (replica/requests.py).
ARRIVALS = ProduceArrivals()
