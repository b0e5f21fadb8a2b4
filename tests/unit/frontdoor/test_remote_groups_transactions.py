"""The front door's group and transaction parts over gRPC (lowtide.client.frontdoor.groups,
.transactions) answer as the domain objects do in process, as far as a Kafka handler can tell: the
real Admin servicer over fake domain objects, on a real in-process gRPC server."""

from __future__ import annotations

from concurrent import futures
from types import SimpleNamespace

import grpc
import pytest

from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.errors import (
    CoordinatorNotAvailable,
    GroupAuthorizationFailed,
    InvalidTxnState,
    NotCoordinator,
    RebalanceInProgress,
    RequestTimedOut,
)
from lowtide.frontdoor.servicer import AdminServicer, FrontDoor
from lowtide.messages import TopicPartition
from lowtide.messages.admin import JoinRequest, JoinResult, LeaveOutcome, LeavingMember, OffsetCommit, TxnState
from lowtide.rpc.interceptor import ErrorInterceptor
from lowtide_pb import admin_pb2_grpc


class Members:
    def join_group(self, *, principal, request):
        raise GroupAuthorizationFailed(f"{principal} may not READ")

    def sync_group(self, **kwargs):
        raise AssertionError("not called")

    def heartbeat(self, *, principal, group_id, generation_id, member_id, group_instance_id=""):
        raise RebalanceInProgress("rejoin")

    def leave_group(self, *, principal, group_id, members):
        return [LeaveOutcome(member_id=m.member_id, group_instance_id=m.group_instance_id) for m in members]


class Transactions:
    def __init__(self) -> None:
        self.asked = []

    def init_producer_id(self, *, principal, transactional_id, timeout_ms=0):
        return 7, 2

    def end_txn(self, *, principal, transactional_id, producer_id, producer_epoch, commit, transaction_version=0):
        if transaction_version == 2:
            return producer_id, producer_epoch + 1  # KIP-890: the bumped epoch is the answer
        raise RequestTimedOut("markers not written in time")  # an answer's error: not renamed

    def commit_offsets(self, *, principal, groups, **args):
        self.asked.append((groups, args))
        return [(c, InvalidTxnState("AddOffsetsToTxn first")) for c in args["commits"]]

    def list_transactions(self, *, principal, states=(), producer_ids=(), running_longer_than_ms=0):
        return [TxnState(transactional_id="t", producer_id=7, producer_epoch=2, state="Ongoing")]


@pytest.fixture
def front():
    groups = SimpleNamespace()
    door = FrontDoor(authenticator=SimpleNamespace(authenticate_context=lambda context: "User:alice"),
                     authorizer=SimpleNamespace(enabled=False), topics=None, deleter=None, groups=groups, acls=None,
                     transactions=Transactions(), members=Members())
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[ErrorInterceptor()])
    admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(door), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    remote = RemoteFrontDoor(address=f"127.0.0.1:{port}", timeout_s=5)
    yield door, remote.bound([])
    remote.close()
    server.stop(None)


def test_a_refused_join_comes_back_as_the_results_error_with_the_members_id(front):
    _, view = front
    result = view.members.join_group(principal="ignored", request=JoinRequest(
        group_id="g", session_timeout_ms=10000, member_id="m-1"))
    assert isinstance(result.error, GroupAuthorizationFailed) and "User:alice" in result.error.message
    assert (result.member_id, result.generation_id) == ("m-1", -1)
    assert isinstance(result, JoinResult)


def test_a_heartbeat_error_is_raised_as_in_process_and_a_leave_answers_per_member(front):
    _, view = front
    with pytest.raises(RebalanceInProgress):
        view.members.heartbeat(principal="", group_id="g", generation_id=1, member_id="m-1")
    assert view.members.leave_group(principal="", group_id="g", members=[LeavingMember(member_id="m-1")]) == [
        LeaveOutcome(member_id="m-1", group_instance_id="")]


def test_a_front_door_without_membership_is_not_the_coordinator(front):
    door, view = front
    door.members = None
    with pytest.raises(NotCoordinator):
        view.members.heartbeat(principal="", group_id="g", generation_id=1, member_id="m-1")


def test_transactions_answer_as_in_process_and_txn_offset_commit_is_the_coordinators_one_method(front):
    door, view = front
    assert view.transactions.init_producer_id(principal="", transactional_id="t", timeout_ms=9000) == (7, 2)
    with pytest.raises(RequestTimedOut):
        view.transactions.end_txn(principal="", transactional_id="t", producer_id=7, producer_epoch=2, commit=True)
    assert view.transactions.end_txn(principal="", transactional_id="t", producer_id=7, producer_epoch=2, commit=True,
                                     transaction_version=2) == (7, 3)
    commits = [OffsetCommit(topic="orders", partition=0, offset=5)]
    [(commit, error)] = view.transactions.commit_offsets(
        principal="", groups=view.groups, transactional_id="t", producer_id=7, producer_epoch=2, group_id="g",
        commits=commits)
    assert commit == commits[0] and isinstance(error, InvalidTxnState)
    [(groups, args)] = door.transactions.asked
    assert groups is door.groups and args["commits"] == commits and args["generation_id"] == -1
    assert [(t.transactional_id, t.state) for t in view.transactions.list_transactions(principal="")] == [
        ("t", "Ongoing")]


def test_an_unreachable_transaction_coordinator_is_coordinator_not_available():
    view = RemoteFrontDoor(address="127.0.0.1:1", timeout_s=2).bound([])
    with pytest.raises(CoordinatorNotAvailable):
        view.transactions.add_partitions(principal="", transactional_id="t", producer_id=7, producer_epoch=2,
                                         partitions=[TopicPartition("orders", 0)])
