"""Kafka 4's online upgrade and downgrade between classic and KIP-848 consumer groups, and classic
members inside a consumer group (``classic_members.py`` and their coordinator in
``consumer_membership.py``, routed through ``membership.GroupMembership``), over a real
``__consumer_offsets`` on the real replicas of ``replica_set``: the calls as Kafka's classic
consumer (eager ``range``) and new consumer send them."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import pytest
from kio.schema.consumer_protocol_subscription.v1 import ConsumerProtocolSubscription
from kio.schema.consumer_protocol_subscription.v1.data import TopicPartition
from kio.serial import entity_writer

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    FencedInstanceId,
    GroupIdNotFound,
    IllegalGeneration,
    InconsistentGroupProtocol,
    MemberIdRequired,
    RebalanceInProgress,
    UnknownMemberId,
)
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.groups.classic_members import decode_assignment, encode_assignment
from lowtide.frontdoor.groups.consumer_membership import ConsumerGroupConfig, ConsumerGroups
from lowtide.frontdoor.groups.membership import GroupMembership, MembershipConfig
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetsTopicConfig
from lowtide.messages.admin import JoinRequest, LeavingMember, Protocol
from lowtide.messages.consumer_groups import ConsumerHeartbeat, TopicPartitions
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until

P = "User:alice"
SESSION_MS = 30_000


def subscription(owned: tuple[int, ...] = ()) -> bytes:
    """A classic consumer's protocol metadata: int16 version 1, ConsumerProtocolSubscription v1."""
    buf = io.BytesIO()
    entity_writer(ConsumerProtocolSubscription)(buf, ConsumerProtocolSubscription(
        topics=("orders",), user_data=None,
        owned_partitions=(TopicPartition(topic="orders", partitions=owned),) if owned else ()))
    return b"\x00\x01" + buf.getvalue()


@pytest.fixture
def cluster(replica_set):
    replica_set.clean()
    store = MetadataStore.from_url(replica_set.metadata_url)
    store.create_topic(name="orders", partitions=4, replication_factor=1, config={}, assignment=[[0]] * 4)
    pool, client = ThreadPoolExecutor(max_workers=8), ReplicaClient()
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
    made: list = []

    def coordinator(*, policy: str = "bidirectional",
                    session_ms: int = 60_000) -> tuple[GroupMembership, ConsumerGroups]:
        """A front door's group coordinators over its own ``__consumer_offsets`` reader."""
        topic = OffsetsTopic(store=store, replicas=client, config=OffsetsTopicConfig(
            partitions=2, tail_interval_s=0.05, load_timeout_s=10),
            topics=TopicAdmin(store=store, authorizer=authorizer, replicas=client, pool=pool))
        topic.start()
        members = GroupMembership(authorizer=authorizer, config=MembershipConfig(
            initial_rebalance_delay_ms=100, min_session_timeout_ms=100, tick_interval_s=0.02))
        groups = ConsumerGroups(log_=topic, topics=store, authorizer=authorizer, classic=members,
                                config=ConsumerGroupConfig(session_timeout_ms=session_ms, heartbeat_interval_ms=200,
                                                           tick_interval_s=0.02, migration_policy=policy))
        members.start()
        groups.start()
        made.extend([groups, members, topic])
        return members, groups

    yield pool, coordinator
    for part in made:
        part.stop()
    pool.shutdown()


def join(members: GroupMembership, *, member_id: str = "", owned: tuple[int, ...] = (), client_id: str = "c",
         require_known: bool = False, instance: str = ""):
    return members.join_group(principal=P, request=JoinRequest(
        group_id="g", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=10_000, member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer", protocols=(Protocol("range", subscription(owned)),),
        require_known_member_id=require_known, client_id=client_id, client_host="/127.0.0.1"))


def sync(members: GroupMembership, joined, *, assignments=None):
    return members.sync_group(principal=P, group_id="g", generation_id=joined.generation_id,
                              member_id=joined.member_id, assignments=assignments)


def heartbeat_error(members: GroupMembership, joined, *, generation: int | None = None):
    try:
        members.heartbeat(principal=P, group_id="g", member_id=joined.member_id,
                          generation_id=joined.generation_id if generation is None else generation)
    except Exception as err:  # noqa: BLE001 - the test looks at which one
        return err
    return None


def beat(groups: ConsumerGroups, member: str, epoch: int, *, owned=None):
    topic_id = groups._ids()[0]["orders"]
    return groups.heartbeat(principal=P, request=ConsumerHeartbeat(
        group_id="g", member_id=member, member_epoch=epoch, rebalance_timeout_ms=30_000,
        subscribed_topic_names=("orders",) if epoch == 0 else None,
        topic_partitions=None if owned is None else (TopicPartitions(topic_id=topic_id, partitions=tuple(owned)),)))


def partitions(result) -> set[int]:
    return {p for t in result.assignment or () for p in t.partitions}


def classic_pair(pool, members: GroupMembership):
    """Two classic members of g, Stable at generation 1: the leader gave each two partitions."""
    a, b = (f.result(timeout=10) for f in [pool.submit(join, members, client_id=c) for c in ("a", "b")])
    assert a.error is None and b.error is None and a.generation_id == b.generation_id == 1
    leader, follower = (a, b) if a.leader == a.member_id else (b, a)
    waiting = pool.submit(sync, members, follower)
    plan = {leader.member_id: encode_assignment({"orders": frozenset({0, 1})}),
            follower.member_id: encode_assignment({"orders": frozenset({2, 3})})}
    assert sync(members, leader, assignments=plan).error is None
    assert waiting.result(timeout=5).error is None
    return leader, follower


def owners(groups: ConsumerGroups) -> dict[str, set[int]]:
    [described] = groups.describe(principal=P, group_ids=["g"])
    assert described.error is None, described.error
    out = {m.member_id: {p for t in m.assignment for p in t.partitions} for m in described.members}
    owned = [p for ps in out.values() for p in ps]
    assert len(owned) == len(set(owned)), f"a partition owned twice: {out}"
    return out


def rejoin(members: GroupMembership, joined):
    """A classic member told REBALANCE_IN_PROGRESS: eager, it revoked everything, rejoins, syncs."""
    again = join(members, member_id=joined.member_id)
    assert again.error is None and again.leader == "" and again.protocol_name == "range", again
    synced = sync(members, again)
    return again, synced


def test_a_consumer_protocol_member_converts_a_classic_group_keeping_its_members_and_assignments(cluster):
    pool, coordinator = cluster
    members, groups = coordinator()
    leader, follower = classic_pair(pool, members)

    joined = beat(groups, "n1", 0)
    assert joined.error is None and partitions(joined) == set()  # everything is still owned by the classic members
    assert groups.is_consumer_group("g") and not members.has_members("g")
    assert owners(groups) == {leader.member_id: {0, 1}, follower.member_id: {2, 3}, "n1": set()}
    [described] = groups.describe(principal=P, group_ids=["g"])
    assert {m.member_id: m.classic for m in described.members} == {leader.member_id: True, follower.member_id: True,
                                                                   "n1": False}
    # The classic members are asked to rejoin; the coordinator assigns (no leader), step by step.
    assert isinstance(heartbeat_error(members, leader), RebalanceInProgress)
    for member in (leader, follower):
        again, synced = rejoin(members, member)
        assert synced.error is None and again.generation_id == described.group_epoch
        assert decode_assignment(synced.assignment) == {"orders": frozenset(owners(groups)[member.member_id])}
    got = beat(groups, "n1", joined.member_epoch, owned=[])
    final = owners(groups)
    assert partitions(got) == final["n1"] and sorted(len(ps) for ps in final.values()) == [1, 1, 2]
    assert sorted(p for ps in final.values() for p in ps) == [0, 1, 2, 3]


def test_a_classic_group_stays_classic_when_the_policy_forbids_upgrades(cluster):
    pool, coordinator = cluster
    members, groups = coordinator(policy="downgrade")
    leader, _ = classic_pair(pool, members)
    assert isinstance(beat(groups, "n1", 0).error, GroupIdNotFound)
    assert members.has_members("g") and not groups.is_consumer_group("g")
    assert heartbeat_error(members, leader) is None


def test_an_upgraded_group_is_rebuilt_with_its_classic_members_by_a_restarted_coordinator(cluster):
    pool, coordinator = cluster
    members, groups = coordinator()
    leader, follower = classic_pair(pool, members)
    assert beat(groups, "n1", 0).error is None
    before = owners(groups)
    members2, groups2 = coordinator()  # a front door started after kill -9: only the records are left
    assert owners(groups2) == before
    [described] = groups2.describe(principal=P, group_ids=["g"])
    assert sorted(m.member_id for m in described.members if m.classic) == sorted([leader.member_id,
                                                                                   follower.member_id])
    # Its classic members heartbeat with their generation there: told to rejoin, not unknown.
    assert isinstance(heartbeat_error(members2, leader), RebalanceInProgress)
    again, synced = rejoin(members2, leader)
    assert synced.error is None and again.generation_id == described.group_epoch


def test_the_last_consumer_protocol_member_leaving_converts_the_group_back_to_classic(cluster):
    pool, coordinator = cluster
    members, groups = coordinator()
    leader, follower = classic_pair(pool, members)
    joined = beat(groups, "n1", 0)
    assert beat(groups, "n1", -1).member_epoch == -1
    assert not groups.is_consumer_group("g") and members.has_members("g")
    snapshot = members.snapshot("g")
    assert snapshot is not None and snapshot.state == "PreparingRebalance"
    assert sorted(m.member_id for m in snapshot.members) == sorted([leader.member_id, follower.member_id])
    # Its records are tombstoned: a restarted coordinator finds no consumer group.
    _, groups2 = coordinator()
    assert not groups2.is_consumer_group("g")
    # The classic members rejoin the classic group; the leader assigns again.
    assert isinstance(heartbeat_error(members, leader), IllegalGeneration)
    rejoined = [f.result(timeout=10) for f in [pool.submit(join, members, member_id=m.member_id)
                                               for m in (leader, follower)]]
    assert all(r.error is None for r in rejoined)
    assert {r.generation_id for r in rejoined} == {joined.member_epoch + 2}  # the leave's epoch, then a rebalance
    assert sum(1 for r in rejoined if r.leader == r.member_id) == 1


def test_the_last_consumer_protocol_member_expiring_converts_the_group_back_to_classic(cluster):
    pool, coordinator = cluster
    members, groups = coordinator(session_ms=300)
    leader, follower = classic_pair(pool, members)
    assert beat(groups, "n1", 0).error is None
    # n1 never heartbeats again; the classic members do (their own session is 30 s).
    wait_until(lambda: members.has_members("g"), timeout_s=10, interval_s=0.05,
               what="the group back in the classic membership once n1 expired")
    assert not groups.is_consumer_group("g")
    snapshot = members.snapshot("g")
    assert snapshot is not None and sorted(m.member_id for m in snapshot.members) == sorted(
        [leader.member_id, follower.member_id])


def test_the_group_stays_a_consumer_group_when_the_policy_forbids_downgrades(cluster):
    pool, coordinator = cluster
    members, groups = coordinator(policy="upgrade")
    classic_pair(pool, members)
    beat(groups, "n1", 0)
    beat(groups, "n1", -1)
    assert groups.is_consumer_group("g") and not members.has_members("g")
    assert len(owners(groups)) == 2


def test_a_classic_member_joins_a_consumer_group_and_gets_what_the_coordinator_assigns(cluster):
    _, coordinator = cluster
    members, groups = coordinator()
    first = beat(groups, "n1", 0)
    assert partitions(first) == {0, 1, 2, 3}
    asked = join(members, require_known=True)
    assert isinstance(asked.error, MemberIdRequired) and asked.member_id
    joined = join(members, member_id=asked.member_id)
    assert joined.error is None and joined.generation_id == 2 and joined.leader == ""
    assert decode_assignment(sync(members, joined).assignment) == {}  # n1 still owns all: it must revoke first
    revoking = beat(groups, "n1", first.member_epoch, owned=[0, 1, 2, 3])
    kept = partitions(revoking)
    assert len(kept) == 2 and beat(groups, "n1", first.member_epoch, owned=sorted(kept)).member_epoch == 2
    # The partitions it waited for are free: its heartbeat asks it to rejoin and collect them.
    assert isinstance(heartbeat_error(members, joined), RebalanceInProgress)
    again, synced = rejoin(members, joined)
    assert decode_assignment(synced.assignment) == {"orders": frozenset({0, 1, 2, 3} - kept)}
    assert heartbeat_error(members, again) is None
    # An offset commit of the classic member carries its generation; an older one is refused.
    groups.validate_commit("g", member_id=again.member_id, member_epoch=again.generation_id)
    with pytest.raises(IllegalGeneration):
        groups.validate_commit("g", member_id=again.member_id, member_epoch=again.generation_id - 1)
    # Protocols it does not share with the group, and then its leaving.
    other = members.join_group(principal=P, request=JoinRequest(
        group_id="g", session_timeout_ms=SESSION_MS, rebalance_timeout_ms=10_000, member_id="x",
        protocol_type="consumer", protocols=(Protocol("roundrobin", subscription()),)))
    assert isinstance(other.error, InconsistentGroupProtocol)
    [left] = members.leave_group(principal=P, group_id="g", members=[LeavingMember(member_id=again.member_id)])
    assert left.error is None and set(owners(groups)) == {"n1"}
    assert isinstance(heartbeat_error(members, again), UnknownMemberId)


def test_a_join_waiting_in_a_classic_rebalance_is_told_to_rejoin_when_the_group_is_upgraded(cluster):
    pool, coordinator = cluster
    members, groups = coordinator()
    leader, follower = classic_pair(pool, members)
    waiting = pool.submit(join, members, member_id=leader.member_id)  # a rebalance waiting for the follower
    wait_until(lambda: members.snapshot("g").state == "PreparingRebalance", timeout_s=5, interval_s=0.02,
               what="the classic group rebalancing")
    assert beat(groups, "n1", 0).error is None
    assert isinstance(waiting.result(timeout=5).error, RebalanceInProgress)
    # Both rejoin; their calls are routed to the consumer group now.
    for member in (leader, follower):
        again, synced = rejoin(members, member)
        assert synced.error is None and again.generation_id == 2
    assert set(owners(groups)) == {leader.member_id, follower.member_id, "n1"}


def test_a_classic_join_to_an_empty_consumer_group_makes_it_a_classic_group(cluster):
    pool, coordinator = cluster
    members, groups = coordinator()
    assert beat(groups, "n1", 0).error is None
    assert beat(groups, "n1", -1).member_epoch == -1
    assert groups.is_consumer_group("g")  # Empty, still a consumer group
    joined = join(members)
    assert joined.error is None and joined.leader == joined.member_id and joined.generation_id == 1
    assert not groups.is_consumer_group("g") and members.has_members("g")
    _, groups2 = coordinator()  # its records were tombstoned
    assert not groups2.is_consumer_group("g")


def test_a_static_classic_member_coming_back_under_a_new_id_takes_its_place_and_fences_the_old_id(cluster):
    _, coordinator = cluster
    members, groups = coordinator()
    assert partitions(beat(groups, "n1", 0)) == {0, 1, 2, 3}
    old = join(members, instance="i1")
    assert old.error is None and sync(members, old).error is None
    epoch_before = groups.describe(principal=P, group_ids=["g"])[0].group_epoch
    new = join(members, instance="i1")  # restarted: no member id, the same group.instance.id
    assert new.error is None and new.member_id != old.member_id
    assert set(owners(groups)) == {"n1", new.member_id}
    [described] = groups.describe(principal=P, group_ids=["g"])
    assert described.group_epoch == epoch_before  # the same member under a new id: no new epoch
    with pytest.raises(FencedInstanceId):  # the old id, with its instance id
        members.heartbeat(principal=P, group_id="g", member_id=old.member_id, generation_id=old.generation_id,
                          group_instance_id="i1")
