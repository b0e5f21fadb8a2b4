"""``FrameDispatcher`` (lowtide.rpc.framed.session): a server's framed session names its handlers
per frame kind and CALL method; refusals are INVALID_REQUEST with the words each server's session
used before the dispatcher was shared, so the ERROR frames a peer reads are byte for byte the same."""

from __future__ import annotations

from typing import Any

import pytest

from lowtide.coordinator.servicer import _FramedSession as CoordinatorSession
from lowtide.errors import InvalidRequest
from lowtide.replica.servicer import _FramedSession as ReplicaSession
from lowtide.rpc.framed.codec import CALL, ERROR, PRODUCE, REQUEST, encode_call, encode_error, encode_frame
from lowtide.rpc.framed.session import FrameDispatcher, parse_request
from lowtide.rpc.steps import Steps
from lowtide_pb import replica_pb2


def run(steps: Steps[Any]) -> Any:
    """Drive steps that never wait (these handlers answer at once)."""
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        return stop.value


class Echo(FrameDispatcher):
    def _request(self, payload: bytes) -> Steps[bytes]:
        return b"request:" + payload
        yield  # a generator: the dispatcher drives handlers as steps

    def _shout(self, request: bytes) -> Steps[bytes]:
        return f"{self.principal}@{self.peer}:".encode() + request.upper()
        yield

    FRAMES = {REQUEST: _request, CALL: FrameDispatcher.call_steps}
    CALLS = {"Shout": _shout}


def test_a_frame_goes_to_the_handler_its_kind_names_and_a_call_to_its_methods():
    session = Echo("User:a", "ipv4:127.0.0.1:1")
    assert run(session.handle_steps(REQUEST, b"x")) == b"request:x"
    assert run(session.handle_steps(CALL, encode_call("Shout", b"hi"))) == b"User:a@ipv4:127.0.0.1:1:HI"
    session.cancel()
    session.close()  # nothing to release by default


def test_a_kind_or_method_without_a_handler_and_a_malformed_call_are_invalid_requests():
    session = Echo("User:a", "peer")
    with pytest.raises(InvalidRequest, match="^this framed listener serves no frame of kind 5$"):
        run(session.handle_steps(PRODUCE, b""))
    with pytest.raises(InvalidRequest, match="^Whisper is not served on the framed listener; call it over gRPC$"):
        run(session.handle_steps(CALL, encode_call("Whisper", b"")))
    with pytest.raises(InvalidRequest, match="malformed CALL frame"):
        run(session.handle_steps(CALL, b"\x09Shout"))


def test_a_refusal_is_raised_when_the_steps_run_not_when_they_are_made():
    steps = Echo("User:a", "peer").handle_steps(PRODUCE, b"")  # the listener drives it on its loop
    with pytest.raises(InvalidRequest):
        next(steps)


def test_parse_request_refuses_an_unparsable_message_as_the_grpc_port_would():
    assert parse_request(replica_pb2.FetchRequest.FromString, replica_pb2.FetchRequest(replica_id=3)
                         .SerializeToString(), "FetchRequest").replica_id == 3
    with pytest.raises(InvalidRequest, match="^malformed FetchRequest: "):
        parse_request(replica_pb2.FetchRequest.FromString, b"\xff\xff", "FetchRequest")


def test_the_replicas_session_refuses_a_call_and_a_consumer_fetch_with_the_same_error_frames_as_before():
    session = ReplicaSession(None, "User:broker-1", "ipv4:127.0.0.1:9")  # type: ignore[arg-type]  # not reached
    with pytest.raises(InvalidRequest) as refused:
        run(session.handle_steps(CALL, encode_call("CommitFile", b"")))
    assert encode_frame(ERROR, encode_error(refused.value)) == (
        b'\x00\x00\x00\x78\x04{"code": 42, "message": "a replica\'s replication listener serves no frame of kind 6 '
        b'(a CALL is a coordinator shard\'s)"}')
    with pytest.raises(InvalidRequest, match="^the replication listener carries follower fetches: replica_id must "
                                             "be >= 0, got -1; consumers use Fetch$"):
        run(session.handle_steps(REQUEST, replica_pb2.FetchRequest(replica_id=-1).SerializeToString()))
    with pytest.raises(InvalidRequest, match="^malformed ProduceRequest: "):
        run(session.handle_steps(PRODUCE, b"\xff\xff\xff"))


class _Counting:
    def __init__(self) -> None:
        self.commits: list[tuple[str, str]] = []

    def count_commit(self, transport: str, error: str) -> None:
        self.commits.append((transport, error))


def test_the_coordinators_session_refuses_what_is_not_a_commit_file_call_and_counts_each_refusal():
    servicer = _Counting()
    session = CoordinatorSession(servicer, "User:broker-1", "ipv4:127.0.0.1:9")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest) as refused:
        run(session.handle_steps(REQUEST, b""))
    assert encode_frame(ERROR, encode_error(refused.value)) == (
        b'\x00\x00\x00\x64\x04{"code": 42, "message": "a coordinator shard\'s framed listener serves CALL frames (6), '
        b'got kind 2"}')
    with pytest.raises(InvalidRequest, match="^FindBatches is not served on the framed listener; call it over gRPC$"):
        run(session.handle_steps(CALL, encode_call("FindBatches", b"")))
    assert servicer.commits == [("framed", "INVALID_REQUEST"), ("framed", "INVALID_REQUEST")]
