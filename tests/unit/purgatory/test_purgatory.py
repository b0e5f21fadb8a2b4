"""Purgatory behaviour against a real redis-server: completion, expiry, restarts, dead owners.

Time is a ManualClock: deadlines pass when a test advances it, and ``reaper_round`` /
``advance_and_reap`` wait for the reaper to have acted on the new time, so no test sleeps to let a
deadline pass. Only what Redis or another process does in real time (a liveness key lapsing after
a kill -9) is waited for by polling.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import redis as redis_lib

from lowtide.errors import BrokerNotAvailable, NotLeaderOrFollower, RequestTimedOut
from lowtide.purgatory import Purgatory, build_deadlines_key, build_owner_key
from tests.waiting import wait_until

from .helpers import (
    EXPIRED_METRIC,
    PENDING_METRIC,
    WaitForWatermark,
    Watermark,
    advance_and_reap,
    read_metric,
    reaper_round,
)

PENDING = PENDING_METRIC
EXPIRED = EXPIRED_METRIC


def members_of(redis_client: redis_lib.Redis, name: str) -> set[str]:
    return {m.decode() for m in redis_client.zrange(build_deadlines_key(name), 0, -1)}


def test_op_completes_immediately_when_its_condition_already_holds_and_leaves_nothing_in_redis(
        make_purgatory, clock, redis_client, operation_name):
    purgatory = make_purgatory()
    op = WaitForWatermark(watermark=Watermark(10), target=5, deadline_ms=clock.now() + 5_000)

    assert purgatory.try_complete_else_watch(op, ["orders-0"]) is True

    assert op.wait(0) and op.calls == ["complete"] and op.result == 10
    assert purgatory.pending() == 0
    assert redis_client.exists(build_deadlines_key(operation_name)) == 0
    assert read_metric(PENDING, operation_name) == 0


def test_watched_op_is_completed_by_check_and_complete_and_its_timer_is_removed(
        make_purgatory, clock, redis_client, operation_name):
    purgatory = make_purgatory()
    watermark = Watermark(0)
    deadline = clock.now() + 10_000
    op = WaitForWatermark(watermark=watermark, target=5, deadline_ms=deadline)

    assert purgatory.try_complete_else_watch(op, ["orders-0", "orders-1"]) is False
    member = f"replica-0|{op.op_id}"
    assert redis_client.zscore(build_deadlines_key(operation_name), member) == deadline
    assert purgatory.pending() == 1 and read_metric(PENDING, operation_name) == 1
    assert purgatory.check_and_complete("orders-0") == 0  # condition not yet true

    watermark.value = 7
    assert purgatory.check_and_complete("orders-1") == 1

    assert op.wait(1.0) and op.calls == ["complete"] and op.result == 7 and not op.expired
    assert members_of(redis_client, operation_name) == set()
    assert purgatory.pending() == 0 and read_metric(PENDING, operation_name) == 0
    assert purgatory.count_watched("orders-0") == 0
    assert purgatory.check_and_complete("orders-0") == 0  # nothing completes twice


def test_op_expires_at_its_deadline_even_when_the_reaper_interval_is_longer(
        make_purgatory, clock, redis_client, operation_name):
    # Interval 60 s, deadline 150 ms: the reaper must be woken early by the newly watched op.
    purgatory = make_purgatory(reaper_interval_ms=60_000)
    reaper_round(purgatory)  # the reaper is now asleep on its long interval
    op = WaitForWatermark(watermark=Watermark(0), target=5, deadline_ms=clock.now() + 150)
    purgatory.try_complete_else_watch(op, ["orders-0"])
    clock.advance(150)

    # No wake_reaper() here: only the wake-up caused by watching the op makes the reaper look again
    # within seconds rather than after its 60 s interval.
    assert op.wait(2.0)
    assert op.expired and op.calls == ["expire", "complete"]
    assert isinstance(op.error, RequestTimedOut) and op.result is None
    assert read_metric(EXPIRED, operation_name) == 1
    wait_until(lambda: read_metric(PENDING, operation_name) == 0, timeout_s=1, what="pending gauge at 0")
    assert purgatory.pending() == 0
    assert members_of(redis_client, operation_name) == set()


def test_op_is_still_waiting_one_millisecond_before_its_deadline_and_expires_at_it(
        make_purgatory, clock, redis_client, operation_name):
    purgatory = make_purgatory(reaper_interval_ms=50)
    op = WaitForWatermark(watermark=Watermark(0), target=5, deadline_ms=clock.now() + 150)
    purgatory.try_complete_else_watch(op, ["orders-0"])

    advance_and_reap(clock, purgatory, 149)
    assert not op.is_completed and purgatory.pending() == 1
    assert members_of(redis_client, operation_name) == {f"replica-0|{op.op_id}"}

    advance_and_reap(clock, purgatory, 1)
    assert op.wait(0) and op.expired and op.calls == ["expire", "complete"]
    assert members_of(redis_client, operation_name) == set()


def test_op_completed_just_before_its_deadline_never_expires(make_purgatory, clock, redis_client, operation_name):
    purgatory = make_purgatory(reaper_interval_ms=50)
    watermark = Watermark(0)
    op = WaitForWatermark(watermark=watermark, target=1, deadline_ms=clock.now() + 400)
    purgatory.try_complete_else_watch(op, ["p"])

    advance_and_reap(clock, purgatory, 300)
    watermark.value = 1
    assert purgatory.check_and_complete("p") == 1
    # Reaper rounds at the deadline and well past it, also past deadline + interval where the
    # local-expiry fallback would act.
    advance_and_reap(clock, purgatory, 100)
    advance_and_reap(clock, purgatory, 300)

    assert op.calls == ["complete"] and not op.expired and op.result == 1
    assert read_metric(EXPIRED, operation_name) == 0
    assert members_of(redis_client, operation_name) == set()


def test_second_try_completes_an_op_whose_condition_changed_while_it_was_being_watched(
        make_purgatory, clock, redis_client, operation_name):
    class FlipsAfterFirstCheck(WaitForWatermark):
        def try_complete(self) -> bool:
            done = super().try_complete()
            self.watermark.value = self.target  # the domain moved on right after our first check
            return done

    purgatory = make_purgatory()
    op = FlipsAfterFirstCheck(watermark=Watermark(0), target=3, deadline_ms=clock.now() + 5_000)

    assert purgatory.try_complete_else_watch(op, ["p"]) is True
    assert op.calls == ["complete"] and purgatory.pending() == 0
    assert members_of(redis_client, operation_name) == set()


def test_cancel_all_for_key_fails_the_waiting_ops_with_the_given_error(make_purgatory, clock, redis_client,
                                                                       operation_name):
    purgatory = make_purgatory()
    on_key = [WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 5_000)
              for _ in range(3)]
    elsewhere = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 5_000)
    for op in on_key:
        purgatory.try_complete_else_watch(op, ["orders-0"])
    purgatory.try_complete_else_watch(elsewhere, ["orders-1"])

    assert purgatory.cancel_all_for_key("orders-0", reason_exc=NotLeaderOrFollower("leader moved")) == 3

    for op in on_key:
        assert op.wait(1.0) and isinstance(op.error, NotLeaderOrFollower) and op.calls == ["complete"]
    assert not elsewhere.is_completed and purgatory.pending() == 1
    assert members_of(redis_client, operation_name) == {f"replica-0|{elsewhere.op_id}"}


def test_close_fails_pending_ops_so_blocked_handlers_return(make_purgatory, clock, redis_client, operation_name):
    purgatory = make_purgatory()
    op = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 60_000)
    purgatory.try_complete_else_watch(op, ["p"])

    purgatory.close()

    assert op.wait(0) and isinstance(op.error, BrokerNotAvailable) and not op.expired
    assert members_of(redis_client, operation_name) == set()
    assert redis_client.exists(build_owner_key("replica-0")) == 0
    assert read_metric(PENDING, operation_name) == 0
    with pytest.raises(RuntimeError):
        purgatory.try_complete_else_watch(op, ["p"])


def test_a_failing_try_complete_fails_that_op_without_breaking_check_and_complete(make_purgatory, clock):
    class Broken(WaitForWatermark):
        armed = False

        def try_complete(self) -> bool:
            if self.armed:
                raise ZeroDivisionError("bug in a condition")
            return False

    purgatory = make_purgatory()
    broken = Broken(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 5_000)
    healthy_watermark = Watermark(0)
    healthy = WaitForWatermark(watermark=healthy_watermark, target=1, deadline_ms=clock.now() + 5_000)
    purgatory.try_complete_else_watch(broken, ["p"])
    purgatory.try_complete_else_watch(healthy, ["p"])
    broken.armed = True
    healthy_watermark.value = 1

    assert purgatory.check_and_complete("p") == 2
    assert broken.error is not None and broken.error.name == "UNKNOWN_SERVER_ERROR"
    assert healthy.result == 1 and purgatory.pending() == 0


CRASHING_OWNER = textwrap.dedent("""
    import sys, redis
    from lowtide.purgatory import DelayedOperation, Purgatory, now_ms

    class Never(DelayedOperation):
        def try_complete(self): return False
        def on_complete(self): print("COMPLETED", flush=True)
        def on_expiration(self): print("EXPIRED", flush=True)

    url, name, owner = sys.argv[1:4]
    p = Purgatory(name=name, redis=redis.Redis.from_url(url), owner=owner, reaper_interval_ms=100)
    p.start()
    for i in range(3):
        p.try_complete_else_watch(Never(deadline_ms=now_ms() + 60_000, op_id=f"op{i}"), ["orders-0"])
    print("READY", flush=True)
    sys.stdin.read()  # hold the timers until killed (EOF, i.e. the test process gone, ends it too)
""")


def run_owner_and_kill_it(redis_url: str, name: str, owner: str) -> None:
    """Run a real process that watches 3 ops, then kill -9 it: its timers stay in Redis."""
    with subprocess.Popen([sys.executable, "-c", CRASHING_OWNER, redis_url, name, owner],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "READY"
        finally:
            proc.kill()


def test_restart_of_a_crashed_owner_removes_its_leftover_timers_without_completing_anything(
        make_purgatory, clock, redis_client, redis_url, operation_name):
    run_owner_and_kill_it(redis_url, operation_name, "replica-0")
    redis_client.set(build_owner_key("replica-1"), "replica-1", px=60_000)
    redis_client.zadd(build_deadlines_key(operation_name), {"replica-1|theirs": clock.now() + 60_000})
    assert {f"replica-0|op{i}" for i in range(3)} <= members_of(redis_client, operation_name)

    purgatory = make_purgatory(owner="replica-0", reaper_interval_ms=50)

    # Removed by start() itself, before any reaper round, and none counted as expired.
    assert members_of(redis_client, operation_name) == {"replica-1|theirs"}
    assert read_metric(EXPIRED, operation_name) == 0 and purgatory.pending() == 0
    # The new incarnation works normally afterwards.
    op = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 5_000)
    purgatory.try_complete_else_watch(op, ["orders-0"])
    assert members_of(redis_client, operation_name) == {"replica-1|theirs", f"replica-0|{op.op_id}"}


def test_due_timers_of_a_dead_foreign_owner_are_reaped_and_those_of_a_live_owner_are_kept(
        make_purgatory, clock, redis_client, operation_name):
    key = build_deadlines_key(operation_name)
    redis_client.set(build_owner_key("replica-1"), "replica-1", px=60_000)
    redis_client.zadd(key, {"replica-9|gone": clock.now() - 10, "replica-1|alive": clock.now() - 10,
                            "replica-9|later": clock.now() + 60_000})

    purgatory = make_purgatory(owner="replica-0", reaper_interval_ms=50)

    reaper_round(purgatory)
    assert "replica-9|gone" not in members_of(redis_client, operation_name)
    for _ in range(3):  # a few more reaper rounds: the live owner's due member is its own business
        advance_and_reap(clock, purgatory, 50)
    assert members_of(redis_client, operation_name) == {"replica-1|alive", "replica-9|later"}
    assert read_metric(EXPIRED, operation_name) == 0


def test_timers_of_an_owner_killed_with_sigkill_are_reaped_once_its_liveness_key_lapses(
        make_purgatory, clock, redis_client, redis_url, operation_name):
    run_owner_and_kill_it(redis_url, operation_name, "replica-2")
    # Make the crashed owner's timers due now, as they would be after their deadline.
    key = build_deadlines_key(operation_name)
    redis_client.zadd(key, {f"replica-2|op{i}": clock.now() - 1 for i in range(3)}, xx=True)

    make_purgatory(owner="replica-0", reaper_interval_ms=50)

    # Its liveness TTL is max(3 x 100 ms, 1 s) of real time, kept by Redis, which the test clock
    # does not drive: poll while the reaper (every 50 ms, real time) finds the key gone.
    wait_until(lambda: members_of(redis_client, operation_name) == set(), timeout_s=3,
               what="the killed owner's timers reaped")


def test_pending_gauge_counts_ops_watched_in_this_process(make_purgatory, clock, operation_name):
    purgatory = make_purgatory()
    watermark = Watermark(0)
    ops = [WaitForWatermark(watermark=watermark, target=1, deadline_ms=clock.now() + 5_000)
           for _ in range(4)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"p{i % 2}"])
    assert read_metric(PENDING, operation_name) == 4 and purgatory.pending() == 4

    watermark.value = 1
    assert purgatory.check_and_complete("p0") == 2
    assert read_metric(PENDING, operation_name) == 2
    assert purgatory.check_and_complete("p1") == 2
    assert read_metric(PENDING, operation_name) == 0


def test_an_op_with_the_same_id_cannot_be_watched_twice(make_purgatory, clock):
    purgatory = make_purgatory()
    op = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 5_000, op_id="x")
    purgatory.try_complete_else_watch(op, ["p"])
    twin = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 5_000, op_id="x")
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(twin, ["p"])
    assert purgatory.pending() == 1


def test_invalid_arguments_are_rejected(redis_client, make_purgatory, clock):
    with pytest.raises(ValueError):
        Purgatory(name="DeleteRecords", redis=redis_client, owner="a|b")
    with pytest.raises(ValueError):
        Purgatory(name="DeleteRecords", redis=redis_client, owner="a", reaper_interval_ms=0)
    with pytest.raises(ValueError):
        WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=0, op_id="has|pipe")
    purgatory = make_purgatory()
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(
            WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 100), [])
