"""Request handlers written once, run either on a thread that may block or on an event loop that
may not.

Why (issue 32): a Kafka Produce with acks=all spends most of its life waiting for the followers.
Run on a worker thread, each request cost four thread hand-offs (listener loop -> worker, the
worker parked on the HW and woken, the answer back to the loop, the ordering point back to the
loop), and on a 2-core VM a hand-off costs more CPU than the append. Written as a generator the
same handler runs on the listener's loop: it appends there, *yields* what it must wait for, and
is resumed by a callback when that is done; nothing parks a thread.

A handler is a generator that yields one of:

- a ``Wait``: a condition others make true (the HW passing an offset). ``arm(event)`` registers a
  wake-up (anything with ``set()``, called from any thread), ``check()`` says whether it is done,
  ``expire()`` settles it at ``deadline`` (``time.monotonic()``), ``disarm()`` unregisters.
  Nothing is sent back: the handler reads the outcome from the object it yielded.
- a ``Blocking``: a call that may block (a diskless commit); its return value is sent back, its
  exception thrown in.

and returns its answer. ``run_blocking`` drives one on the calling thread (gRPC methods, the Kafka
listener's workers); ``drive_on_loop`` drives one on an asyncio loop.

Thread-safety: a handler runs on one thread at a time; ``drive_on_loop`` must be called on the
loop's thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Wait(Protocol):
    deadline: float

    def arm(self, event: Any) -> None: ...

    def check(self) -> bool: ...

    def expire(self) -> None: ...

    def disarm(self) -> None: ...


class Sleep:
    """A ``Wait`` nothing wakes: done ``seconds`` from now (a retry's back-off, on a thread or a loop)."""

    __slots__ = ("deadline",)

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + max(0.0, seconds)

    def arm(self, event: Any) -> None:
        pass

    def check(self) -> bool:
        return time.monotonic() >= self.deadline

    def expire(self) -> None:
        pass

    def disarm(self) -> None:
        pass


@dataclass(frozen=True)
class Blocking:
    """A call that may block; run where blocking is allowed."""

    call: Callable[[], Any]


Steps = Generator["Wait | Blocking", Any, T]


def run_blocking(steps: Steps[T]) -> T:
    """Drive ``steps`` on this thread, parking it on each wait."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            item = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            return stop.value
        except BaseException:
            # The error's traceback holds this frame: were the frame to keep what the handler was
            # sent (an answer that may carry this very error), the two would be a cycle only the
            # cyclic collector frees.
            value = error = None
            raise
        value, error = None, None
        if isinstance(item, Blocking):
            try:
                value = item.call()
            except Exception as exc:  # handed to the handler, as the loop driver does
                error = exc
        else:
            wait_until_done(item)


def wait_until_done(wait: Wait) -> None:
    """Park this thread until ``wait`` is done or expired."""
    event = threading.Event()
    wait.arm(event)
    try:
        while True:
            event.clear()  # before checking: a wake-up during the check is not lost
            if wait.check():
                return
            left = wait.deadline - time.monotonic()
            if left <= 0:
                wait.expire()
                return
            event.wait(left)
    finally:
        wait.disarm()


class LoopWake:
    """A wake-up that schedules ``callback`` on the loop, at most one pending at a time (a wait's
    re-check; a coordinator shard's writer run).

    ``set`` is called from any thread (a follower fetch moving the HW); the flag is cleared before
    the check runs, so a ``set`` during the check schedules another one. Made on the loop's thread:
    a ``set`` from that thread (an append or an HW move made on the loop) schedules without waking
    the loop through its self-pipe (a write and a read per wake-up otherwise)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop, self._callback = loop, callback
        self._pending = False
        self._loop_thread = threading.get_ident()

    def set(self) -> None:
        if not self._pending:
            self._pending = True
            try:
                if threading.get_ident() == self._loop_thread:
                    self._loop.call_soon(self._fire)
                else:
                    self._loop.call_soon_threadsafe(self._fire)
            except RuntimeError:  # the loop is closed: its listener stopped, nobody waits for this
                pass

    def _fire(self) -> None:
        self._pending = False
        self._callback()


def drive_on_loop(steps: Steps[Any], *, loop: asyncio.AbstractEventLoop, executor: Executor,
                  done: Callable[[Any, BaseException | None], None],
                  around_step: Callable[[], Any] | None = None) -> None:
    """Drive ``steps`` on ``loop`` (called on its thread): each step runs on the loop, a ``Wait``
    resumes it from a wake-up or its deadline, a ``Blocking`` runs on ``executor``. ``done(answer,
    error)`` is called once, on the loop. ``around_step()`` returns a context manager entered around
    each step (the ordering point, ``ordering.serving``)."""
    _LoopDriver(steps, loop=loop, executor=executor, done=done, around_step=around_step).step()


def drive_to_future(steps: Steps[T], *, loop: asyncio.AbstractEventLoop, executor: Executor,
                    around_step: Callable[[], Any] | None = None,
                    before_settle: Callable[[], None] | None = None,
                    future: Any = None) -> Any:
    """``drive_on_loop`` whose answer (or error) settles the returned future; ``before_settle``
    runs first (a request's ordering point, when it never reached one). ``future``: the one to
    settle (an asyncio or a ``concurrent.futures`` future; default a new one of ``loop``)."""
    if future is None:
        future = loop.create_future()

    def done(value: Any, error: BaseException | None) -> None:
        if before_settle is not None:
            before_settle()
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    drive_on_loop(steps, loop=loop, executor=executor, done=done, around_step=around_step)
    return future


class _LoopDriver:
    """One handler driven on a loop (``drive_on_loop``).

    Why a class and not closures: two closures calling each other (a step and its resume) are a
    reference cycle, freed only by the cyclic collector, and the cycle held the request's answer
    (a follower round's, up to replica.fetch.max.bytes): under load the collector ran late and a
    leader's RSS grew by tens of MiB. Here nothing refers back to the driver once a step ran but
    the one callback registered for the next (dropped when it fires), and the driver lets go of
    the handler and of ``done`` when it finishes."""

    __slots__ = ("steps", "loop", "executor", "done", "around_step")

    def __init__(self, steps: Steps[Any], *, loop: asyncio.AbstractEventLoop, executor: Executor,
                 done: Callable[[Any, BaseException | None], None], around_step: Callable[[], Any] | None) -> None:
        self.steps, self.loop, self.executor, self.done, self.around_step = steps, loop, executor, done, around_step

    def step(self, value: Any = None, error: BaseException | None = None) -> None:
        steps = self.steps
        try:
            with self.around_step() if self.around_step is not None else _NULL:
                item = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            self._finish(stop.value, None)
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, as a worker's future would
            value = error = None  # not kept by the frame the error's traceback holds (run_blocking)
            self._finish(None, exc)
            return
        if isinstance(item, Blocking):
            self.loop.run_in_executor(self.executor, item.call).add_done_callback(self._resume_after)
        else:
            _LoopWait(item, self).start()

    def _resume_after(self, future: asyncio.Future) -> None:
        if future.cancelled():  # the executor shut down: the service is stopping
            self.step(None, RuntimeError("stopped while a blocking call was pending"))
        elif future.exception() is not None:
            self.step(None, future.exception())
        else:
            self.step(future.result())

    def _finish(self, value: Any, error: BaseException | None) -> None:
        done = self.done
        self.steps = self.done = self.around_step = None
        done(value, error)


class _LoopWait:
    """One ``Wait`` of a driven handler: settled by a wake-up or its deadline, then the handler
    resumes. The wait, its wake-up and its timer refer to each other while it is pending; settling
    it disarms the wait and cancels the timer, which breaks every one of those links."""

    __slots__ = ("wait", "driver", "timer", "finished")

    def __init__(self, wait: Wait, driver: _LoopDriver) -> None:
        self.wait, self.driver = wait, driver
        self.timer: asyncio.TimerHandle | None = None
        self.finished = False

    def start(self) -> None:
        wait, loop = self.wait, self.driver.loop
        wait.arm(LoopWake(loop, self.check))
        self.check()
        if not self.finished:
            # The timer settles it even if the loop's clock fires a hair before time.monotonic() agrees.
            self.timer = loop.call_later(max(0.0, wait.deadline - time.monotonic()), self.check, True)

    def check(self, at_deadline: bool = False) -> None:
        if self.finished:
            return
        wait = self.wait
        if wait.check():
            pass
        elif at_deadline or time.monotonic() >= wait.deadline:
            wait.expire()
        else:
            return
        self.finished = True
        wait.disarm()
        if self.timer is not None:
            self.timer.cancel()  # clears the handle's reference to check
            self.timer = None
        driver, self.driver, self.wait = self.driver, None, None
        driver.step()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()
