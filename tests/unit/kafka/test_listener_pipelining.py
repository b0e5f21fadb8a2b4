"""The Kafka listener's per-connection ordering (kafka/listener.py, common/ordering.py): a Produce
lets the next Produce of its connection start once it released its ordering point (its appends),
any other request waits for everything before it, and the answers go back in request order
whatever order the requests finish in."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from lowtide.common import ordering
from lowtide.kafka.listener import Connection, KafkaListener
from lowtide.kafka.protocol import RequestHead
from lowtide.rpc.steps import Steps

PRODUCE, METADATA = 0, 3


class Finish:
    """The test's go-ahead for one request: an event, which also wakes the request's wait when
    the request runs as steps on the listener's loop."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.wake = None  # the armed wait's wake-up (steps)

    def set(self) -> None:
        self._event.set()
        if self.wake is not None:
            self.wake.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        return self._event.wait(timeout_s)


class FinishWait:
    """A request's wait for its ``Finish`` (a ``common.steps.Wait``)."""

    def __init__(self, finish: Finish) -> None:
        self.finish = finish
        self.deadline = time.monotonic() + 10

    def arm(self, event) -> None:
        self.finish.wake = event

    def check(self) -> bool:
        return self.finish.is_set()

    def expire(self) -> None:
        raise AssertionError("a request waited 10 s for the test")

    def disarm(self) -> None:
        self.finish.wake = None


class Recorder:
    """A dispatcher whose requests block until the test lets them finish: records when each
    started, and (for a Produce carrying ``release`` in its body) releases its ordering point
    first, as the produce path does after its appends. ``steps`` serves a Produce the way the
    Kafka endpoint does, as steps on the listener's loop that yield their wait."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.threads: list[str] = []
        self.finish = {i: Finish() for i in range(10)}
        self.started_event = {i: threading.Event() for i in range(10)}

    def steps(self, conn: Connection, head: RequestHead, payload: bytes) -> Steps[bytes]:
        cid = head.correlation_id
        with self.lock:
            self.started.append(cid)
            self.threads.append(threading.current_thread().name)
        if payload.endswith(b"release"):
            ordering.release()
        self.started_event[cid].set()
        yield FinishWait(self.finish[cid])
        body = struct.pack(">i", cid)
        return struct.pack(">i", len(body)) + body

    def __call__(self, conn: Connection, head: RequestHead, payload: bytes) -> bytes:
        cid = head.correlation_id
        with self.lock:
            self.started.append(cid)
        if head.api_key == PRODUCE and payload.endswith(b"release"):
            ordering.release()
        self.started_event[cid].set()
        assert self.finish[cid].wait(10)
        body = struct.pack(">i", cid)
        return struct.pack(">i", len(body)) + body


@pytest.fixture(params=["produce on a worker", "produce as steps on the loop"])
def served(request) -> Iterator[tuple[Recorder, socket.socket]]:
    recorder = Recorder()
    on_loop = request.param.endswith("loop")
    listener = KafkaListener(host="127.0.0.1", port=0, dispatch=recorder, name="pipelining-test",
                             steps=recorder.steps if on_loop else None)
    port = listener.start()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        yield recorder, sock
    finally:
        for e in recorder.finish.values():
            e.set()
        sock.close()
        listener.stop()


def _send(sock: socket.socket, api_key: int, cid: int, body: bytes = b"") -> None:
    payload = struct.pack(">hhih", api_key, 0, cid, -1) + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)


def _answers(sock: socket.socket, n: int) -> list[int]:
    got = []
    buf = b""
    while len(got) < n:
        chunk = sock.recv(4096)
        assert chunk, "the listener closed the connection"
        buf += chunk
        while len(buf) >= 8:
            (size,) = struct.unpack_from(">i", buf)
            got.append(struct.unpack_from(">i", buf, 4)[0])
            buf = buf[4 + size:]
    return got


def test_a_released_produce_lets_the_next_produce_start_and_answers_keep_request_order(served):
    recorder, sock = served
    _send(sock, PRODUCE, 0, b"release")
    _send(sock, PRODUCE, 1, b"release")
    _send(sock, PRODUCE, 2)  # never releases: the next request waits for its end
    _send(sock, PRODUCE, 3)
    # 0 released after its "appends": 1 starts while 0 still waits (for its HW), then 2
    assert recorder.started_event[2].wait(5)
    assert recorder.started == [0, 1, 2]
    assert not recorder.started_event[3].wait(0.3), "3 started before 2 ended or released"
    # finishing out of order: 2 first, then 1 and 0; the answers still come in request order
    recorder.finish[2].set()
    assert recorder.started_event[3].wait(5)
    recorder.finish[3].set()
    recorder.finish[1].set()
    recorder.finish[0].set()
    assert _answers(sock, 4) == [0, 1, 2, 3]
    if recorder.threads:  # as steps: every Produce ran on the listener's loop, none took a worker
        assert all(name.endswith("-listener") for name in recorder.threads), recorder.threads


def test_a_produce_counts_as_on_its_way_from_its_read_until_its_appends_are_done(served):
    recorder, sock = served
    before = ordering.ARRIVALS.on_the_way
    _send(sock, PRODUCE, 0)  # never releases: counted until it ends
    _send(sock, PRODUCE, 1, b"release")  # read, waits for 0's end, then counted until its release
    _send(sock, METADATA, 2)  # not a Produce: never counted
    assert recorder.started_event[0].wait(5)
    assert _wait_for(lambda: ordering.ARRIVALS.on_the_way == before + 2)
    recorder.finish[0].set()
    assert recorder.started_event[1].wait(5)
    assert _wait_for(lambda: ordering.ARRIVALS.on_the_way == before), "the released Produce is still counted"
    recorder.finish[1].set()
    assert recorder.started_event[2].wait(5)
    assert ordering.ARRIVALS.on_the_way == before
    recorder.finish[2].set()
    assert _answers(sock, 3) == [0, 1, 2]


def _wait_for(check, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_any_other_request_waits_for_every_request_before_it(served):
    recorder, sock = served
    _send(sock, PRODUCE, 0, b"release")
    _send(sock, PRODUCE, 1, b"release")
    _send(sock, METADATA, 2)
    _send(sock, PRODUCE, 3, b"release")
    assert recorder.started_event[1].wait(5)
    # both produces released, neither finished: Metadata must not start
    assert not recorder.started_event[2].wait(0.3)
    recorder.finish[1].set()
    assert not recorder.started_event[2].wait(0.3), "Metadata started before the Produce before it ended"
    recorder.finish[0].set()
    assert recorder.started_event[2].wait(5)
    # a Produce after a request other than Produce waits for that request's end
    assert not recorder.started_event[3].wait(0.3)
    recorder.finish[2].set()
    recorder.finish[3].set()
    assert _answers(sock, 4) == [0, 1, 2, 3]
    assert recorder.started == [0, 1, 2, 3]


def test_release_outside_a_listener_request_and_a_held_release_do_nothing():
    ordering.release()  # a gRPC call: no ordering point installed
    calls = []
    with ordering.serving(lambda: calls.append("released")):
        with ordering.held():
            ordering.release()
        assert calls == []
        ordering.release()
        ordering.release()
    assert calls == ["released"]


def test_a_request_that_closes_its_connection_is_answered_then_the_connection_closes():
    # A failed login (apis_sasl._refuse) closes the connection from its handler: the answer is still
    # written, then the listener closes, though the client sent nothing more.
    def dispatch(conn: Connection, head: RequestHead, payload: bytes) -> bytes:
        if head.correlation_id == 1:
            conn.close()
        body = struct.pack(">i", head.correlation_id)
        return struct.pack(">i", len(body)) + body

    listener = KafkaListener(host="127.0.0.1", port=0, dispatch=dispatch, name="closing-test")
    port = listener.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            _send(sock, METADATA, 0)
            assert _answers(sock, 1) == [0]
            _send(sock, METADATA, 1)
            _send(sock, METADATA, 2)  # after the closing request: never served
            assert _answers(sock, 1) == [1]
            try:  # closed with request 2's bytes unread: a reset, or an orderly close
                assert sock.recv(4096) == b"", "the connection stayed open"
            except ConnectionResetError:
                pass
    finally:
        listener.stop()
