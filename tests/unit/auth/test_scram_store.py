"""SCRAM credentials in a real etcd, the server side of a login over them, and the session tokens
a login mints (which the Authenticator accepts until they end or expire); none of it is in Redis."""

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
    credential_name,
    decode_credential,
)
from lowtide.auth.tokens import Authenticator, mint_session, session_lease, token_name
from lowtide.errors import SaslAuthenticationFailed, UnknownServerError
from lowtide.metadata.sections import section
from tests.waiting import wait_until


@pytest.fixture
def scram_store(metadata_store) -> ScramStore:
    return ScramStore(metadata=metadata_store)


def sessions(metadata) -> dict[str, bytes]:
    """The token records of the store (digest -> principal)."""
    return {name: entry.value for name, entry in section(metadata, "tokens").items().items()}


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


def test_the_store_keeps_a_versioned_document_of_salt_iterations_and_keys_and_never_the_password(
        scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw")
    records = section(metadata_store, "scram").items()
    doc = json.loads(records[credential_name(SCRAM_SHA_256, "alice")].value)
    assert credential_name(SCRAM_SHA_256, "alice") == "alice/SCRAM-SHA-256"
    assert sorted(doc) == ["iterations", "salt", "server_key", "stored_key", "v"]
    assert doc["v"] == 1 and doc["iterations"] == 4096
    assert not any(b"alice-pw" in entry.value for entry in records.values())


def test_the_credentials_the_decoy_and_the_sessions_survive_a_redis_flushall(
        scram_store, metadata_store, reopen, redis_client):
    # Issue 51: Redis keeps only the purgatory timers. Emptying it loses no credential, no
    # decoy (unknown users would get another salt) and no live session.
    add_user(scram_store, "alice", "alice-pw")
    ghost = ClientExchange(SCRAM_SHA_256, "ghost", "pw").first()
    salt = build_scram_login(metadata_store, auth_enabled=True).start("SCRAM-SHA-256", ghost).server_first
    session = login(build_scram_login(metadata_store, auth_enabled=True), "alice", "alice-pw")
    redis_client.set("lowtide:unrelated", "1")
    assert redis_client.flushall() and redis_client.dbsize() == 0
    restarted = reopen()  # an image loaded from the store after the flush
    assert ScramStore(metadata=restarted).describe() == scram_store.describe() != {}
    scram = build_scram_login(restarted, auth_enabled=True)
    assert login(scram, "alice", "alice-pw").principal == "User:alice"
    assert scram.start("SCRAM-SHA-256", ghost).server_first.split(",")[1] == salt.split(",")[1]
    assert Authenticator(metadata=restarted, required=True).authenticate(session.metadata) == "User:alice"


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
        scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw")
    scram = ScramLogin(store=scram_store, metadata=metadata_store, mint_sessions=True, session_lifetime_ms=5000)
    session = login(scram, "alice", "alice-pw")
    assert session.principal == "User:alice" and session.lifetime_ms == 5000
    assert session.metadata == (("authorization", f"Bearer {session.token}"),)
    auth = Authenticator(metadata=metadata_store, required=True)
    assert auth.authenticate(session.metadata) == "User:alice"
    # only the digest is a record, and it lives under a lease of the session plus the grace of
    # in-flight calls
    assert sessions(metadata_store) == {token_name(session.token): b"User:alice"}
    assert session.token not in token_name(session.token)
    ttl = metadata_store.client.keep_alive(session_lease(session.token))
    assert 5 < ttl <= 5 + SESSION_TOKEN_GRACE_S + 1


def test_an_ended_session_no_longer_authenticates_and_its_lease_is_revoked(scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw")
    scram = build_scram_login(metadata_store, auth_enabled=True)
    session = login(scram, "alice", "alice-pw")
    scram.end(session)
    with pytest.raises(SaslAuthenticationFailed):
        Authenticator(metadata=metadata_store, required=True).authenticate(session.metadata)
    assert sessions(metadata_store) == {}
    assert metadata_store.client.keep_alive(session_lease(session.token)) == 0


def test_a_session_token_expires_by_itself(metadata_store):
    token = mint_session(metadata_store, principal="User:alice", ttl_s=0.2)  # a lease: at least 2 s
    auth = Authenticator(metadata=metadata_store, required=True, cache_ttl_s=0)
    assert auth.authenticate(bearer(token)) == "User:alice"
    began = time.monotonic()
    wait_until(lambda: token_name(token) not in sessions(metadata_store), timeout_s=10,
               what="the session's lease to expire")
    assert time.monotonic() - began > 1.0
    with pytest.raises(SaslAuthenticationFailed, match="unknown or revoked"):
        auth.authenticate(bearer(token))


def test_a_wrong_password_is_refused_and_mints_nothing(scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw")
    with pytest.raises(SaslAuthenticationFailed, match="invalid user credentials"):
        login(build_scram_login(metadata_store, auth_enabled=True), "alice", "wrong")
    assert sessions(metadata_store) == {}


def test_a_deleted_credential_cannot_start_a_new_login(scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw")
    scram = build_scram_login(metadata_store, auth_enabled=True)
    login(scram, "alice", "alice-pw")
    assert scram_store.delete(SCRAM_SHA_256, "alice")
    assert not scram_store.delete(SCRAM_SHA_256, "alice")
    with pytest.raises(SaslAuthenticationFailed, match="invalid user credentials"):
        login(scram, "alice", "alice-pw")


def test_a_credential_of_one_mechanism_does_not_log_in_with_the_other(scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw", SCRAM_SHA_512)
    with pytest.raises(SaslAuthenticationFailed):
        login(build_scram_login(metadata_store, auth_enabled=True), "alice", "alice-pw", SCRAM_SHA_256)


def test_a_credential_created_through_another_process_logs_in_at_once(scram_store, reopen):
    elsewhere = reopen()
    scram = build_scram_login(elsewhere, auth_enabled=True)
    with pytest.raises(SaslAuthenticationFailed):
        login(scram, "alice", "alice-pw")  # its image is loaded, without alice
    add_user(scram_store, "alice", "alice-pw")
    assert login(scram, "alice", "alice-pw").principal == "User:alice"


def test_a_user_name_with_a_slash_is_its_own_user(scram_store):
    add_user(scram_store, "a/b", "pw")
    add_user(scram_store, "a", "pw", SCRAM_SHA_512)
    assert {u: [i.mechanism.name for i in infos] for u, infos in scram_store.describe().items()} == {
        "a": ["SCRAM-SHA-512"], "a/b": ["SCRAM-SHA-256"]}
    assert scram_store.get(SCRAM_SHA_256, "a") is None


def test_an_unknown_user_sees_the_same_salt_from_every_listener_and_no_hint_it_is_unknown(metadata_store, reopen):
    first = ClientExchange(SCRAM_SHA_256, "ghost", "pw").first()
    one = build_scram_login(metadata_store, auth_enabled=True).start("SCRAM-SHA-256", first)
    two = build_scram_login(reopen(), auth_enabled=True).start("SCRAM-SHA-256", first)
    other = build_scram_login(metadata_store, auth_enabled=True).start(
        "SCRAM-SHA-256", ClientExchange(SCRAM_SHA_256, "phantom", "pw").first())
    salt = one.server_first.split(",")[1]
    assert salt == two.server_first.split(",")[1] != other.server_first.split(",")[1]


def test_with_authentication_off_a_login_still_checks_the_password_but_mints_no_session(
        scram_store, metadata_store):
    add_user(scram_store, "alice", "alice-pw")
    scram = build_scram_login(metadata_store, auth_enabled=False)
    session = login(scram, "alice", "alice-pw")
    assert (session.token, session.lifetime_ms, session.metadata) == (None, 0, ())
    with pytest.raises(SaslAuthenticationFailed):
        login(scram, "alice", "wrong")
