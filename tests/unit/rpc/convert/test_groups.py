"""Consumer groups' protobuf mapping (lowtide.rpc.convert.groups): what the front door's servicer
writes, its remote twin (lowtide.client.frontdoor.groups) reads back as the same messages."""

from __future__ import annotations

import dataclasses

from lowtide.errors import GroupAuthorizationFailed, LowtideError, RebalanceInProgress, UnknownTopicOrPartition
from lowtide.messages.admin import (
    CommittedOffset,
    GroupListing,
    GroupOutcome,
    GroupSnapshot,
    JoinedMember,
    JoinRequest,
    JoinResult,
    LeaveOutcome,
    LeavingMember,
    MemberSnapshot,
    OffsetCommit,
    PartitionOutcome,
    Protocol,
    SyncResult,
)
from lowtide.rpc.convert import groups as convert
from lowtide_pb import admin_pb2


def plain(value):
    """``value`` with every error as (its type, its message): errors compare by identity."""
    if isinstance(value, LowtideError):
        return type(value), value.message
    if dataclasses.is_dataclass(value):
        return type(value), tuple(plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


COMMITS = [OffsetCommit(topic="orders", partition=0, offset=42, metadata="m", leader_epoch=3),
           OffsetCommit(topic="orders", partition=1, offset=7)]


def test_an_offset_commit_request_reads_back_as_the_same_commits_and_member():
    args = dict(group_id="g", commits=COMMITS, generation_id=5, member_id="m-1", group_instance_id="i")
    assert convert.offset_commit_args(convert.offset_commit_request(**args)) == args


def test_a_standalone_commit_leaves_generation_and_leader_epoch_unset_on_the_wire():
    request = convert.offset_commit_request(group_id="g", commits=COMMITS[1:])
    assert not request.HasField("generation_id") and not request.partitions[0].HasField("leader_epoch")
    assert request.SerializeToString() == admin_pb2.OffsetCommitRequest(
        group_id="g", partitions=[admin_pb2.OffsetCommitPartition(topic="orders", partition=1, offset=7)]
    ).SerializeToString() == b"\n\x01g\x12\x0c\n\x06orders\x10\x01\x18\x07"
    assert convert.offset_commit_args(request)["generation_id"] == -1


def test_commit_results_read_back_per_commit_and_a_missing_one_is_an_unknown_server_error():
    results = [(COMMITS[0], None), (COMMITS[1], UnknownTopicOrPartition("gone"))]
    back = convert.commit_results_from_proto(COMMITS, convert.commit_results_to_proto(results))
    assert plain(back) == plain(results)
    [(_, missing)] = convert.commit_results_from_proto([OffsetCommit("audit", 0, 1)], [])
    assert missing.code == -1


def test_fetched_offsets_and_the_fetch_request_read_back_the_same():
    args = dict(group_id="g", partitions=[("orders", 0), ("orders", 1)], require_stable=True, member_id=None,
                member_epoch=-1)
    assert convert.offset_fetch_args(convert.offset_fetch_request(**args)) == args
    member = {**args, "member_id": "m1", "member_epoch": 3}  # OffsetFetch v9's member
    assert convert.offset_fetch_args(convert.offset_fetch_request(**member)) == member
    offsets = [CommittedOffset(topic="orders", partition=0, offset=42, metadata="m", leader_epoch=3),
               CommittedOffset(topic="orders", partition=1, error=GroupAuthorizationFailed("no"))]
    assert plain([convert.committed_from_proto(convert.committed_to_proto(c)) for c in offsets]) == plain(offsets)


def test_offset_delete_outcomes_or_a_whole_group_error_read_back_the_same():
    outcomes = [PartitionOutcome("orders", 0), PartitionOutcome("orders", 1, UnknownTopicOrPartition("x"))]
    assert plain(convert.offset_delete_outcomes(convert.offset_delete_response(outcomes))) == plain(outcomes)
    refused = GroupAuthorizationFailed("User:bob may not DELETE")
    assert plain(convert.offset_delete_outcomes(convert.offset_delete_response(refused))) == plain(refused)


def test_listings_descriptions_and_deletions_read_back_the_same():
    listings = [GroupListing("a"), GroupListing("b", protocol_type="consumer", state="Stable")]
    assert convert.listings_from_proto(convert.listings_to_proto(listings)) == listings
    stable = GroupSnapshot(group_id="b", state="Stable", protocol_type="consumer", protocol="range", generation_id=-1,
                           leader="", subscribed_topics=None, members=(MemberSnapshot(
                               member_id="m-1", group_instance_id="", client_id="c", client_host="/10.0.0.1",
                               metadata=b"\x00\x01", assignment=b"\x02"),))
    outcomes = [GroupOutcome("a", offsets=(CommittedOffset("orders", 0, 5),)), GroupOutcome("b", group=stable),
                GroupOutcome("c", error=GroupAuthorizationFailed("no"))]
    assert plain([convert.description_from_proto(convert.description_to_proto(o)) for o in outcomes]) == plain(outcomes)
    deleted = [GroupOutcome("a"), GroupOutcome("c", error=RebalanceInProgress("busy"))]
    assert plain(convert.group_results_from_proto(convert.group_results_to_proto(deleted))) == plain(deleted)


def test_a_join_request_and_its_result_read_back_the_same():
    request = JoinRequest(group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=30000, member_id="m-1",
                          group_instance_id="i", protocol_type="consumer",
                          protocols=(Protocol("range", b"\x01"), Protocol("roundrobin")), require_known_member_id=True,
                          client_id="c", client_host="10.0.0.1", reason="joining")
    assert convert.join_request_from_proto(convert.join_request_to_proto(request)) == request
    assert convert.join_request_from_proto(convert.join_request_to_proto(request), client_host="/h").client_host == "/h"
    result = JoinResult(member_id="m-1", generation_id=4, protocol_type="consumer", protocol_name="range",
                        leader="m-1", members=(JoinedMember("m-1", "i", b"\x01"),))
    assert convert.join_result_from_proto(convert.join_result_to_proto(result)) == result
    refused = JoinResult(member_id="m-2", error=RebalanceInProgress("rejoin"))
    assert plain(convert.join_result_from_proto(convert.join_result_to_proto(refused))) == plain(refused)


def test_sync_heartbeat_and_leave_read_back_the_same():
    sync = dict(group_id="g", generation_id=4, member_id="m-1", group_instance_id="", protocol_type="consumer",
                protocol_name="range", assignments={"m-1": b"\x01", "m-2": b""})
    assert convert.sync_args(convert.sync_request(**sync)) == sync
    result = SyncResult(protocol_type="consumer", protocol_name="range", assignment=b"\x01")
    assert convert.sync_result_from_proto(convert.sync_result_to_proto(result)) == result
    beat = dict(group_id="g", generation_id=4, member_id="m-1", group_instance_id="i")
    assert convert.heartbeat_args(convert.heartbeat_request(**beat)) == beat
    leaving = [LeavingMember(member_id="m-1", reason="bye"), LeavingMember(group_instance_id="i")]
    assert convert.leaving_from_proto(convert.leave_request(group_id="g", members=leaving)) == leaving
    outcomes = [LeaveOutcome("m-1", ""), LeaveOutcome("", "i", RebalanceInProgress("x"))]
    assert plain(convert.leave_outcomes_from_proto(convert.leave_outcomes_to_proto(outcomes))) == plain(outcomes)
    assert convert.whole_call_error(admin_pb2.HeartbeatResponse()) is None
    assert isinstance(convert.whole_call_error(admin_pb2.HeartbeatResponse(error_code=27)), RebalanceInProgress)
