"""SCRAM credentials in a real Redis, the server side of a login over them, and the session tokens
a login mints (which the Authenticator accepts until they end or expire)."""

from __future__ import annotations

import json
import time

import pytest

from lowtide.auth.scram import SCRAM_SHA_256, SCRAM_SHA_512, ClientExchange, ScramCredential
from lowtide.auth.scram_store import (
    SESSION_TOKEN_GRACE_S,
    ScramLogin,
    ScramStore,
    build_scram_login,
    decode_credential,
    scram_key,
)
from lowtide.auth.tokens import SESSION_KEY_PREFIX, Authenticator, mint_session
from lowtide.errors import SaslAuthenticationFailed, UnknownServerError


@pytest.fixture
def scram_store(redis_client) -> ScramStore:
    return ScramStore(redis=redis_client)


def add_user(store: ScramStore, user: str, password: str, mechanism=SCRAM_SHA_256) -> None:
    store.put(mechanism, user, ScramCredential.from_password(mechanism, password, iterations=4096))


def login(scram: ScramLogin, user: str, password: str, mechanism=SCRAM_SHA_256):
    client = ClientExchange(mechanism, user, password)
    exchange = scram.start(mechanism.name, client.first())
    session = scram.finish(exchange, client.final(exchange.server_first.encode()))
    client.verify(session.server_final)
    return session


def bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def test_redis_keeps_a_versioned_document_of_salt_iterations_and_keys_and_never_the_password(
        scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw")
    raw = redis_client.hget(scram_key(SCRAM_SHA_256), "alice")
    doc = json.loads(raw)
    assert sorted(doc) == ["iterations", "salt", "server_key", "stored_key", "v"]
    assert doc["v"] == 1 and doc["iterations"] == 4096
    dump = b"".join(redis_client.dump(k) or b"" for k in redis_client.keys("*"))
    assert b"alice-pw" not in dump


def test_a_document_of_an_unknown_version_is_refused_not_guessed_at():
    with pytest.raises(UnknownServerError, match="format version"):
        decode_credential('{"v":2,"salt":"","iterations":4096,"stored_key":"","server_key":""}')


def test_describe_lists_users_with_their_mechanisms_and_iterations_only(scram_store):
    add_user(scram_store, "alice", "pw")
    add_user(scram_store, "alice", "pw", SCRAM_SHA_512)
    add_user(scram_store, "bob", "pw")
    every = scram_store.describe()
    assert {u: [(i.mechanism.name, i.iterations) for i in infos] for u, infos in every.items()} == {
        "alice": [("SCRAM-SHA-256", 4096), ("SCRAM-SHA-512", 4096)], "bob": [("SCRAM-SHA-256", 4096)]}
    assert list(scram_store.describe(["bob", "carol"])) == ["bob"]


def test_a_login_with_the_right_password_mints_a_session_token_the_authenticator_accepts(
        scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw")
    scram = ScramLogin(store=scram_store, redis=redis_client, mint_sessions=True, session_lifetime_ms=5000)
    session = login(scram, "alice", "alice-pw")
    assert session.principal == "User:alice" and session.lifetime_ms == 5000
    assert session.metadata == (("authorization", f"Bearer {session.token}"),)
    auth = Authenticator(redis=redis_client, required=True)
    assert auth.authenticate(session.metadata) == "User:alice"
    # only the digest is a key, and it lives for the session plus the grace of in-flight calls
    [key] = redis_client.keys(SESSION_KEY_PREFIX + "*")
    assert session.token.encode() not in key
    assert 5000 < redis_client.pttl(key) <= 5000 + SESSION_TOKEN_GRACE_S * 1000


def test_an_ended_session_no_longer_authenticates(scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw")
    scram = build_scram_login(redis_client, auth_enabled=True)
    session = login(scram, "alice", "alice-pw")
    scram.end(session)
    with pytest.raises(SaslAuthenticationFailed):
        Authenticator(redis=redis_client, required=True).authenticate(session.metadata)


def test_a_session_token_expires_by_itself(redis_client):
    token = mint_session(redis_client, principal="User:alice", ttl_s=0.2)
    auth = Authenticator(redis=redis_client, required=True, cache_ttl_s=0)
    assert auth.authenticate(bearer(token)) == "User:alice"
    time.sleep(0.3)
    with pytest.raises(SaslAuthenticationFailed, match="unknown or revoked"):
        auth.authenticate(bearer(token))


def test_a_wrong_password_is_refused_and_mints_nothing(scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw")
    with pytest.raises(SaslAuthenticationFailed, match="invalid user credentials"):
        login(build_scram_login(redis_client, auth_enabled=True), "alice", "wrong")
    assert redis_client.keys(SESSION_KEY_PREFIX + "*") == []


def test_a_deleted_credential_cannot_start_a_new_login(scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw")
    scram = build_scram_login(redis_client, auth_enabled=True)
    login(scram, "alice", "alice-pw")
    assert scram_store.delete(SCRAM_SHA_256, "alice")
    with pytest.raises(SaslAuthenticationFailed, match="invalid user credentials"):
        login(scram, "alice", "alice-pw")


def test_a_credential_of_one_mechanism_does_not_log_in_with_the_other(scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw", SCRAM_SHA_512)
    with pytest.raises(SaslAuthenticationFailed):
        login(build_scram_login(redis_client, auth_enabled=True), "alice", "alice-pw", SCRAM_SHA_256)


def test_an_unknown_user_sees_the_same_salt_from_every_listener_and_no_hint_it_is_unknown(redis_client):
    first = ClientExchange(SCRAM_SHA_256, "ghost", "pw").first()
    one = build_scram_login(redis_client, auth_enabled=True).start("SCRAM-SHA-256", first)
    two = build_scram_login(redis_client, auth_enabled=True).start("SCRAM-SHA-256", first)
    other = build_scram_login(redis_client, auth_enabled=True).start(
        "SCRAM-SHA-256", ClientExchange(SCRAM_SHA_256, "phantom", "pw").first())
    salt = one.server_first.split(",")[1]
    assert salt == two.server_first.split(",")[1] != other.server_first.split(",")[1]


def test_with_authentication_off_a_login_still_checks_the_password_but_mints_no_session(
        scram_store, redis_client):
    add_user(scram_store, "alice", "alice-pw")
    scram = build_scram_login(redis_client, auth_enabled=False)
    session = login(scram, "alice", "alice-pw")
    assert (session.token, session.lifetime_ms, session.metadata) == (None, 0, ())
    with pytest.raises(SaslAuthenticationFailed):
        login(scram, "alice", "wrong")
