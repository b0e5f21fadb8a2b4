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

Thread-safety: the state is per thread.
"""

from __future__ import annotations

import threading
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
