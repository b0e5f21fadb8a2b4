"""The KIP-848 consumer group coordinator (``frontdoor/groups/consumer_membership.py``) over a real
``__consumer_offsets`` on the real replicas of ``replica_set`` (see ``harness``): heartbeats as
Kafka's consumer sends them, the records written, and a fresh coordinator (a front door restarted
after kill -9) rebuilding the groups from those records."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    FencedMemberEpoch,
    GroupIdNotFound,
    InvalidRequest,
    StaleMemberEpoch,
    UnknownMemberId,
    UnsupportedAssignor,
)
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.groups.consumer_membership import ConsumerGroupConfig, ConsumerGroups
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetsTopicConfig
from lowtide.messages.consumer_groups import ConsumerHeartbeat, TopicPartitions
from lowtide.metadata.store import MetadataStore

P = "User:alice"


@pytest.fixture
def cluster(replica_set):
    replica_set.clean()
    store = MetadataStore.from_url(replica_set.metadata_url)
    store.create_topic(name="orders", partitions=4, replication_factor=1, config={}, assignment=[[0]] * 4)
    pool, client = ThreadPoolExecutor(max_workers=4), ReplicaClient()
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
    made: list = []

    def coordinator(session_ms: int = 60_000) -> ConsumerGroups:
        """A coordinator with its own ``__consumer_offsets`` reader: a front door process."""
        topic = OffsetsTopic(store=store, replicas=client, config=OffsetsTopicConfig(
            partitions=2, tail_interval_s=0.05, load_timeout_s=10),
            topics=TopicAdmin(store=store, authorizer=authorizer, replicas=client, pool=pool))
        topic.start()
        groups = ConsumerGroups(log_=topic, topics=store, authorizer=authorizer, config=ConsumerGroupConfig(
            session_timeout_ms=session_ms, heartbeat_interval_ms=200, tick_interval_s=0.02))
        groups.start()
        made.extend([groups, topic])
        return groups

    yield store, coordinator
    for part in made:
        part.stop()
    pool.shutdown()


def beat(groups: ConsumerGroups, member: str, epoch: int, *, owned=None, topics=("orders",), group: str = "g",
         assignor: str | None = None, instance: str | None = None):
    topic_id = groups._ids()[0]["orders"]
    result = groups.heartbeat(principal=P, request=ConsumerHeartbeat(
        group_id=group, member_id=member, member_epoch=epoch, rebalance_timeout_ms=30_000, instance_id=instance,
        subscribed_topic_names=tuple(topics) if epoch == 0 else None, server_assignor=assignor,
        topic_partitions=None if owned is None else (TopicPartitions(topic_id=topic_id, partitions=tuple(owned)),)))
    return result


def partitions(result) -> set[int]:
    return {p for t in result.assignment or () for p in t.partitions}


def stable_pair(groups: ConsumerGroups):
    """m1 and m2 in group g, reconciled: each owns two partitions at epoch 2."""
    assert partitions(beat(groups, "m1", 0)) == {0, 1, 2, 3}
    assert beat(groups, "m2", 0).member_epoch == 2
    keep = partitions(beat(groups, "m1", 1, owned=[0, 1, 2, 3]))
    assert len(keep) == 2
    assert beat(groups, "m1", 1, owned=sorted(keep)).member_epoch == 2
    m2 = beat(groups, "m2", 2, owned=[])
    assert partitions(m2) == {0, 1, 2, 3} - keep
    return keep, partitions(m2)


def test_heartbeats_answer_as_kafka(cluster):
    store, coordinator = cluster
    groups = coordinator()
    first = beat(groups, "m1", 0)
    assert (first.error, first.member_epoch, first.heartbeat_interval_ms) == (None, 1, 200)
    assert first.assignment[0].topic_id == store.topics()["orders"].topic_id
    assert isinstance(beat(groups, "m1", 5).error, FencedMemberEpoch)
    assert isinstance(beat(groups, "nobody", 3).error, UnknownMemberId)
    assert isinstance(beat(groups, "m3", 0, assignor="sticky").error, UnsupportedAssignor)
    assert isinstance(beat(groups, "", 0).error, InvalidRequest)  # v1: the member names itself
    described = groups.describe(principal=P, group_ids=["g", "nope"])
    assert (described[0].state, described[0].group_epoch, described[0].assignor_name) == ("Stable", 1, "uniform")
    assert described[0].members[0].assignment[0].partitions == (0, 1, 2, 3)
    assert isinstance(described[1].error, GroupIdNotFound)
    assert groups.listings() == [("g", "Stable")]


def test_commits_are_fenced_by_member_epoch(cluster):
    _, coordinator = cluster
    groups = coordinator()
    beat(groups, "m1", 0)
    groups.validate_commit("g", member_id="m1", member_epoch=1)
    with pytest.raises(StaleMemberEpoch):
        groups.validate_commit("g", member_id="m1", member_epoch=0)
    with pytest.raises(UnknownMemberId):
        groups.validate_commit("g", member_id="m9", member_epoch=1)
    with pytest.raises(UnknownMemberId):  # an admin commit while the group has members
        groups.validate_commit("g", member_id="", member_epoch=-1)
    assert beat(groups, "m1", -1).member_epoch == -1
    groups.validate_commit("g", member_id="", member_epoch=-1)
    assert groups.describe(principal=P, group_ids=["g"])[0].state == "Empty"


def test_a_restarted_coordinator_rebuilds_the_group_from_its_records(cluster):
    _, coordinator = cluster
    before = coordinator()
    keep1, keep2 = stable_pair(before)
    described = before.describe(principal=P, group_ids=["g"])[0]
    before.stop()  # a new front door takes over: only the records carry the group
    after = coordinator()
    again = after.describe(principal=P, group_ids=["g"])[0]
    assert again == described
    # The members go on with their epochs: nothing is fenced, nothing moves.
    assert beat(after, "m1", 2, owned=sorted(keep1)).error is None
    assert partitions(beat(after, "m2", 2, owned=sorted(keep2))) == keep2
    # A member leaving is seen by the next coordinator too.
    beat(after, "m2", -1)
    assert [m.member_id for m in coordinator().describe(principal=P, group_ids=["g"])[0].members] == ["m1"]


def test_static_member_rejoins_with_its_assignment_after_a_restart(cluster):
    _, coordinator = cluster
    groups = coordinator()
    beat(groups, "a1", 0, instance="a")
    beat(groups, "b1", 0, instance="b")
    keep = partitions(beat(groups, "a1", 1, owned=[0, 1, 2, 3], instance="a"))
    beat(groups, "a1", 1, owned=sorted(keep), instance="a")
    b = beat(groups, "b1", 2, instance="b")
    assert beat(groups, "b1", -2, instance="b").member_epoch == -2
    rejoined = beat(coordinator(), "b2", 0, instance="b")
    assert (rejoined.member_epoch, partitions(rejoined)) == (2, partitions(b))


def test_session_expiry_removes_a_silent_member(cluster):
    _, coordinator = cluster
    groups = coordinator(session_ms=600)
    stable_pair(groups)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # m1 keeps heartbeating, m2 goes silent
        result = beat(groups, "m1", groups.describe(principal=P, group_ids=["g"])[0].members[0].member_epoch)
        if partitions(result) == {0, 1, 2, 3}:
            break
        time.sleep(0.1)
    described = groups.describe(principal=P, group_ids=["g"])[0]
    assert [m.member_id for m in described.members] == ["m1"]
    assert described.members[0].assignment[0].partitions == (0, 1, 2, 3)
