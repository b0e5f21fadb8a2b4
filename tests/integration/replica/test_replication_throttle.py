"""KIP-73 replication throttle on real processes (2 replicas, a front door, a real redis-server):
a follower that was stopped while ~4 MB were produced catches up at 1 MB/s within 10 %, first
under the leader's ``leader.replication.throttled.rate`` (set cluster-wide through
Admin.AlterConfigs, the topic's ``leader.replication.throttled.replicas`` = ``*``), then under its
own broker's ``follower.replication.throttled.rate`` (the topic's follower list naming its
replica); with no rate the same copy is several times faster. The follower is out of the ISR while
it copies (the throttle applies only then) and joins it once caught up.
"""

from __future__ import annotations

import time

from lowtide_pb import admin_pb2
from tests.integration import support as s

TOPIC = "throttled"
RATE = 1_000_000  # bytes/s
BATCHES, RECORDS, VALUE_BYTES = 40, 100, 1000  # ~4 MB per phase
LEADER_RATE, LEADER_LIST = "leader.replication.throttled.rate", "leader.replication.throttled.replicas"
FOLLOWER_RATE, FOLLOWER_LIST = "follower.replication.throttled.rate", "follower.replication.throttled.replicas"


def alter(cluster, resource: str, key: str, value: str | None) -> None:
    op = admin_pb2.ConfigOp(key=key, op=admin_pb2.CONFIG_SET if value is not None else admin_pb2.CONFIG_DELETE)
    if value is not None:
        op.value = value
    resp = s.admin(cluster).AlterConfigs(admin_pb2.AlterConfigsRequest(resources=[
        admin_pb2.AlterConfigsResource(topic=resource, ops=[op])]))
    assert resp.results[0].error_code == 0, resp


def isr(cluster) -> tuple[int, ...]:
    return tuple(s.store(cluster).partition_state(TOPIC, 0).isr)


def produce_while_stopped(cluster, *, leader: int, follower: int, phase: int) -> tuple[int, int]:
    """Stop the follower, wait until it left the ISR, produce one phase's data; returns the
    follower's LEO when stopped and the leader's LEO after."""
    start_leo = s.describe(cluster, follower, TOPIC).log_end_offset
    cluster.stop_service(f"replica-{follower}")
    s.wait_until(lambda: isr(cluster) == (leader,), what="the stopped follower out of the ISR")
    for b in range(BATCHES):
        values = [b"%d-%d-%d-" % (phase, b, i) + b"x" * VALUE_BYTES for i in range(RECORDS)]
        assert s.produce(cluster, TOPIC, values, acks=-1, leader=leader).error_code == 0
    return start_leo, s.describe(cluster, leader, TOPIC).log_end_offset


def catch_up(cluster, *, follower: int, start_leo: int, end_leo: int) -> list[tuple[float, int]]:
    """Start the follower and sample (time, its LEO) every 20 ms until it reached ``end_leo``; the
    first sample is the moment the restarted follower answered its health check."""
    cluster.start_service(f"replica-{follower}")
    samples: list[tuple[float, int]] = [(time.monotonic(), start_leo)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            leo = s.describe(cluster, follower, TOPIC).log_end_offset
        except AssertionError:  # not hosted yet
            leo = start_leo
        samples.append((time.monotonic(), leo))
        if leo >= end_leo:
            return samples
        time.sleep(0.02)
    raise AssertionError(f"follower did not catch up: {samples[-1]} of {end_leo}")


def first_at(samples: list[tuple[float, int]], offset: int) -> float:
    return next(t for t, leo in samples if leo >= offset)


def throttled_copy(cluster, *, leader: int, follower: int, phase: int, direction: str) -> float:
    """One phase's copy under a throttle of ``RATE`` on ``direction``'s side: checks the steady
    rate, the time the copy took, that the follower joins the ISR after and that the throttled
    side counted the bytes. Returns the seconds from the restart to caught up."""
    start_leo, end_leo = produce_while_stopped(cluster, leader=leader, follower=follower, phase=phase)
    log_bytes = s.describe(cluster, leader, TOPIC).size_bytes
    copy_bytes = log_bytes * (end_leo - start_leo) / end_leo
    samples = catch_up(cluster, follower=follower, start_leo=start_leo, end_leo=end_leo)
    # The steady rate, from 30 % of the copy (the bucket's initial burst is long spent) to the end.
    from_offset = start_leo + int(0.3 * (end_leo - start_leo))
    steady_s = first_at(samples, end_leo) - first_at(samples, from_offset)
    measured = copy_bytes * 0.7 / steady_s
    # The whole copy: an idle bucket holds at most its capacity (1 MiB here, one max batch), which
    # the first read takes at once; everything after it comes at the rate. The copy may start
    # while the restarted follower is still starting up, before the samples begin: count from the
    # first sample once the burst is spent.
    burst = 1 << 20
    bytes_per_offset = copy_bytes / (end_leo - start_leo)
    counted_from = max(start_leo + int(burst / bytes_per_offset), samples[1][1])
    copy_s = first_at(samples, end_leo) - first_at(samples, counted_from)
    counted_bytes = (end_leo - counted_from) * bytes_per_offset
    expected_s = counted_bytes / RATE
    since_restart_s = first_at(samples, end_leo) - samples[0][0]
    print(f"{direction} throttle: {copy_bytes / 1e6:.2f} MB, steady rate {measured / 1e6:.3f} MB/s "
          f"(target {RATE / 1e6:.3f}), {copy_s:.2f} s for the {counted_bytes / 1e6:.2f} MB after the burst "
          f"(expected {expected_s:.2f} s), {since_restart_s:.2f} s after the restart")
    assert abs(measured - RATE) / RATE < 0.10, measured
    assert abs(copy_s - expected_s) / expected_s < 0.10, (copy_s, expected_s)
    s.wait_until(lambda: isr(cluster) == tuple(sorted((leader, follower))), what="the caught-up follower in the ISR")
    counted_on = leader if direction == "leader" else follower
    throttled = s.metric(cluster, f"replica-{counted_on}", "lowtide_replication_throttled_bytes_total",
                         direction=direction)
    if direction == "follower":  # the follower restarted: its counter holds this copy only
        assert copy_bytes * 0.95 <= throttled <= copy_bytes * 1.05, (throttled, copy_bytes)
    else:
        assert throttled >= copy_bytes * 0.95, (throttled, copy_bytes)
    return since_restart_s


def rate_in_force(cluster, broker: int, direction: str) -> float:
    return s.metric(cluster, f"replica-{broker}", "lowtide_replication_throttle_rate_bytes", direction=direction)


def test_a_catching_up_follower_copies_at_the_throttle_rate_and_much_faster_without(cluster_factory):
    cluster = cluster_factory(replicas=2, coordinators=0)
    s.create_topic(cluster, TOPIC, partitions=1, rf=2, config={"segment.bytes": str(1 << 20)})
    leader = s.leader_of(cluster, TOPIC)
    follower = 1 - leader

    # -- the leader's side: the cluster-wide default rate, every replica of the topic listed ----------
    alter(cluster, TOPIC, LEADER_LIST, "*")
    alter(cluster, "broker:", LEADER_RATE, str(RATE))
    s.wait_until(lambda: rate_in_force(cluster, leader, "leader") == RATE, what="the leader's rate in force")
    throttled_s = throttled_copy(cluster, leader=leader, follower=follower, phase=1, direction="leader")

    # -- the follower's side: its own broker's rate, its replica listed --------------------------------
    alter(cluster, "broker:", LEADER_RATE, None)
    alter(cluster, f"broker:{follower}", FOLLOWER_RATE, str(RATE))
    alter(cluster, TOPIC, FOLLOWER_LIST, f"0:{follower}")
    s.wait_until(lambda: rate_in_force(cluster, leader, "leader") == -1, what="the leader unthrottled")
    throttled_copy(cluster, leader=leader, follower=follower, phase=2, direction="follower")

    # -- no rate: unthrottled ---------------------------------------------------------------------------
    alter(cluster, f"broker:{follower}", FOLLOWER_RATE, None)
    start_leo, end_leo = produce_while_stopped(cluster, leader=leader, follower=follower, phase=3)
    samples = catch_up(cluster, follower=follower, start_leo=start_leo, end_leo=end_leo)
    free_s = first_at(samples, end_leo) - samples[0][0]
    print(f"unthrottled copy of the same size: {free_s:.2f} s after the restart (throttled {throttled_s:.2f} s)")
    assert rate_in_force(cluster, follower, "follower") == -1
    assert free_s < throttled_s / 3, (free_s, throttled_s)
