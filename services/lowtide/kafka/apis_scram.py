"""SCRAM credential APIs over the Kafka protocol (KIP-554), answered by the front door's Admin
service: DescribeUserScramCredentials (key 50) and AlterUserScramCredentials (key 51), v0 each,
as ``kafka-configs --entity-type users`` and the AdminClients of Java, librdkafka and kafka-python
send them. The front door checks DESCRIBE / ALTER on the CLUSTER and answers per user.

Kafka's ScramMechanism numbers pass through unchanged (1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512), and
an upsertion's salt and SaltedPassword are the client's: the password never reaches a broker.
"""

from __future__ import annotations

from typing import Any

from lowtide.errors import LowtideError
from lowtide.kafka.broker import Api, Call
from lowtide.kafka.protocol import NO_THROTTLE, error_code
from lowtide_pb import admin_pb2

DESCRIBE_USER_SCRAM_CREDENTIALS_KEY, ALTER_USER_SCRAM_CREDENTIALS_KEY = 50, 51


def describe_user_scram_credentials(call: Call, body: Any) -> Any:
    users = [u.name for u in body.users or ()]
    try:
        answer = call.admin("DescribeUserScramCredentials", admin_pb2.DescribeUserScramCredentialsRequest(users=users))
    except LowtideError as err:
        # A refused caller (CLUSTER_AUTHORIZATION_FAILED) is a message-level error in Kafka's answer.
        return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(err.code),
                         error_message=err.message, results=())
    results = tuple(call.make(
        "DescribeUserScramCredentialsResult", user=r.user, error_code=error_code(r.error_code),
        error_message=r.error_message or None,
        credential_infos=tuple(call.make("CredentialInfo", mechanism=int(c.mechanism), iterations=c.iterations)
                               for c in r.credentials)) for r in answer.results)
    return call.make(call.response, throttle_time=NO_THROTTLE, error_code=error_code(0), error_message=None,
                     results=results)


def alter_user_scram_credentials(call: Call, body: Any) -> Any:
    request = admin_pb2.AlterUserScramCredentialsRequest(
        deletions=[admin_pb2.ScramCredentialDeletion(user=d.name, mechanism=int(d.mechanism)) for d in body.deletions],
        upsertions=[admin_pb2.ScramCredentialUpsertion(user=u.name, mechanism=int(u.mechanism),
                                                       iterations=int(u.iterations), salt=bytes(u.salt),
                                                       salted_password=bytes(u.salted_password))
                    for u in body.upsertions])
    answer = call.admin("AlterUserScramCredentials", request)
    return call.make(call.response, throttle_time=NO_THROTTLE, results=tuple(
        call.make("AlterUserScramCredentialsResult", user=r.user, error_code=error_code(r.error_code),
                  error_message=r.error_message or None) for r in answer.results))


APIS = [
    Api(DESCRIBE_USER_SCRAM_CREDENTIALS_KEY, "DescribeUserScramCredentials", 0, 0, describe_user_scram_credentials),
    Api(ALTER_USER_SCRAM_CREDENTIALS_KEY, "AlterUserScramCredentials", 0, 0, alter_user_scram_credentials),
]
