"""Handlers as steps: the same generator driven on a blocking thread and on an event loop."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest

from lowtide.rpc.steps import Blocking, drive_on_loop, run_blocking


class FlagWait:
    """Done once ``flag`` is set; records how it ended."""

    def __init__(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.flag = False
        self.event = None
        self.outcome = ""
        self.armed = self.disarmed = 0

    def arm(self, event) -> None:
        self.event, self.armed = event, self.armed + 1

    def check(self) -> bool:
        if self.flag:
            self.outcome = "done"
        return self.flag

    def expire(self) -> None:
        self.outcome = "expired"

    def disarm(self) -> None:
        self.disarmed += 1

    def finish_from_another_thread(self, after_s: float) -> threading.Thread:
        def run() -> None:
            time.sleep(after_s)
            self.flag = True
            self.event.set()

        thread = threading.Thread(target=run)
        thread.start()
        return thread


def handler(wait: FlagWait, log: list[str]):
    log.append("appended")
    yield wait
    log.append(f"wait {wait.outcome}")
    got = yield Blocking(lambda: threading.current_thread().name)
    log.append(f"blocking ran on {got}")
    try:
        yield Blocking(lambda: 1 / 0)
    except ZeroDivisionError:
        log.append("blocking error thrown in")
    return "answer"


def drive(steps, *, executor: ThreadPoolExecutor, timeout_s: float = 5.0):
    """Run ``steps`` on a fresh loop in this thread; returns (answer, error, loop thread name)."""
    loop = asyncio.new_event_loop()
    finished = loop.create_future()
    try:
        loop.call_soon(lambda: drive_on_loop(steps, loop=loop, executor=executor,
                                             done=lambda value, error: finished.set_result((value, error))))
        return loop.run_until_complete(asyncio.wait_for(finished, timeout_s))
    finally:
        loop.close()


def woken_after_arming(wait: FlagWait, after_s: float) -> list[threading.Thread]:
    """Make ``wait`` finish from another thread ``after_s`` after it is armed."""
    wakers: list[threading.Thread] = []
    original_arm = wait.arm

    def arm(event) -> None:
        original_arm(event)
        wakers.append(wait.finish_from_another_thread(after_s))

    wait.arm = arm
    return wakers


def test_run_blocking_parks_on_a_wait_until_another_thread_wakes_it() -> None:
    wait, log = FlagWait(timeout_s=5), []
    wakers = woken_after_arming(wait, 0.05)
    assert run_blocking(handler(wait, log)) == "answer"
    for thread in wakers:
        thread.join()
    assert log == ["appended", "wait done", f"blocking ran on {threading.current_thread().name}",
                   "blocking error thrown in"]
    assert (wait.armed, wait.disarmed) == (1, 1)


def test_run_blocking_expires_a_wait_at_its_deadline() -> None:
    wait, log = FlagWait(timeout_s=0.05), []
    started = time.monotonic()
    assert run_blocking(handler(wait, log)) == "answer"
    assert wait.outcome == "expired"
    assert time.monotonic() - started >= 0.05
    assert wait.disarmed == 1


def test_on_a_loop_a_wake_up_from_another_thread_resumes_the_handler_and_blocking_runs_on_the_executor() -> None:
    wait, log = FlagWait(timeout_s=5), []
    wakers = woken_after_arming(wait, 0.05)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="blocking") as executor:
        answer, error = drive(handler(wait, log), executor=executor)
    for thread in wakers:
        thread.join()
    assert (answer, error) == ("answer", None)
    assert log[0:2] == ["appended", "wait done"]
    assert log[2].startswith("blocking ran on blocking"), log
    assert log[3] == "blocking error thrown in"
    assert (wait.armed, wait.disarmed) == (1, 1)


def test_on_a_loop_a_wait_nobody_wakes_expires_at_its_deadline() -> None:
    wait, log = FlagWait(timeout_s=0.05), []
    with ThreadPoolExecutor(max_workers=1) as executor:
        answer, error = drive(handler(wait, log), executor=executor)
    assert (answer, error) == ("answer", None)
    assert wait.outcome == "expired"
    assert wait.disarmed == 1


def test_on_a_loop_an_error_raised_by_the_handler_reaches_done() -> None:
    def failing():
        yield Blocking(lambda: None)
        raise ValueError("bad request")

    with ThreadPoolExecutor(max_workers=1) as executor:
        answer, error = drive(failing(), executor=executor)
    assert answer is None
    assert isinstance(error, ValueError)
    with pytest.raises(ValueError, match="bad request"):
        run_blocking(failing())


class Answer:
    """A handler's answer that can be watched with a weak reference."""


def test_on_a_loop_nothing_but_the_caller_keeps_a_finished_handlers_answer_alive():
    # A reference cycle through the driver kept follower answers (megabytes) until the cyclic
    # collector ran: with it off, the answer must go as soon as the caller drops it.
    def handler(wait: FlagWait):
        yield wait
        yield Blocking(lambda: None)
        return Answer()

    gc.disable()
    try:
        wait = FlagWait(timeout_s=5)
        woken_after_arming(wait, 0.01)
        with ThreadPoolExecutor(max_workers=1) as executor:
            answer, error = drive(handler(wait), executor=executor)
        assert error is None
        watched = weakref.ref(answer)
        del answer
        assert watched() is None, gc.get_referrers(watched())
    finally:
        gc.enable()
