"""SASL on the Kafka listener's dispatcher, frame by frame: the real KafkaBroker with the real SCRAM
login over a real etcd (no sockets: each Kafka request is encoded with Kafka's own schemas and
handed to the dispatcher as the listener would). What a client sees of each exchange, and what the
connection then carries as its identity."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.serial import entity_reader, entity_writer

from lowtide.auth.scram import SCRAM_SHA_256, SCRAM_SHA_512, ClientExchange, ScramCredential
from lowtide.auth.scram_store import ScramStore, build_scram_login
from lowtide.auth.tokens import Authenticator
from lowtide.errors import SaslAuthenticationFailed
from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.listener import Connection
from lowtide.kafka.protocol import FrameError, RequestHead, request_type, response_type
from lowtide.kafka.server import all_apis
from lowtide.metadata.sections import section

LIFETIME_MS = 60_000
SASL_FAILED, ILLEGAL_SASL_STATE = 58, 34


@pytest.fixture
def broker(metadata_store, tmp_path) -> KafkaBroker:
    store = ScramStore(metadata=metadata_store)
    for user, password in (("alice", "alice-pw"), ("bob", "bob-pw")):
        store.put(SCRAM_SHA_256, user, ScramCredential.from_password(SCRAM_SHA_256, password, iterations=4096))
    store.put(SCRAM_SHA_512, "alice", ScramCredential.from_password(SCRAM_SHA_512, "alice-pw", iterations=4096))
    tokens = tmp_path / "tokens"
    tokens.write_text("alice-token User:alice\n")
    authenticator = Authenticator(metadata=metadata_store, tokens_file=tokens, required=True, cache_ttl_s=0)
    return KafkaBroker(apis=all_apis(), services=KafkaServices(
        node=Node(1, "127.0.0.1", 9092), auth_required=True,
        sasl_login=authenticator.authenticate,
        scram=build_scram_login(metadata_store, auth_enabled=True, session_lifetime_ms=LIFETIME_MS)))


def send(broker: KafkaBroker, conn: Connection, api_key: int, version: int, body: Any) -> Any:
    """Encode one request as a client would, dispatch it, decode the answer."""
    entity = request_type(api_key, version)
    header_cls = entity.__header_schema__
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                              correlation_id=7, client_id="test"))
    entity_writer(entity)(buf, body)
    payload = buf.getvalue()
    frame = broker(conn, RequestHead.parse(payload), payload)
    answer_type = response_type(api_key, version)
    offset = 8 + (1 if answer_type.__flexible__ else 0)  # size, correlation id, [tagged fields]
    return entity_reader(answer_type)(frame, offset)[0]


def handshake(broker, conn, mechanism: str) -> Any:
    return send(broker, conn, 17, 1, SaslHandshakeRequest(mechanism=mechanism))


def authenticate(broker, conn, message: bytes, version: int = 2) -> Any:
    return send(broker, conn, 36, version, SaslAuthenticateRequest(auth_bytes=message))


def scram_login(broker, conn, user: str, password: str, mechanism=SCRAM_SHA_256, *, tamper=None) -> Any:
    """A whole SCRAM exchange; the last answer (server-final, or the refusal)."""
    assert int(handshake(broker, conn, mechanism.name).error_code) == 0
    client = ClientExchange(mechanism, user, password)
    first = authenticate(broker, conn, client.first())
    if int(first.error_code):
        return first
    final = client.final(first.auth_bytes)
    answer = authenticate(broker, conn, tamper(final) if tamper else final)
    if int(answer.error_code) == 0:
        client.verify(answer.auth_bytes)  # the server proved it knows the credential too
    return answer


def session_keys(metadata_store) -> list[str]:
    return list(section(metadata_store, "tokens").items())


def test_the_handshake_offers_plain_and_both_scram_mechanisms(broker):
    answer = handshake(broker, Connection(peer="t"), "SCRAM-SHA-256")
    assert int(answer.error_code) == 0
    assert answer.mechanisms == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512], ids=lambda m: m.name)
def test_a_scram_login_gives_the_connection_a_session_token_of_its_principal(broker, metadata_store, mechanism):
    conn = Connection(peer="t")
    answer = scram_login(broker, conn, "alice", "alice-pw", mechanism)
    assert int(answer.error_code) == 0 and answer.session_lifetime.total_seconds() * 1000 == LIFETIME_MS
    assert conn.authenticated and conn.principal == "User:alice" and not conn.closed.is_set()
    [(header, value)] = conn.metadata
    assert header == "authorization" and value.startswith("Bearer ")
    # the token is what every service checks: it authenticates as alice there too
    assert Authenticator(metadata=metadata_store, required=True).authenticate(conn.metadata) == "User:alice"
    assert len(session_keys(metadata_store)) == 1


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "alice-pw")],
                         ids=["wrong-password", "unknown-user"])
def test_a_refused_login_is_answered_58_then_closed_and_leaves_no_identity(broker, metadata_store, user, password):
    conn = Connection(peer="t")
    answer = scram_login(broker, conn, user, password)
    assert int(answer.error_code) == SASL_FAILED
    assert answer.error_message == "Authentication failed: invalid user credentials"  # the same for both
    assert conn.closed.is_set() and not conn.authenticated and conn.metadata == ()
    assert session_keys(metadata_store) == []


@pytest.mark.parametrize(("tamper", "reason"), [
    (lambda m: m.replace(b",r=", b",r=x"), "nonce"),
    (lambda m: m.replace(b"c=biws", b"c=eSws"), "channel binding"),
    (lambda m: m[:m.rindex(b",p=")], "no proof"),
], ids=["bad-nonce", "bad-channel-binding", "no-proof"])
def test_a_tampered_client_final_message_is_refused_and_closes_the_connection(broker, tamper, reason):
    conn = Connection(peer="t")
    answer = scram_login(broker, conn, "alice", "alice-pw", tamper=tamper)
    assert int(answer.error_code) == SASL_FAILED and reason in answer.error_message
    assert conn.closed.is_set() and not conn.authenticated


@pytest.mark.parametrize(("message", "reason"), [
    (b"n,a=bob,n=alice,r=abc", "authorization id"),
    (b"p=tls-server-end-point,,n=alice,r=abc", "channel binding"),
    (b"garbage", "malformed"),
    (b"n,,n=alice,r=abc,tokenauth=true", "delegation tokens"),
], ids=["other-authzid", "channel-binding", "garbage", "tokenauth"])
def test_a_bad_client_first_message_is_refused_and_closes_the_connection(broker, message, reason):
    conn = Connection(peer="t")
    handshake(broker, conn, "SCRAM-SHA-256")
    answer = authenticate(broker, conn, message)
    assert int(answer.error_code) == SASL_FAILED and reason in answer.error_message
    assert conn.closed.is_set() and conn.metadata == ()


def test_saslauthenticate_after_the_exchange_ended_is_an_illegal_state(broker):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw")
    assert int(authenticate(broker, conn, b"n,,n=alice,r=abc").error_code) == ILLEGAL_SASL_STATE


def test_closing_the_connection_ends_its_session_token(broker, metadata_store):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw")
    conn.close()
    assert session_keys(metadata_store) == []


def test_a_re_authentication_of_the_same_user_replaces_the_session_token(broker, metadata_store):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw")
    before = conn.metadata
    assert int(scram_login(broker, conn, "alice", "alice-pw").error_code) == 0
    assert conn.metadata != before and conn.authenticated
    assert len(session_keys(metadata_store)) == 1  # the old one is gone
    with pytest.raises(SaslAuthenticationFailed, match="unknown or revoked"):
        Authenticator(metadata=metadata_store, required=True).authenticate(before)


def test_a_re_authentication_as_another_user_is_refused_and_closes_the_connection(broker, metadata_store):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw")
    answer = scram_login(broker, conn, "bob", "bob-pw")
    assert int(answer.error_code) == SASL_FAILED and "may not change the principal" in answer.error_message
    assert conn.closed.is_set() and conn.metadata == () and session_keys(metadata_store) == []


def test_a_re_authentication_may_not_change_the_mechanism(broker):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw", SCRAM_SHA_256)
    assert int(handshake(broker, conn, "SCRAM-SHA-512").error_code) == ILLEGAL_SASL_STATE


def test_after_the_session_ends_only_a_new_login_is_served(broker):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw")
    metadata_v1 = request_type(3, 1)(topics=None)
    send(broker, conn, 3, 1, metadata_v1)  # served (the front door is unreachable here: an error answer)
    conn.session_deadline = time.monotonic() - 0.001  # as if the lifetime had passed
    with pytest.raises(FrameError, match="session"):
        send(broker, conn, 3, 1, metadata_v1)
    assert conn.closed.is_set()


def test_a_re_authentication_before_the_end_extends_the_session(broker):
    conn = Connection(peer="t")
    scram_login(broker, conn, "alice", "alice-pw")
    conn.session_deadline = time.monotonic() + 0.001
    scram_login(broker, conn, "alice", "alice-pw")
    assert conn.session_deadline > time.monotonic() + LIFETIME_MS / 1000 - 5


def test_plain_still_logs_in_with_a_token_and_asks_for_no_re_authentication(broker):
    conn = Connection(peer="t")
    assert int(handshake(broker, conn, "PLAIN").error_code) == 0
    answer = authenticate(broker, conn, b"\0alice\0alice-token")
    assert int(answer.error_code) == 0 and answer.session_lifetime.total_seconds() == 0
    assert conn.metadata == (("authorization", "Bearer alice-token"),) and conn.session_deadline is None


def test_a_wrong_plain_password_is_answered_58_then_closed(broker):
    conn = Connection(peer="t")
    handshake(broker, conn, "PLAIN")
    answer = authenticate(broker, conn, b"\0alice\0wrong")
    assert int(answer.error_code) == SASL_FAILED and conn.closed.is_set() and conn.metadata == ()
