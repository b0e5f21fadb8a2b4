"""SCRAM credential APIs over the Kafka protocol (KIP-554), answered by the front door's SCRAM
administration (``Call.front.scram``: ``frontdoor.admin.scram.ScramAdmin`` in process, its gRPC
twin from a replica): DescribeUserScramCredentials (key 50) and AlterUserScramCredentials (key 51),
v0 each, as ``kafka-configs --entity-type users`` and the AdminClients of Java, librdkafka and
kafka-python send them. The front door checks DESCRIBE / ALTER on the CLUSTER and answers per user.

Kafka's ScramMechanism numbers pass through unchanged (1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512), and
an upsertion's salt and SaltedPassword are the client's: the password never reaches a broker.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import InvalidRequest, LowtideError
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide.messages.admin import Deletion, Upsertion

DESCRIBE_USER_SCRAM_CREDENTIALS_KEY, ALTER_USER_SCRAM_CREDENTIALS_KEY = 50, 51


def _scram(call: Call) -> Any:
    """The front door's ScramAdmin; a front door that keeps no credentials answers as its Admin
    service does (INVALID_REQUEST)."""
    scram = call.front.scram
    if scram is None:
        raise InvalidRequest("this front door keeps no SCRAM credentials")
    return scram


def describe_user_scram_credentials(call: Call, body: Any) -> Any:
    users = [u.name for u in body.users or ()]
    try:
        answer = _scram(call).describe(principal=call.principal(), users=users)
    except LowtideError as err:
        # A refused caller (CLUSTER_AUTHORIZATION_FAILED) is a message-level error in Kafka's answer.
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                         error_message=err.message, results=())
    results = tuple(call.make(
        "DescribeUserScramCredentialsResult", user=r.user, error_code=error_code(r.error.code if r.error else 0),
        error_message=(r.error.message if r.error else "") or None,
        credential_infos=tuple(call.make("CredentialInfo", mechanism=int(c.mechanism), iterations=c.iterations)
                               for c in r.credentials)) for r in answer)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                     results=results)


def alter_user_scram_credentials(call: Call, body: Any) -> Any:
    answer = _scram(call).alter(
        principal=call.principal(),
        deletions=[Deletion(user=d.name, mechanism=int(d.mechanism)) for d in body.deletions],
        upsertions=[Upsertion(user=u.name, mechanism=int(u.mechanism), iterations=int(u.iterations),
                              salt=bytes(u.salt), salted_password=bytes(u.salted_password))
                    for u in body.upsertions])
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(
        call.make("AlterUserScramCredentialsResult", user=user, error_code=error_code(err.code if err else 0),
                  error_message=(err.message if err else "") or None) for user, err in answer))


APIS = [
    Api(DESCRIBE_USER_SCRAM_CREDENTIALS_KEY, "DescribeUserScramCredentials", 0, 0, describe_user_scram_credentials),
    Api(ALTER_USER_SCRAM_CREDENTIALS_KEY, "AlterUserScramCredentials", 0, 0, alter_user_scram_credentials),
]
