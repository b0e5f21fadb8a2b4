"""Broker-side consumed retention (KIP-68) on real processes: the replicas read the group offsets
from ``__consumer_offsets`` themselves and delete only what the groups have consumed."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lowtide.client.admin import Admin
from lowtide.groups import OFFSETS_TOPIC, partition_for_group
from lowtide.localcluster import ClusterConfig, LocalCluster
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.support import (
    create_topic,
    describe,
    leader_of,
    metric,
    produce,
    segment_files,
    store,
    wait_until,
)

OFFSETS_PARTITIONS = 3
RECORDS = 400  # 20 batches of 20 x 1 KiB: about 3 batches per 64 KiB segment
# Session timeout long enough that pausing a replica for a few seconds does not move leadership.
SESSION_MS = 20_000


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = ClusterConfig(data_dir=tmp_path_factory.mktemp("consumed"), replicas=3, session_timeout_ms=SESSION_MS,
                           replica_config={**DEFAULT_REPLICA_CONFIG, "log.retention.check.interval.ms": "300"},
                           extra_env={"LOWTIDE_OFFSETS_TOPIC_PARTITIONS": str(OFFSETS_PARTITIONS)})
    yield from running_cluster(request, config)


def filled_topic(cluster: LocalCluster, name: str, **config: str) -> list[int]:
    """A 1-partition RF-3 topic with KIP-68 on, holding RECORDS records; its segment base offsets."""
    create_topic(cluster, name, config={"consumed.retention.ms": "1000", **config})
    for _ in range(RECORDS // 20):
        assert produce(cluster, name, [b"x" * 1024] * 20).error_code == 0
    bases = segment_files(cluster, leader_of(cluster, name), name)
    assert len(bases) >= 4, bases
    return bases


def commit(cluster: LocalCluster, group: str, offsets: dict[str, int]) -> None:
    with Admin(cluster.bootstrap) as admin:
        result = admin.commit_offsets(group, {(t, 0): o for t, o in offsets.items()})
    assert all(e is None for e in result.values()), result


def log_start(cluster: LocalCluster, topic: str) -> int:
    return describe(cluster, leader_of(cluster, topic), topic).log_start_offset


def segment_start(bases: list[int], offset: int) -> int:
    """Where the log starts once every segment wholly below ``offset`` is gone (never 0 here: the
    test would then pass without anything deleted)."""
    start = max(b for b in bases if b <= offset)
    assert start > 0, (bases, offset)
    return start


def test_only_segments_below_the_slower_groups_commit_go(cluster):
    bases = filled_topic(cluster, "two-groups")
    # The slower group first: a retention pass between the two commits (one every 300 ms) knows
    # only the groups that committed so far, and with "fast" alone would rightly delete up to 350.
    commit(cluster, "slow", {"two-groups": 120})
    commit(cluster, "fast", {"two-groups": 350})
    expected = segment_start(bases, 120)
    wait_until(lambda: log_start(cluster, "two-groups") == expected, what=f"LSO {expected}")
    # the followers adopt it, as after DeleteRecords, and their segments go too
    for r in (0, 1, 2):
        wait_until(lambda r=r: describe(cluster, r, "two-groups").log_start_offset == expected, what=f"replica {r}")
        assert min(segment_files(cluster, r, "two-groups")) == expected
    time.sleep(1.0)  # more passes: nothing beyond the slower group's commit goes
    assert log_start(cluster, "two-groups") == expected


def test_with_mode_any_the_faster_groups_commit_decides(cluster):
    bases = filled_topic(cluster, "any-group", **{"consumed.retention.mode": "any"})
    commit(cluster, "fast", {"any-group": 350})
    commit(cluster, "slow", {"any-group": 120})
    wait_until(lambda: log_start(cluster, "any-group") == segment_start(bases, 350), what="LSO of the faster group")


def test_the_lag_metric_is_the_committed_offset_minus_the_low_watermark(cluster):
    bases = filled_topic(cluster, "lagged")
    commit(cluster, "slow", {"lagged": 130})  # the slower group first (as above)
    commit(cluster, "fast", {"lagged": 350})
    start = segment_start(bases, 130)
    wait_until(lambda: log_start(cluster, "lagged") == start, what="deletion")
    leader = f"replica-{leader_of(cluster, 'lagged')}"
    wait_until(lambda: metric(cluster, leader, "lowtide_consumed_retention_lag_records", topic="lagged",
                              partition="0") == 130 - start, what=f"lag {130 - start}")


def test_a_listed_group_that_never_committed_deletes_nothing(cluster):
    filled_topic(cluster, "ghosted", **{"consumed.retention.groups": "fast,ghost"})
    commit(cluster, "fast", {"ghosted": 350})
    time.sleep(3.0)  # segments are old enough after 1 s; many passes run meanwhile
    assert log_start(cluster, "ghosted") == 0
    leader = cluster.service(f"replica-{leader_of(cluster, 'ghosted')}")
    assert "group ghost is listed in consumed.retention.groups" in Path(leader.log).read_text()


def test_an_inactive_group_stops_counting_only_when_group_inactive_ms_is_set(cluster):
    bases = filled_topic(cluster, "inactive-on", **{"consumed.retention.group.inactive.ms": "4000"})
    filled_topic(cluster, "inactive-off")
    commit(cluster, "dead", {"inactive-on": 10, "inactive-off": 10})

    def fast_keeps_committing() -> bool:
        commit(cluster, "fast", {"inactive-on": 350, "inactive-off": 350})
        return log_start(cluster, "inactive-on") == segment_start(bases, 350)

    began = time.monotonic()
    wait_until(fast_keeps_committing, what="the dead group stops holding inactive-on back")
    assert time.monotonic() - began > 3.0  # not before "dead" went quiet for 4 s
    assert log_start(cluster, "inactive-off") == 0  # without the setting, "dead" still pins it
    leader = f"replica-{leader_of(cluster, 'inactive-on')}"
    assert metric(cluster, leader, "lowtide_consumed_retention_inactive_groups_total", topic="inactive-on",
                  group="dead") == 1
    # Deleted, the topic's series leaves the replica's metrics (not only at the next restart).
    Admin(cluster.bootstrap).delete_topic("inactive-on")
    wait_until(lambda: "inactive-on" not in metrics_text(cluster, leader), what="inactive-on's series removed")


def metrics_text(cluster: LocalCluster, service: str) -> str:
    with urllib.request.urlopen(cluster.service(service).metrics_url, timeout=5) as reply:
        return reply.read().decode()


def test_a_group_whose_offsets_cannot_be_read_deletes_nothing(cluster):
    bases = filled_topic(cluster, "unreadable", **{"consumed.retention.ms": "4000"})
    data_leader = leader_of(cluster, "unreadable")
    commit(cluster, "reader-a", {"unreadable": 350})
    offsets_leaders = {s.partition: s.leader for s in store(cluster).partition_states(OFFSETS_TOPIC)}
    # a group whose __consumer_offsets partition is led by a replica that does not lead the data
    group = next(g for g in (f"reader-{i}" for i in range(1000))
                 if offsets_leaders[partition_for_group(g, partitions=OFFSETS_PARTITIONS)] != data_leader)
    paused = f"replica-{offsets_leaders[partition_for_group(group, partitions=OFFSETS_PARTITIONS)]}"
    commit(cluster, group, {"unreadable": 350})
    cluster.pause(paused)  # alive but answering nothing: its group's offsets cannot be read
    try:
        time.sleep(7.0)  # past consumed.retention.ms, well within the session timeout
        assert log_start(cluster, "unreadable") == 0
    finally:
        cluster.resume(paused)
    assert "cannot read group offsets" in Path(cluster.service(f"replica-{data_leader}").log).read_text()
    wait_until(lambda: log_start(cluster, "unreadable") == segment_start(bases, 350), what="deletion once readable")
