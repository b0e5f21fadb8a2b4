"""Races: many ops, many threads, completions racing the reaper, and a Redis outage.

Deadlines pass by advancing the test's ManualClock, never by sleeping; what races is real: the
completing threads run free while the reaper expires what the clock made due.
"""

from __future__ import annotations

import random
import threading

import redis as redis_lib

from lowtide.common.procs import start_redis
from lowtide.errors import NotLeaderOrFollower
from lowtide.purgatory import build_deadlines_key

from .helpers import (
    EXPIRED_METRIC,
    PENDING_METRIC,
    WaitForWatermark,
    Watermark,
    advance_and_reap,
    read_metric,
    reaper_round,
)


def test_many_ops_completed_from_many_threads_while_the_reaper_expires_some_complete_exactly_once(
        make_purgatory, clock, redis_client, operation_name):
    purgatory = make_purgatory(reaper_interval_ms=20)
    rng = random.Random(7)
    keys = [f"orders-{i}" for i in range(16)]
    watermarks = {key: Watermark(0) for key in keys}
    ops: list[WaitForWatermark] = []
    lock = threading.Lock()

    def watch_some(count: int) -> None:
        for _ in range(count):
            key = rng.choice(keys)
            # Deadlines spread over the window in which the completing threads run, so expiry and
            # completion genuinely race for a good share of the ops.
            # A third of the targets are never reached: those end by expiry, cancel or force_complete.
            target = rng.randint(1, 40) if rng.random() < 0.67 else 10**9
            op = WaitForWatermark(watermark=watermarks[key], target=target,
                                  deadline_ms=clock.now() + rng.randint(0, 400))
            with lock:
                ops.append(op)
            purgatory.try_complete_else_watch(op, [key, "all"])

    def complete_some(stop: threading.Event) -> None:
        local = random.Random()
        while not stop.is_set():
            key = local.choice(keys)
            watermarks[key].value += 1
            purgatory.check_and_complete(key)
            if local.random() < 0.0005:
                purgatory.cancel_all_for_key(key, reason_exc=NotLeaderOrFollower("leader moved"))
            with lock:
                victim = local.choice(ops) if ops else None
            if victim is not None and local.random() < 0.005:
                victim.force_complete()

    stop = threading.Event()
    completers = [threading.Thread(target=complete_some, args=(stop,)) for _ in range(6)]
    watchers = [threading.Thread(target=watch_some, args=(100,)) for _ in range(6)]
    for thread in completers + watchers:
        thread.start()
    for thread in watchers:
        thread.join(10)
    # The clock crosses the deadlines in 10 ms steps while the completers keep going; after each
    # step the reaper expires what became due, racing them.
    for _ in range(45):
        advance_and_reap(clock, purgatory, 10)
    stop.set()
    for thread in completers:
        thread.join(10)

    # Every op ends by its deadline (the clock is past all of them), and every op ends exactly once.
    assert all(op.wait(3.0) for op in ops)
    assert len(ops) == 600
    for op in ops:
        assert op.calls in (["complete"], ["expire", "complete"]), op.calls
        assert op.expired == (op.calls == ["expire", "complete"])
    expired = sum(op.expired for op in ops)
    assert 0 < expired < len(ops)  # the race was real: both outcomes happened
    assert read_metric(EXPIRED_METRIC, operation_name) == expired
    assert read_metric(PENDING_METRIC, operation_name) == 0
    assert purgatory.pending() == 0 and purgatory.count_watched("all") == 0
    assert redis_client.zcard(build_deadlines_key(operation_name)) == 0


def test_a_redis_outage_neither_crashes_the_reaper_nor_fails_a_completion(make_purgatory, clock, tmp_path,
                                                                           operation_name):
    server = start_redis(tmp_path / "redis", appendonly=False)
    client = redis_lib.Redis.from_url(server.url, socket_timeout=1, socket_connect_timeout=1)
    try:
        purgatory = make_purgatory(reaper_interval_ms=50, redis=client)
        watermark = Watermark(0)
        watched_before = WaitForWatermark(watermark=watermark, target=1, deadline_ms=clock.now() + 10_000)
        purgatory.try_complete_else_watch(watched_before, ["p"])

        server.stop()
        for _ in range(3):  # several reaper rounds against a dead Redis, each finishing normally
            reaper_round(purgatory)

        # Completion still works and its result is intact; the failed ZREM is only logged.
        watermark.value = 1
        assert purgatory.check_and_complete("p") == 1
        assert watched_before.wait(1.0) and watched_before.result == 1 and watched_before.error is None
        # An op watched during the outage (its ZADD fails) still ends: from its local deadline, once
        # that is more than one reaper interval (50 ms) past.
        during = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 100)
        assert purgatory.try_complete_else_watch(during, ["q"]) is False
        advance_and_reap(clock, purgatory, 151)
        assert during.wait(2.0) and during.expired
        assert purgatory.is_running

        # Redis comes back on the same port: Redis-driven expiry resumes.
        server = start_redis(tmp_path / "redis", port=server.port, appendonly=False)
        after = WaitForWatermark(watermark=Watermark(0), target=1, deadline_ms=clock.now() + 100)
        purgatory.try_complete_else_watch(after, ["r"])
        # At its deadline, not past deadline + interval: only the Redis-driven path can expire it.
        advance_and_reap(clock, purgatory, 100)
        assert after.wait(2.0) and after.expired
        assert read_metric(EXPIRED_METRIC, operation_name) == 2
        assert client.zcard(build_deadlines_key(operation_name)) == 0
    finally:
        purgatory.close()
        client.close()
        server.stop()
