"""rpc/convert/scram.py: SCRAM credential descriptions and alterations survive the trip to
protobuf and back (the servicer's direction and its remote twin's), errors as the same classes,
and encode as the lowtide.v1 wire says."""

from __future__ import annotations

from lowtide.errors import DuplicateResource, ResourceNotFound, UnacceptableCredential
from lowtide.messages.admin import Deletion, ScramCredentialInfo, Upsertion, UserCredentials
from lowtide.rpc.convert import scram as convert
from lowtide_pb import admin_pb2

DESCRIBED = [UserCredentials(user="alice", error=None, credentials=(ScramCredentialInfo(mechanism=1, iterations=4096),
                                                                    ScramCredentialInfo(mechanism=2, iterations=8192))),
             UserCredentials(user="bob", error=ResourceNotFound("no bob"))]


def _comparable(results):
    """Errors compare by class and message (exceptions do not compare equal by value)."""
    return [(r.user, type(r.error), r.error and r.error.message, r.credentials) for r in results]


def test_described_credentials_come_back_from_protobuf_equal():
    assert _comparable(convert.describe_results(convert.describe_response(DESCRIBED))) == _comparable(DESCRIBED)


def test_a_describe_request_names_its_users_and_none_means_every_user():
    assert list(convert.describe_request(["alice", "bob"]).users) == ["alice", "bob"]
    assert convert.describe_request(None) == admin_pb2.DescribeUserScramCredentialsRequest()


def test_deletions_and_upsertions_come_back_from_protobuf_equal():
    deletions = [Deletion(user="bob", mechanism=2), Deletion(user="carol", mechanism=9)]
    upsertions = [Upsertion(user="alice", mechanism=1, iterations=4096, salt=b"salt", salted_password=b"\x00key")]
    assert convert.alter_items(convert.alter_request(deletions=deletions, upsertions=upsertions)) == (
        deletions, upsertions)


def test_alteration_results_come_back_as_the_same_errors_per_user():
    results = [("alice", None), ("bob", DuplicateResource("twice")), ("carol", UnacceptableCredential("short"))]
    back = convert.alter_results(convert.alter_response(results))
    assert [(user, type(err), err and err.message) for user, err in back] == [
        ("alice", type(None), None), ("bob", DuplicateResource, "twice"), ("carol", UnacceptableCredential, "short")]


def test_a_describe_answer_encodes_byte_for_byte_as_lowtide_v1_says():
    one = [UserCredentials(user="alice", error=None, credentials=(ScramCredentialInfo(mechanism=1, iterations=4096),)),
           UserCredentials(user="bob", error=ResourceNotFound("no bob"))]
    assert convert.describe_response(one).SerializeToString(deterministic=True) == \
        b'\n\x0e\n\x05alice"\x05\x08\x01\x10\x80 \n\x0f\n\x03bob\x10[\x1a\x06no bob'
