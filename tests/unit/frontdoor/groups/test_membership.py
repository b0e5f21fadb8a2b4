"""Kafka's classic group membership protocol (``frontdoor/groups/membership.py``) driven as its callers do:
members on real threads blocking in JoinGroup and SyncGroup, real time for session and rebalance
timeouts (short ones), and for the commit/OffsetDelete side a real ``GroupCoordinator`` over
``__consumer_offsets`` on the real replicas of ``replica_set`` (see ``harness``) and their etcd."""

from __future__ import annotations

import io
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from kio.schema.consumer_protocol_subscription.v0 import ConsumerProtocolSubscription
from kio.serial import entity_writer

from lowtide.auth.acl import AclBinding, Authorizer
from lowtide.auth.store import AclStore
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    FencedInstanceId,
    GroupAuthorizationFailed,
    GroupIdNotFound,
    GroupSubscribedToTopic,
    IllegalGeneration,
    InconsistentGroupProtocol,
    InvalidSessionTimeout,
    MemberIdRequired,
    NonEmptyGroup,
    NotCoordinator,
    RebalanceInProgress,
    UnknownMemberId,
)
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.groups.classic_group import consumer_subscription_topics
from lowtide.frontdoor.groups.groups import GroupCoordinator, GroupStore
from lowtide.frontdoor.groups.membership import GroupMembership, MembershipConfig
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetsTopicConfig
from lowtide.messages.admin import JoinRequest, LeavingMember, OffsetCommit, Protocol
from lowtide.metadata.store import MetadataStore
from tests.waiting import wait_until

P = "User:alice"
SESSION_MS = 1000


def subscription(*topics: str) -> bytes:
    """A consumer's protocol metadata: int16 version 0, then ConsumerProtocolSubscription v0."""
    buf = io.BytesIO()
    entity_writer(ConsumerProtocolSubscription)(buf, ConsumerProtocolSubscription(topics=topics, user_data=None))
    return b"\x00\x00" + buf.getvalue()


RANGE = (Protocol("range", subscription("orders")),)


def join(members: GroupMembership, group: str = "g", *, member_id: str = "", protocols=RANGE, client_id: str = "c",
         session_ms: int = SESSION_MS, rebalance_ms: int = 3000, instance: str = "", protocol_type: str = "consumer",
         require_known: bool = False, principal: str = P):
    return members.join_group(principal=principal, request=JoinRequest(
        group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms, member_id=member_id,
        group_instance_id=instance, protocol_type=protocol_type, protocols=tuple(protocols),
        require_known_member_id=require_known, client_id=client_id, client_host="/127.0.0.1"))


def sync(members: GroupMembership, joined, group: str = "g", *, assignments=None, instance: str = ""):
    return members.sync_group(principal=P, group_id=group, generation_id=joined.generation_id,
                              member_id=joined.member_id, group_instance_id=instance, assignments=assignments)


def heartbeat_error(members: GroupMembership, joined, group: str = "g", *, generation: int | None = None,
                    member_id: str | None = None, instance: str = ""):
    try:
        members.heartbeat(principal=P, group_id=group,
                          generation_id=joined.generation_id if generation is None else generation,
                          member_id=joined.member_id if member_id is None else member_id,
                          group_instance_id=instance)
    except Exception as err:  # noqa: BLE001 - the test looks at which one
        return err
    return None


def state(members: GroupMembership, group: str = "g") -> str:
    snap = members.snapshot(group)
    return snap.state if snap else "-"


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=8) as p:
        yield p


@pytest.fixture
def membership_factory(store):
    made = []

    def make(*, auth: bool = False, **config) -> GroupMembership:
        authorizer = Authorizer(store=AclStore(metadata=store), enabled=auth)
        config = {"initial_rebalance_delay_ms": 300, "min_session_timeout_ms": 100, "tick_interval_s": 0.02, **config}
        m = GroupMembership(authorizer=authorizer, config=MembershipConfig(**config))
        m.start()
        made.append(m)
        return m

    yield make
    for m in made:
        m.stop()


@pytest.fixture
def members(membership_factory) -> GroupMembership:
    return membership_factory()


def join_all(pool, members, count: int, **kw):
    futures = [pool.submit(join, members, client_id=f"c{i}", **kw) for i in range(count)]
    return [f.result(timeout=10) for f in futures]


def stable_group(pool, members, count: int, **kw):
    """``count`` members joined and synced (the leader assigns "a-<member id>")."""
    joined = join_all(pool, members, count, **kw)
    leader = next(j for j in joined if j.leader == j.member_id)
    followers = [pool.submit(sync, members, j) for j in joined if j is not leader]
    assert sync(members, leader, assignments={j.member_id: b"a-" + j.member_id.encode() for j in joined}).error is None
    assert all(f.result(timeout=5).error is None for f in followers)
    return joined


# -- JoinGroup / SyncGroup -----------------------------------------------------------------------

def test_members_joining_at_once_share_one_generation_and_only_the_leader_gets_the_member_list(pool, members):
    joined = join_all(pool, members, 3)
    assert all(j.error is None for j in joined)
    assert {j.generation_id for j in joined} == {1}
    assert len({j.member_id for j in joined}) == 3 and all(j.member_id.startswith(f"c{i}-")
                                                           for i, j in enumerate(joined))
    [leader] = [j for j in joined if j.leader == j.member_id]
    assert {j.leader for j in joined} == {leader.member_id}
    assert sorted(m.member_id for m in leader.members) == sorted(j.member_id for j in joined)
    assert {m.metadata for m in leader.members} == {subscription("orders")}
    assert all(j.members == () for j in joined if j is not leader)
    assert {(j.protocol_type, j.protocol_name) for j in joined} == {("consumer", "range")}
    assert state(members) == "CompletingRebalance"


def test_followers_wait_for_the_leaders_sync_and_each_gets_its_own_assignment(pool, members):
    joined = join_all(pool, members, 3)
    leader = next(j for j in joined if j.leader == j.member_id)
    followers = {j.member_id: pool.submit(sync, members, j) for j in joined if j is not leader}
    time.sleep(0.2)
    assert not any(f.done() for f in followers.values())  # blocked until the leader assigns
    mine = sync(members, leader, assignments={j.member_id: j.member_id.encode()[::-1] for j in joined})
    assert (mine.error, mine.assignment, mine.protocol_name) == (None, leader.member_id.encode()[::-1], "range")
    for member_id, f in followers.items():
        assert f.result(timeout=5).assignment == member_id.encode()[::-1]
    snap = members.snapshot("g")
    assert (snap.state, snap.protocol, snap.generation_id) == ("Stable", "range", 1)
    assert {m.member_id: m.assignment for m in snap.members} == {j.member_id: j.member_id.encode()[::-1]
                                                                 for j in joined}
    # a sync in a Stable generation answers the member's assignment at once
    follower = next(j for j in joined if j is not leader)
    assert sync(members, follower).assignment == follower.member_id.encode()[::-1]


def test_an_empty_groups_first_rebalance_waits_the_initial_delay_and_a_new_joiner_extends_it(pool,
                                                                                          membership_factory):
    members = membership_factory(initial_rebalance_delay_ms=600)
    started = time.monotonic()
    first = pool.submit(join, members, client_id="a", rebalance_ms=5000)
    time.sleep(0.4)
    second = pool.submit(join, members, client_id="b", rebalance_ms=5000)
    a, b = first.result(timeout=10), second.result(timeout=10)
    took = time.monotonic() - started
    assert a.generation_id == b.generation_id == 1 and a.leader == b.leader
    assert 1.0 <= took < 3.0, took  # 0.6 s, then once more 0.6 s for the member that came in meanwhile


def test_a_rejoin_of_every_member_completes_the_rebalance_without_waiting_for_the_timeout(pool, members):
    joined = stable_group(pool, members, 2)
    started = time.monotonic()
    again = [pool.submit(join, members, member_id=j.member_id, rebalance_ms=20_000, protocols=(
        Protocol("range", subscription("orders", "audit")),)) for j in joined]
    rejoined = [f.result(timeout=10) for f in again]
    assert time.monotonic() - started < 2
    assert {r.generation_id for r in rejoined} == {2}
    assert [r.member_id for r in rejoined] == [j.member_id for j in joined]


def test_the_protocol_is_one_every_member_supports_chosen_by_the_members_preferences(pool, members):
    prefs = [("roundrobin", "range", "sticky"), ("range", "roundrobin"), ("range", "sticky", "roundrobin")]
    futures = [pool.submit(join, members, client_id=f"c{i}", protocols=[Protocol(n, b"") for n in p])
               for i, p in enumerate(prefs)]
    assert {f.result(timeout=10).protocol_name for f in futures} == {"range"}  # sticky is not everyone's


def test_a_different_protocol_type_or_no_common_protocol_is_inconsistent(pool, members):
    stable_group(pool, members, 1)
    assert isinstance(join(members, protocol_type="connect").error, InconsistentGroupProtocol)
    assert isinstance(join(members, protocols=[Protocol("sticky", b"")]).error, InconsistentGroupProtocol)
    assert isinstance(join(members, "fresh", protocols=[]).error, InconsistentGroupProtocol)
    assert members.snapshot("fresh") is None  # a failed first join leaves no group behind


def test_session_timeouts_outside_the_configured_bounds_are_invalid(membership_factory):
    members = membership_factory(min_session_timeout_ms=500, max_session_timeout_ms=5000)
    assert isinstance(join(members, session_ms=499).error, InvalidSessionTimeout)
    assert isinstance(join(members, session_ms=5001).error, InvalidSessionTimeout)
    assert join(members, session_ms=500).error is None


def test_a_new_member_must_rejoin_with_the_id_member_id_required_handed_out(members):
    first = join(members, require_known=True, client_id="app")
    assert isinstance(first.error, MemberIdRequired) and first.member_id.startswith("app-")
    assert members.snapshot("g").members == ()  # pending, not a member yet
    again = join(members, member_id=first.member_id)
    assert (again.error, again.member_id, again.generation_id, again.leader) == (None, first.member_id, 1,
                                                                                 first.member_id)
    assert isinstance(join(members, member_id="app-made-up").error, UnknownMemberId)
    assert isinstance(join(members, "no-such-group", member_id="x").error, UnknownMemberId)


def test_an_id_member_id_required_handed_out_expires_after_the_session_timeout(members):
    first = join(members, require_known=True, session_ms=200)
    time.sleep(0.5)
    assert isinstance(join(members, member_id=first.member_id).error, UnknownMemberId)


# -- Heartbeat, expiry, LeaveGroup ---------------------------------------------------------------

def test_heartbeats_answer_the_generation_the_member_and_a_rebalance_as_kafka_does(pool, members):
    a, b = stable_group(pool, members, 2)
    assert heartbeat_error(members, a) is None
    assert isinstance(heartbeat_error(members, a, generation=0), IllegalGeneration)
    assert isinstance(heartbeat_error(members, a, member_id="nobody"), UnknownMemberId)
    assert isinstance(heartbeat_error(members, a, group="other"), UnknownMemberId)
    leader = a if a.leader == a.member_id else b
    follower = b if leader is a else a
    rejoin = pool.submit(join, members, member_id=leader.member_id)  # the leader rejoining rebalances
    wait_until(lambda: state(members) == "PreparingRebalance", timeout_s=5)
    assert isinstance(heartbeat_error(members, follower), RebalanceInProgress)
    assert isinstance(sync(members, follower).error, RebalanceInProgress)
    assert join(members, member_id=follower.member_id).generation_id == 2
    assert rejoin.result(timeout=5).generation_id == 2
    assert isinstance(heartbeat_error(members, follower), IllegalGeneration)  # still on generation 1


def test_a_member_that_stops_heartbeating_is_removed_and_the_others_rebalance_without_it(pool, members):
    a, b = stable_group(pool, members, 2, session_ms=500)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and state(members) == "Stable":  # only a keeps its session
        assert heartbeat_error(members, a) is None
        time.sleep(0.1)
    assert isinstance(heartbeat_error(members, a), RebalanceInProgress)
    again = join(members, member_id=a.member_id, session_ms=500)
    assert (again.generation_id, again.leader, [m.member_id for m in again.members]) == (2, a.member_id,
                                                                                        [a.member_id])
    assert isinstance(heartbeat_error(members, b), UnknownMemberId)


def test_members_leaving_in_one_call_are_removed_and_the_rest_rebalance(pool, members):
    a, b, c = stable_group(pool, members, 3)
    outcomes = members.leave_group(principal=P, group_id="g", members=[
        LeavingMember(member_id=a.member_id, reason="shutdown"), LeavingMember(member_id=b.member_id),
        LeavingMember(member_id="nobody")])
    assert [type(o.error) if o.error else None for o in outcomes] == [None, None, UnknownMemberId]
    assert isinstance(heartbeat_error(members, c), RebalanceInProgress)
    again = join(members, member_id=c.member_id)
    assert (again.generation_id, [m.member_id for m in again.members]) == (2, [c.member_id])
    [gone] = members.leave_group(principal=P, group_id="missing", members=[LeavingMember(member_id="x")])
    assert isinstance(gone.error, UnknownMemberId)


def test_the_last_member_leaving_makes_the_group_empty_with_a_new_generation(pool, members):
    [a] = stable_group(pool, members, 1)
    members.leave_group(principal=P, group_id="g", members=[LeavingMember(member_id=a.member_id)])
    snap = members.snapshot("g")
    assert (snap.state, snap.generation_id, snap.members) == ("Empty", 2, ())


# -- static membership ---------------------------------------------------------------------------

def test_a_static_member_back_without_its_id_replaces_the_old_id_which_is_fenced(pool, members):
    a = join(members, instance="host-1", client_id="x")
    assert a.member_id.startswith("host-1-")
    assert sync(members, a, instance="host-1", assignments={a.member_id: b"p0"}).error is None
    restarted = join(members, instance="host-1")  # same instance, no member id: a restart
    # Stable and the same protocol: no rebalance, same generation, the old leader id named
    assert (restarted.error, restarted.generation_id, restarted.leader) == (None, 1, a.member_id)
    assert restarted.member_id != a.member_id
    assert isinstance(heartbeat_error(members, a, instance="host-1"), FencedInstanceId)
    assert isinstance(join(members, member_id=a.member_id, instance="host-1").error, FencedInstanceId)
    assert heartbeat_error(members, restarted, instance="host-1") is None
    assert sync(members, restarted, instance="host-1").assignment == b"p0"  # it keeps the assignment
    [left] = members.leave_group(principal=P, group_id="g", members=[LeavingMember(group_instance_id="host-1")])
    assert left.error is None and state(members) == "Empty"


def test_a_static_member_replaced_while_its_old_id_waits_in_join_gets_fenced(pool, members):
    a, b = stable_group(pool, members, 2, instance="")  # two dynamic members...
    static = pool.submit(join, members, instance="host-9", client_id="s")  # ...and a static one joining
    again = [pool.submit(join, members, member_id=j.member_id) for j in (a, b)]
    first_static = static.result(timeout=10)
    assert first_static.error is None and all(f.result(timeout=10).generation_id == 2 for f in again)
    rejoin_old = pool.submit(join, members, member_id=first_static.member_id, instance="host-9",
                             protocols=[Protocol("range", subscription("audit"))])  # protocol change: rebalance
    wait_until(lambda: state(members) == "PreparingRebalance", timeout_s=5)
    replacement = pool.submit(join, members, instance="host-9")
    assert isinstance(rejoin_old.result(timeout=5).error, FencedInstanceId)
    for j in (a, b):
        pool.submit(join, members, member_id=j.member_id)
    assert replacement.result(timeout=10).generation_id == 3


# -- commits and OffsetDelete against the group --------------------------------------------------

@pytest.fixture
def coordinator(replica_set, members):
    """A group coordinator whose ``__consumer_offsets`` lives on the real replicas (their etcd,
    emptied of the last test's metadata)."""
    replica_set.clean()
    store = MetadataStore.from_url(replica_set.metadata_url)
    for topic in ("orders", "audit"):
        store.create_topic(name=topic, partitions=2, replication_factor=1, config={}, assignment=[[0], [0]])
    pool, client = ThreadPoolExecutor(max_workers=4), ReplicaClient()
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
    topic = OffsetsTopic(store=store, replicas=client, config=OffsetsTopicConfig(
        partitions=2, tail_interval_s=0.05, load_timeout_s=5),
        topics=TopicAdmin(store=store, authorizer=authorizer, replicas=client, pool=pool))
    topic.start()
    yield GroupCoordinator(store=GroupStore(topic=topic), metadata=store, authorizer=authorizer, members=members)
    topic.stop()
    pool.shutdown()
    client.close()
    store.close()


def commit_errors(coordinator, group="g", generation=-1, member_id="", offset=5, instance=""):
    results = coordinator.commit_offsets(principal=P, group_id=group, commits=[OffsetCommit("orders", 0, offset)],
                                         generation_id=generation, member_id=member_id, group_instance_id=instance)
    return results[0][1]


def test_commits_are_checked_against_the_generation_and_the_members_as_kafka_does(pool, members, coordinator):
    assert commit_errors(coordinator, "solo") is None  # no members: a standalone commit
    assert isinstance(commit_errors(coordinator, "nogroup", generation=1, member_id="m"), IllegalGeneration)
    a, b = join_all(pool, members, 2)
    assert isinstance(commit_errors(coordinator, generation=1, member_id=a.member_id), RebalanceInProgress)
    leader = a if a.leader == a.member_id else b
    follower = pool.submit(sync, members, b if leader is a else a)
    sync(members, leader, assignments={})
    follower.result(timeout=5)
    assert isinstance(commit_errors(coordinator), UnknownMemberId)  # standalone while it has members
    assert isinstance(commit_errors(coordinator, generation=1, member_id="nobody"), UnknownMemberId)
    assert isinstance(commit_errors(coordinator, generation=7, member_id=a.member_id), IllegalGeneration)
    assert commit_errors(coordinator, generation=1, member_id=a.member_id, offset=9) is None
    assert coordinator.fetch_offsets(principal=P, group_id="g")[0].offset == 9
    assert isinstance(commit_errors(coordinator, "solo", generation=0, member_id="x"), IllegalGeneration)


def test_offset_delete_refuses_the_topics_the_members_subscribe_to_and_deletes_the_others(pool, members,
                                                                                        coordinator):
    assert coordinator.commit_offsets(principal=P, group_id="g", commits=[
        OffsetCommit("orders", 0, 1), OffsetCommit("audit", 0, 2), OffsetCommit("audit", 1, 3)])
    stable_group(pool, members, 2)  # both subscribe to orders only
    assert members.snapshot("g").subscribed_topics == {"orders"}
    outcomes = coordinator.delete_offsets(principal=P, group_id="g",
                                          partitions=[("orders", 0), ("audit", 0), ("audit", 9)])
    assert [type(o.error).__name__ if o.error else None for o in outcomes] == [
        "GroupSubscribedToTopic", None, "UnknownTopicOrPartition"]
    assert isinstance(outcomes[0].error, GroupSubscribedToTopic)
    left = {(c.topic, c.partition): c.offset for c in coordinator.fetch_offsets(principal=P, group_id="g")}
    assert left == {("orders", 0): 1, ("audit", 1): 3}
    with pytest.raises(GroupIdNotFound):
        coordinator.delete_offsets(principal=P, group_id="never", partitions=[("orders", 0)])


def test_a_group_with_members_is_listed_described_and_not_deleted(pool, members, coordinator):
    coordinator.commit_offsets(principal=P, group_id="offsets-only", commits=[OffsetCommit("orders", 1, 4)])
    joined = stable_group(pool, members, 2)
    listings = {g.group_id: (g.protocol_type, g.state) for g in coordinator.list_group_listings(principal=P)}
    assert listings == {"g": ("consumer", "Stable"), "offsets-only": ("", "Empty")}
    [described] = coordinator.describe_groups(principal=P, group_ids=["g"])
    assert described.error is None and described.offsets == ()
    assert (described.group.state, described.group.protocol_type, described.group.protocol) == (
        "Stable", "consumer", "range")
    assert {m.member_id: (m.client_host, m.metadata) for m in described.group.members} == {
        j.member_id: ("/127.0.0.1", subscription("orders")) for j in joined}
    [refused] = coordinator.delete_groups(principal=P, group_ids=["g"])
    assert isinstance(refused.error, NonEmptyGroup)
    members.leave_group(principal=P, group_id="g", members=[LeavingMember(member_id=j.member_id) for j in joined])
    [deleted] = coordinator.delete_groups(principal=P, group_ids=["g"])
    assert deleted.error is None and members.snapshot("g") is None


# -- ACLs, shutdown, the subscription decoder ----------------------------------------------------

def test_membership_calls_need_read_on_the_group(store, membership_factory):
    members = membership_factory(auth=True)
    with pytest.raises(GroupAuthorizationFailed):
        join(members)
    for call in (lambda: members.heartbeat(principal=P, group_id="g", generation_id=1, member_id="m"),
                 lambda: members.sync_group(principal=P, group_id="g", generation_id=1, member_id="m"),
                 lambda: members.leave_group(principal=P, group_id="g", members=[LeavingMember("m")])):
        with pytest.raises(GroupAuthorizationFailed):
            call()
    AclStore(metadata=store).add([AclBinding(P, "GROUP", "g", "LITERAL", "READ", "ALLOW")])
    assert join(members).error is None


def test_stopping_answers_a_blocked_join_not_coordinator(pool, membership_factory):
    members = membership_factory(initial_rebalance_delay_ms=60_000)
    blocked = pool.submit(join, members, rebalance_ms=120_000)
    time.sleep(0.2)
    members.stop()
    assert isinstance(blocked.result(timeout=5).error, NotCoordinator)


def test_the_consumer_subscription_decoder_reads_every_version_and_refuses_garbage():
    assert consumer_subscription_topics(subscription("a", "b")) == {"a", "b"}
    v3 = b"\x00\x03" + b"\x00\x00\x00\x01\x00\x01a" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff" \
        + b"\x00\x00"
    assert consumer_subscription_topics(v3) == {"a"}
    for bad in (b"", b"\x00", b"\xff\xff\x00\x00", b"\x00\x00\x00\x00\x00\x05\x00\x01"):
        with pytest.raises(ValueError):
            consumer_subscription_topics(bad)
