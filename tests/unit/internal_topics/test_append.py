"""The internal topics' append and its one retry policy (lowtide/internal_topics/append.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from lowtide.errors import (
    CoordinatorNotAvailable,
    LeaderNotAvailable,
    LowtideError,
    NotLeaderOrFollower,
    OutOfOrderSequenceNumber,
    RequestTimedOut,
)
from lowtide.internal_topics import Appender, AppendPolicy, RetryPolicy
from lowtide.rpc.steps import Blocking, Sleep, run_blocking
from tests.unit.internal_topics.fakes import FakeProduce, FakeRouter

FAST = RetryPolicy(step_s=0.001, max_backoff_s=0.002)


def appender(router, produce, **policy) -> Appender:
    return Appender(topic="__internal", router=router, produce=produce,
                    policy=AppendPolicy(retry=policy.pop("retry", FAST), **policy))


def test_the_back_off_grows_per_attempt_up_to_its_cap_and_stops_before_the_deadline():
    policy = RetryPolicy()
    assert [policy.backoff_s(a) for a in (1, 2, 10, 11, 50)] == [0.05, 0.1, 0.5, 0.5, 0.5]
    assert policy.has_time(1, time.monotonic() + 1)
    assert not policy.has_time(30, time.monotonic() + 1)  # 1.5 s of steps would end past it


def test_an_acknowledged_append_returns_its_base_offset():
    produce = FakeProduce(41)
    assert appender(FakeRouter("a:1"), produce).append(3, b"x", timeout_ms=1000, expected_end_offset=40) == 41
    assert produce.calls[0]["address"] == "a:1" and produce.calls[0]["partition"] == 3
    assert produce.calls[0]["expected_end_offset"] == 40


def test_retriable_answers_and_lookups_are_retried_with_the_leader_looked_up_again():
    router = FakeRouter(LeaderNotAvailable("none yet"), "a:1", "b:1")
    produce = FakeProduce(NotLeaderOrFollower("moved"), 7)
    assert appender(router, produce).append(0, b"x", timeout_ms=5000) == 7
    assert router.lookups == [False, True, True] and [c["address"] for c in produce.calls] == ["a:1", "b:1"]
    assert router.forgotten == 2


def test_a_refused_conditional_append_is_raised_at_once():
    produce = FakeProduce(OutOfOrderSequenceNumber("the log moved on"), 1)
    with pytest.raises(OutOfOrderSequenceNumber):
        appender(FakeRouter("a:1"), produce).append(0, b"x", timeout_ms=5000, expected_end_offset=3)
    assert len(produce.calls) == 1


def test_past_the_deadline_the_policy_says_what_is_raised():
    def give_up(where: str, problem: LowtideError) -> LowtideError:
        return CoordinatorNotAvailable(f"{where}: {problem.name}")

    with pytest.raises(CoordinatorNotAvailable, match="__internal-2: NOT_LEADER_OR_FOLLOWER"):
        appender(FakeRouter("a:1"), FakeProduce(NotLeaderOrFollower("moved")), give_up=give_up).append(
            2, b"x", timeout_ms=30)
    with pytest.raises(NotLeaderOrFollower):  # no give_up: the last failure itself
        appender(FakeRouter("a:1"), FakeProduce(NotLeaderOrFollower("moved"))).append(2, b"x", timeout_ms=30)


def test_a_failed_call_is_retried_unless_the_policy_makes_it_final():
    assert appender(FakeRouter("a:1"), FakeProduce(("raise", RequestTimedOut("slow")), 5)).append(
        0, b"x", timeout_ms=5000) == 5
    router = FakeRouter("a:1", cached="a:1")
    produce = FakeProduce(("raise", RequestTimedOut("slow")), 5)
    with pytest.raises(RequestTimedOut):
        appender(router, produce, call_errors_final=True).append(0, b"x", timeout_ms=5000)
    assert len(produce.calls) == 1 and router.cached is None


def test_only_what_retry_on_accepts_is_retried():
    produce = FakeProduce(NotLeaderOrFollower("moved"), 5)
    with pytest.raises(NotLeaderOrFollower):
        appender(FakeRouter("a:1"), produce, retry_on=lambda err: False).append(0, b"x", timeout_ms=5000)
    assert len(produce.calls) == 1


def test_each_attempt_gets_what_is_left_of_the_timeout_or_the_whole_of_it():
    produce = FakeProduce(NotLeaderOrFollower("moved"), 5)
    appender(FakeRouter("a:1"), produce, retry=RetryPolicy(step_s=0.02)).append(0, b"x", timeout_ms=1000)
    assert produce.calls[0]["timeout_ms"] <= 1000 and produce.calls[1]["timeout_ms"] < 1000
    produce = FakeProduce(NotLeaderOrFollower("moved"), 5)
    appender(FakeRouter("a:1"), produce, retry=RetryPolicy(step_s=0.02), whole_timeout_each_attempt=True).append(
        0, b"x", timeout_ms=1000)
    assert [c["timeout_ms"] for c in produce.calls] == [1000, 1000]


def test_a_cached_leader_costs_no_blocking_step_and_back_offs_are_sleeps():
    # The coordinator's hot path on its event loop: with the leader cached and a transport that
    # answers on the loop, the first step the append yields is the transport's own.
    router = FakeRouter("b:1", cached="a:1")
    produce = FakeProduce(NotLeaderOrFollower("moved"), 9, blocking=False)
    loop = asyncio.new_event_loop()
    try:
        steps = appender(router, produce).append_steps(0, b"x", timeout_ms=5000, loop=loop)
        first = next(steps)  # the answer came at once: the retry's back-off
        assert isinstance(first, Sleep)
        assert isinstance(steps.send(None), Blocking)  # the leader looked up again
        assert run_blocking_from(steps, "b:1") == 9
        assert produce.calls[0]["loop"] is loop and produce.calls[0]["address"] == "a:1"
    finally:
        loop.close()


def run_blocking_from(steps, value):
    """Finish ``steps`` on this thread, sending ``value`` first."""

    def resume():
        sent = yield from _send(steps, value)
        return sent

    return run_blocking(resume())


def _send(steps, value):
    try:
        item = steps.send(value)
    except StopIteration as stop:
        return stop.value
    while True:
        got = yield item
        try:
            item = steps.send(got)
        except StopIteration as stop:
            return stop.value
