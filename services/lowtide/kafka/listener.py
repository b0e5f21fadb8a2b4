"""The Kafka protocol listener: an asyncio TCP server in its own thread, next to a service's gRPC port.

Per connection: read a frame, hand it to the dispatcher on a worker thread (most handlers may
block), and write the answers in request order. Produce and Fetch, where a service gives them as
steps (rpc/steps.py: a Produce with acks=all waits for the ISR, a Fetch long-polls), run on the
listener's loop instead: their waits are wake-ups, and only their ``Blocking`` parts go to a
worker. Requests run one after the other, as in Kafka's network layer, with one exception: a
Produce lets the connection's next Produce start once its appends are done
(``lowtide.common.ordering``), so a producer's pipelined requests (``max.in.flight``, 5 by
default) wait for the followers together, and a replication round carries all of them instead of
one 16 KiB request each. Appends still happen in request order; any other request starts only
once every request before it has finished. At most ``max_in_flight`` requests per connection are
read ahead of their answers, which bounds memory per connection. A frame over
``max_request_bytes`` is refused before it is read; a frame that does not parse closes only its
own connection (after the answers to the requests before it).

A listener has a name and a security protocol, as Kafka's ``listeners`` do (kafka/server.py):
``SSL`` and ``SASL_SSL`` listeners are given an ``ssl.SSLContext`` and do the TLS handshake before
the first frame (a failed handshake never reaches the dispatcher); each connection records the
listener it arrived on (Metadata answers with that listener's endpoints) and the client
certificate it presented, if any (DER; its principal is the SSL identity, kafka/tls_identity.py).

Thread-safety: ``start``/``stop`` from one thread; everything else runs on the listener's loop or
its workers.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from lowtide.common import ordering
from lowtide.kafka.protocol import DEFAULT_MAX_REQUEST_BYTES, FrameError, RequestHead
from lowtide.rpc.steps import Steps, drive_to_future

log = logging.getLogger(__name__)

CONNECTIONS = Gauge("lowtide_kafka_connections", "Open connections to the Kafka protocol listener")
BAD_FRAMES = Counter("lowtide_kafka_bad_frames_total",
                     "Kafka protocol connections closed for a frame that cannot be served", ["reason"])
_SIZE = struct.Struct(">i")
PRODUCE_KEY = 0
FETCH_KEY = 1
# Requests read ahead of their answers per connection: Kafka clients keep at most
# max.in.flight.requests.per.connection (5 by default) outstanding.
DEFAULT_MAX_IN_FLIGHT = 8


@dataclass(eq=False)
class Connection:
    """One client connection's state: who it is (after SASL) and what to run when it goes away
    (a parked Fetch is released at once, as a gRPC cancellation releases it).

    SASL: ``sasl_mechanism`` is set by a SaslHandshake and cleared when its exchange ends;
    ``sasl_state`` holds a multi-round mechanism's state in between (SCRAM's server nonce).
    After a login, ``principal``/``login_mechanism`` say who logged in how (a re-authentication,
    KIP-368, must keep both) and ``session_deadline`` (time.monotonic) when the session ends:
    past it only a new SASL exchange is served."""

    peer: str
    metadata: tuple[tuple[str, str], ...] = ()  # the identity handed to the services' access checks
    listener: str = "PLAINTEXT"  # the name of the listener it arrived on (Kafka's listener name)
    protocol: str = "PLAINTEXT"  # that listener's security protocol
    peer_certificate: bytes | None = None  # the client certificate (DER) of a TLS connection, if sent
    authenticated: bool = False
    sasl_mechanism: str | None = None
    sasl_state: object | None = None
    principal: str | None = None
    login_mechanism: str | None = None
    session_deadline: float | None = None
    session: object | None = None  # what ends with the connection (a SCRAM session token)
    closed: threading.Event = field(default_factory=threading.Event)
    _on_close: list[Callable[[], None]] = field(default_factory=list)
    _on_close_slots: dict[str, Callable[[], None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_close(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.closed.is_set():
                self._on_close.append(callback)
                return
        callback()

    def on_close_slot(self, slot: str, callback: Callable[[], None]) -> None:
        """``on_close`` for what every request of a kind registers (a parked Fetch's release):
        the callback replaces the slot's previous one, so a long-lived consumer connection holds
        one, not one per Fetch it ever sent."""
        with self._lock:
            if not self.closed.is_set():
                self._on_close_slots[slot] = callback
                return
        callback()

    def close(self) -> None:
        with self._lock:
            self.closed.set()
            callbacks, self._on_close = [*self._on_close, *self._on_close_slots.values()], []
            self._on_close_slots = {}
        for cb in callbacks:
            try:
                cb()
            except Exception:  # a callback's failure must not keep the others from running
                log.exception("connection close callback failed")


# dispatcher(conn, head, payload) -> the response frame, None for no response (acks=0), or
# raises FrameError to close the connection.
Dispatcher = Callable[[Connection, RequestHead, bytes], "bytes | None"]
# The same as steps (rpc/steps.py), run on the listener's loop; None: use the dispatcher.
StepsDispatcher = Callable[[Connection, RequestHead, bytes], "Steps[bytes | None] | None"]


class KafkaListener:
    """Serves Kafka frames on ``host:port`` through ``dispatch``."""

    def __init__(self, *, host: str, port: int, dispatch: Dispatcher,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, workers: int = 64, name: str = "kafka",
                 listener_name: str = "PLAINTEXT", protocol: str = "PLAINTEXT",
                 ssl_context: ssl.SSLContext | None = None, ssl_handshake_timeout_s: float = 10.0,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, steps: StepsDispatcher | None = None) -> None:
        self.host, self.port = host, port
        self._steps = steps
        self._max_in_flight = max(1, max_in_flight)
        self.listener_name, self.protocol = listener_name, protocol
        self._ssl = ssl_context
        self._handshake_timeout_s = ssl_handshake_timeout_s
        self._dispatch = dispatch
        self._max = max_request_bytes
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"{name}-req")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[Connection] = set()
        self._name = name

    def start(self) -> int:
        """Bind and serve; returns the bound port (``port`` 0 picks a free one)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                tls = {"ssl": self._ssl, "ssl_handshake_timeout": self._handshake_timeout_s} if self._ssl else {}
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._serve, self.host, self.port, reuse_address=True, limit=1 << 16,
                                         **tls))
                self.port = self._server.sockets[0].getsockname()[1]
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name=f"{self._name}-{self.listener_name.lower()}-listener",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        log.info("kafka listener %s (%s) on %s:%d", self.listener_name, self.protocol, self.host, self.port)
        return self.port

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop serving this listener (after ``start``): other servers of the process
        may serve on it too (the replication listener, rpc/framed/listener.py)."""
        return self._loop

    def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, close every connection (their parked requests are released), then
        let running requests finish for up to ``grace_s``."""
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=grace_s)
        except Exception:
            log.warning("kafka listener did not close in %.1fs", grace_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=grace_s)

    def _run(self, conn: Connection, head: RequestHead, payload: bytes, on_release: Callable[[], None],
             counted: bool = False) -> bytes | None:
        """On a worker thread: one request, with its ordering point (``ordering.release``). A
        Produce ``counted`` as an append on the way (``ordering.ARRIVALS``) stops counting at
        its ordering point, or when it ends without reaching one."""
        if not counted:
            with ordering.serving(on_release):
                return self._dispatch(conn, head, payload)
        append = _CountedAppend(on_release)  # release() and the finally run on this thread
        try:
            with ordering.serving(append.release):
                return self._dispatch(conn, head, payload)
        finally:
            append.end()

    def _drive(self, steps: Steps[bytes | None], gate: asyncio.Future,
               loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        """On the loop: a counted Produce as steps (module doc). Its appends run here, now; its
        ordering point opens ``gate`` and stops counting it; returns the future of its answer."""
        append = _CountedAppend(lambda: _open(gate))
        return drive_to_future(steps, loop=loop, executor=self._pool,
                               around_step=lambda: ordering.serving(append.release), before_settle=append.release)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        tls = writer.get_extra_info("ssl_object")
        conn = Connection(peer=f"kafka:{peername[0]}:{peername[1]}" if peername else "kafka:?",
                          listener=self.listener_name, protocol=self.protocol,
                          peer_certificate=tls.getpeercert(binary_form=True) if tls is not None else None)
        self._conns.add(conn)
        CONNECTIONS.inc()
        loop = asyncio.get_running_loop()
        # The answers in request order (None: no more requests); ``slots`` bounds the requests
        # read and not yet answered.
        answers: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._max_in_flight)
        writing = loop.create_task(self._write_answers(conn, writer, answers, slots))
        unfinished: set[asyncio.Future] = set()  # requests dispatched and not finished
        gate: asyncio.Future | None = None  # the previous request's ordering point
        gate_produce = False  # ... and whether that request was a Produce
        try:
            while not conn.closed.is_set():
                try:
                    size_bytes = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (size,) = _SIZE.unpack(size_bytes)
                if size < 8 or size > self._max:
                    BAD_FRAMES.labels("size").inc()
                    log.warning("closing %s: frame of %d bytes (limit %d)", conn.peer, size, self._max)
                    return
                try:
                    payload = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    BAD_FRAMES.labels("truncated").inc()
                    return
                head = RequestHead.parse(payload)
                await slots.acquire()
                if conn.closed.is_set():
                    return
                produce = head.api_key == PRODUCE_KEY
                if produce:
                    ordering.ARRIVALS.expect_append()  # from here until its appends are done (_run)
                dispatched = False
                try:
                    if produce and gate_produce and gate is not None:
                        await gate  # the previous Produce's appends are done
                    elif unfinished:
                        await asyncio.wait(set(unfinished))  # everything before it has finished
                    if conn.closed.is_set():  # a request before it closed the connection (a failed login)
                        return
                    gate = loop.create_future()
                    gate_produce = produce
                    on_loop = produce or head.api_key == FETCH_KEY
                    steps = self._steps(conn, head, payload) if on_loop and self._steps is not None else None
                    if steps is not None and produce:
                        dispatched = True
                        answer = self._drive(steps, gate, loop)
                    elif steps is not None:
                        # A Fetch on the loop too: its long-poll is a wake-up, not a parked worker
                        # thread, and an answer ready now costs no thread hop (a replica spent
                        # about a millisecond of CPU per Fetch on those).
                        dispatched = True
                        answer = drive_to_future(steps, loop=loop, executor=self._pool)
                    else:
                        answer = loop.run_in_executor(self._pool, self._run, conn, head, payload,
                                                      _opener(loop, gate), produce)
                        dispatched = True
                finally:
                    if produce and not dispatched:
                        ordering.ARRIVALS.appended()
                unfinished.add(answer)
                answer.add_done_callback(_finished(unfinished, gate))
                answers.put_nowait(answer)
        except ConnectionError:
            return
        except RuntimeError:  # the pool is shut down: we are stopping
            return
        except Exception:  # a bug must close one connection, never the listener
            log.exception("kafka connection %s failed", conn.peer)
        finally:
            # The answers to what was read go out first (a client may half-close after its
            # last request), unless the writer is what ended the connection.
            answers.put_nowait(None)
            if not writing.done():
                try:
                    await writing
                except BaseException:  # noqa: BLE001 - the connection ends whatever the writer did
                    pass
            self._conns.discard(conn)
            CONNECTIONS.dec()
            conn.close()
            writer.close()

    async def _write_answers(self, conn: Connection, writer: asyncio.StreamWriter,
                             answers: asyncio.Queue[asyncio.Future | None], slots: asyncio.Semaphore) -> None:
        """Write each answer in request order; a request that cannot be served (or a write that
        fails, or a request that closed its connection) ends the connection: nothing after it is
        answered."""
        try:
            while True:
                pending = await answers.get()
                if pending is None:
                    return  # the reader ended the connection and closes it
                try:
                    answer = await pending
                finally:
                    slots.release()
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
                if conn.closed.is_set():
                    break  # the request closed its connection (a failed login): answered, now closed
        except FrameError as exc:
            BAD_FRAMES.labels("unreadable").inc()
            log.warning("closing %s: %s", conn.peer, exc)
        except (ConnectionError, RuntimeError):  # the peer went away, or the pool is shut down
            pass
        except Exception:  # a bug must close one connection, never the listener
            log.exception("kafka connection %s failed", conn.peer)
        conn.close()
        writer.close()
        # The reader stops at its next step (a read from the closed transport, or the check of
        # ``conn.closed`` after its ordering waits); a reader waiting for a slot gets one.
        for _ in range(self._max_in_flight):
            slots.release()


class _CountedAppend:
    """A Produce counted as an append on the way (``ordering.ARRIVALS``) from its read: ``release``
    (its ordering point) stops the count once and calls ``on_release``; ``end`` stops the count
    of a request that ended without reaching its ordering point. Thread-safety: one thread."""

    def __init__(self, on_release: Callable[[], None]) -> None:
        self._on_release = on_release
        self._counting = True

    def end(self) -> None:
        if self._counting:
            self._counting = False
            ordering.ARRIVALS.appended()

    def release(self) -> None:
        self.end()
        self._on_release()


def _opener(loop: asyncio.AbstractEventLoop, gate: asyncio.Future) -> Callable[[], None]:
    """The release callback of one request (called on its worker thread): opens ``gate``."""
    return lambda: loop.call_soon_threadsafe(_open, gate)


def _open(gate: asyncio.Future) -> None:
    if not gate.done():
        gate.set_result(None)


def _finished(unfinished: set[asyncio.Future], gate: asyncio.Future) -> Callable[[asyncio.Future], None]:
    def done(answer: asyncio.Future) -> None:
        unfinished.discard(answer)
        _open(gate)  # a request that never released opens its gate when it ends

    return done
