"""``LoopFramedConnection``: a follower's replication rounds read by an event loop, against a real
replication listener (lowtide.rpc.framed.listener) on loopback whose session answers as told."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from lowtide.common.procs import find_free_port
from lowtide.errors import InvalidRequest, NetworkException, RequestTimedOut
from lowtide.rpc.framed.codec import PRODUCE, REQUEST
from lowtide.rpc.framed.connection import LoopFramedConnection
from lowtide.rpc.framed.listener import FramedListener
from lowtide.rpc.steps import Steps, drive_to_future
from tests.waiting import wait_until


class _Never:
    """A Wait nobody settles before its deadline (a leader parking a round)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def arm(self, event: Any) -> None:
        return None

    def check(self) -> bool:
        return False

    def expire(self) -> None:
        return None

    def disarm(self) -> None:
        return None


class _Session:
    """Answers ``b"big:N"`` with N bytes of a pattern, ``b"refuse"`` with INVALID_REQUEST,
    ``b"park:S"`` after S seconds, anything else with itself reversed."""

    def __init__(self, seen: list[tuple[str, list[tuple[str, str]]]], principal: str) -> None:
        self.seen, self.principal = seen, principal

    def handle_steps(self, kind: int, payload: bytes) -> Steps[bytes]:
        text = bytes(payload)
        if text.startswith(b"big:"):
            size = int(text[4:])
            return bytes(i % 251 for i in range(251)) * (size // 251) + b"x" * (size % 251)
        if text == b"refuse":
            raise InvalidRequest("refused as asked")
        if text.startswith(b"park:"):
            yield _Never(float(text[5:]))
        return text[::-1]

    def cancel(self) -> None:
        self.seen.append(("cancel", []))

    def close(self) -> None:
        return None


@pytest.fixture
def listener() -> Iterator[tuple[str, list[Any]]]:
    seen: list[Any] = []

    def authenticate(metadata: list[tuple[str, str]], certificate: bytes | None) -> str:
        seen.append(("hello", metadata))
        return "User:test"

    server = FramedListener(host="127.0.0.1", port=0, tls=None, name="test")
    server.bind()
    server.start(open_session=lambda principal, peer: _Session(seen, principal), authenticate=authenticate,
                 draining=lambda: False)
    try:
        yield f"127.0.0.1:{server.port}", seen
    finally:
        server.stop()


@pytest.fixture
def client_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def run_steps(loop: asyncio.AbstractEventLoop, make_steps: Any) -> Any:
    """Build and drive the steps on ``loop``; their answer (or error) here."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        async def drive() -> Any:
            return await drive_to_future(make_steps(), loop=loop, executor=pool)

        return asyncio.run_coroutine_threadsafe(drive(), loop).result(timeout=30)


def connect(loop: asyncio.AbstractEventLoop, address: str, metadata=(("authorization", "Bearer t"),)) -> Any:
    return run_steps(loop, lambda: LoopFramedConnection.open_steps(address, loop=loop, tls=None, metadata=metadata,
                                                                   connect_timeout_s=5))


def test_answers_small_and_large_come_back_byte_for_byte_on_one_connection(listener, client_loop):
    address, seen = listener
    connection = connect(client_loop, address)
    assert run_steps(client_loop, lambda: connection.call_steps(REQUEST, b"hello", timeout_s=5)) == b"olleh"
    for size in (0, 65_530, 65_531, 3 * 1024 * 1024 + 7):  # empty, fits the scratch buffer, one over, large
        answer = run_steps(client_loop, lambda size=size: connection.call_steps(REQUEST, b"big:%d" % size,
                                                                                 timeout_s=10))
        expected = bytes(i % 251 for i in range(251)) * (size // 251) + b"x" * (size % 251)
        assert bytes(answer) == expected, size
    assert run_steps(client_loop, lambda: connection.call_steps(PRODUCE, b"abc", timeout_s=5)) == b"cba"
    assert seen == [("hello", [("authorization", "Bearer t")])]  # one HELLO: every call on one connection
    assert not connection.finished
    client_loop.call_soon_threadsafe(connection.close)


def test_a_refused_request_raises_the_listeners_error_and_finishes_the_connection(listener, client_loop):
    connection = connect(client_loop, listener[0])
    with pytest.raises(InvalidRequest, match="refused as asked"):
        run_steps(client_loop, lambda: connection.call_steps(REQUEST, b"refuse", timeout_s=5))
    assert connection.finished
    with pytest.raises(NetworkException, match="finished"):
        run_steps(client_loop, lambda: connection.call_steps(REQUEST, b"again", timeout_s=5))


def test_an_answer_later_than_the_calls_timeout_is_request_timed_out(listener, client_loop):
    connection = connect(client_loop, listener[0])
    started = time.monotonic()
    with pytest.raises(RequestTimedOut):
        run_steps(client_loop, lambda: connection.call_steps(REQUEST, b"park:5", timeout_s=0.3))
    assert time.monotonic() - started < 3 and connection.finished


def test_cancel_from_another_thread_ends_a_parked_call_at_once(listener, client_loop):
    connection = connect(client_loop, listener[0])
    threading.Timer(0.3, connection.cancel).start()
    started = time.monotonic()
    with pytest.raises(NetworkException, match="closed"):
        run_steps(client_loop, lambda: connection.call_steps(REQUEST, b"park:20", timeout_s=30))
    assert time.monotonic() - started < 5 and connection.finished


def test_the_listener_tells_the_session_at_once_when_its_peer_goes_with_a_call_in_flight(listener, client_loop):
    address, seen = listener
    connection = connect(client_loop, address)
    threading.Timer(0.3, connection.cancel).start()  # the client closes its socket mid-call
    with pytest.raises(NetworkException, match="closed"):
        run_steps(client_loop, lambda: connection.call_steps(REQUEST, b"park:20", timeout_s=30))
    # Told while the call still parks (20 s), so a session can release what the call waits for.
    wait_until(lambda: ("cancel", []) in seen, timeout_s=5, what="the session told its peer went away")
    assert seen.count(("cancel", [])) == 1


def test_a_port_nobody_listens_on_is_a_network_exception_naming_the_address(client_loop):
    address = f"127.0.0.1:{find_free_port()}"
    with pytest.raises(NetworkException, match=address):
        connect(client_loop, address)
