"""SCRAM credentials (Admin.DescribeUserScramCredentials / AlterUserScramCredentials, KIP-554):
protobuf <-> ``lowtide.messages.admin``.

Used by the front door's servicer, by its remote twin (``lowtide.client.frontdoor.scram``) and by
``client.Admin``. Mechanisms are Kafka's ScramMechanism numbers on both sides; an error travels as
its code and message and comes back as the same ``LowtideError`` class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lowtide.errors import LowtideError, error_or_none
from lowtide.messages.admin import Deletion, ScramCredentialInfo, Upsertion, UserCredentials
from lowtide.rpc.convert import error_kwargs
from lowtide_pb import admin_pb2


# -- DescribeUserScramCredentials ----------------------------------------------------------------
def describe_request(users: Iterable[str] | None) -> admin_pb2.DescribeUserScramCredentialsRequest:
    """None or empty: every user with a credential."""
    return admin_pb2.DescribeUserScramCredentialsRequest(users=list(users or ()))


def describe_response(results: Iterable[UserCredentials]) -> admin_pb2.DescribeUserScramCredentialsResponse:
    return admin_pb2.DescribeUserScramCredentialsResponse(results=[
        admin_pb2.UserScramCredentials(
            user=r.user, **error_kwargs(r.error),
            credentials=[admin_pb2.ScramCredentialInfo(mechanism=i.mechanism, iterations=i.iterations)
                         for i in r.credentials]) for r in results])


def describe_results(response: admin_pb2.DescribeUserScramCredentialsResponse) -> list[UserCredentials]:
    return [UserCredentials(user=r.user, error=error_or_none(r.error_code, r.error_message), credentials=tuple(
        ScramCredentialInfo(mechanism=int(c.mechanism), iterations=c.iterations) for c in r.credentials))
        for r in response.results]


# -- AlterUserScramCredentials -------------------------------------------------------------------
def alter_request(*, deletions: Iterable[Deletion],
                  upsertions: Iterable[Upsertion]) -> admin_pb2.AlterUserScramCredentialsRequest:
    return admin_pb2.AlterUserScramCredentialsRequest(
        deletions=[admin_pb2.ScramCredentialDeletion(user=d.user, mechanism=int(d.mechanism)) for d in deletions],
        upsertions=[admin_pb2.ScramCredentialUpsertion(user=u.user, mechanism=int(u.mechanism),
                                                       iterations=u.iterations, salt=u.salt,
                                                       salted_password=u.salted_password) for u in upsertions])


def alter_items(request: admin_pb2.AlterUserScramCredentialsRequest) -> tuple[list[Deletion], list[Upsertion]]:
    """(deletions, upsertions) of a request, in its order."""
    return ([Deletion(user=d.user, mechanism=d.mechanism) for d in request.deletions],
            [Upsertion(user=u.user, mechanism=u.mechanism, iterations=u.iterations, salt=u.salt,
                       salted_password=u.salted_password) for u in request.upsertions])


def alter_response(results: Sequence[tuple[str, LowtideError | None]]
                   ) -> admin_pb2.AlterUserScramCredentialsResponse:
    return admin_pb2.AlterUserScramCredentialsResponse(results=[
        admin_pb2.AlterUserScramCredentialsResult(user=user, **error_kwargs(err))
        for user, err in results])


def alter_results(response: admin_pb2.AlterUserScramCredentialsResponse) -> list[tuple[str, LowtideError | None]]:
    return [(r.user, error_or_none(r.error_code, r.error_message)) for r in response.results]
