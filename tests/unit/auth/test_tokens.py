"""Bearer-token authentication from gRPC metadata, with tokens in a file and in a real etcd (the
``tokens`` section of the metadata; none in Redis)."""

from __future__ import annotations

import re

import pytest

from lowtide.auth.identity import is_service_principal
from lowtide.auth.tokens import Authenticator, add_token, remove_token, token_name
from lowtide.errors import InvalidConfig, SaslAuthenticationFailed
from lowtide.metadata.sections import section
from lowtide.tls.principal import LOWTIDE_RULES, PrincipalMapper
from tests.waiting import wait_until


def bearer(token: str) -> list[tuple[str, str]]:
    return [("user-agent", "grpc-python"), ("authorization", f"Bearer {token}")]


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# token  principal\n\nfile-token-alice  User:alice\n  file-token-bob User:bob  \n")
    return path


def test_a_known_token_from_the_file_authenticates_its_principal(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=True)
    assert auth.authenticate(bearer("file-token-alice")) == "User:alice"
    assert auth.authenticate(bearer("file-token-bob")) == "User:bob"


def test_a_known_token_from_the_store_authenticates_its_principal(metadata_store):
    auth = Authenticator(metadata=metadata_store, required=True)
    auth.add_token("stored-token", "User:spark")
    assert auth.authenticate(bearer("stored-token")) == "User:spark"


def test_the_store_keeps_a_digest_never_the_token_itself(metadata_store):
    add_token(metadata_store, token="s3cr3t", principal="User:alice")
    records = section(metadata_store, "tokens").items()
    assert list(records) == [token_name("s3cr3t")] and len(token_name("s3cr3t")) == 64
    assert "s3cr3t" not in token_name("s3cr3t") and records[token_name("s3cr3t")].value == b"User:alice"


def test_stored_tokens_survive_a_redis_flushall(metadata_store, reopen, redis_client):
    # Issue 51: Redis keeps only the purgatory timers. Emptying it revokes no token.
    add_token(metadata_store, token="kept", principal="User:alice")
    redis_client.set("lowtide:unrelated", "1")
    assert redis_client.flushall() and redis_client.dbsize() == 0
    assert Authenticator(metadata=reopen(), required=True).authenticate(bearer("kept")) == "User:alice"


def test_a_token_added_through_another_process_works_at_once(metadata_store, reopen):
    auth = Authenticator(metadata=reopen(), required=True)
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate(bearer("fresh"))  # loads its image; the miss is remembered
    auth.reload()  # forget the miss
    add_token(metadata_store, token="fresh", principal="User:fresh")
    assert auth.authenticate(bearer("fresh")) == "User:fresh"  # caught up with etcd on the miss


def test_the_bearer_scheme_is_case_insensitive(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=True)
    assert auth.authenticate([("authorization", "bearer file-token-alice")]) == "User:alice"


def test_a_missing_token_is_anonymous_when_authentication_is_optional(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=False)
    assert auth.authenticate([("user-agent", "x")]) == "User:ANONYMOUS"
    assert auth.authenticate(None) == "User:ANONYMOUS"


def test_a_missing_token_fails_when_authentication_is_required(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=True)
    with pytest.raises(SaslAuthenticationFailed, match="authentication required"):
        auth.authenticate([])


@pytest.mark.parametrize("required", [True, False])
def test_an_unknown_token_always_fails(tokens_file, metadata_store, required):
    auth = Authenticator(metadata=metadata_store, tokens_file=tokens_file, required=required)
    with pytest.raises(SaslAuthenticationFailed, match="unknown or revoked token"):
        auth.authenticate(bearer("guess"))


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "file-token-alice"])
def test_a_malformed_authorization_header_fails_even_when_optional(tokens_file, header):
    auth = Authenticator(tokens_file=tokens_file, required=False)
    with pytest.raises(SaslAuthenticationFailed, match="Bearer <token>"):
        auth.authenticate([("authorization", header)])


def test_two_authorization_headers_are_refused(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=False)
    with pytest.raises(SaslAuthenticationFailed, match="more than one"):
        auth.authenticate(bearer("file-token-alice") + bearer("file-token-bob"))


def test_a_revoked_token_stops_working_at_once(metadata_store):
    auth = Authenticator(metadata=metadata_store, required=True)
    auth.add_token("t1", "User:alice")
    assert auth.authenticate(bearer("t1")) == "User:alice"
    assert remove_token(metadata_store, token="t1")
    assert not remove_token(metadata_store, token="t1")
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate(bearer("t1"))


def test_a_token_revoked_through_another_process_stops_working_once_the_watch_delivers(metadata_store, reopen):
    auth = Authenticator(metadata=metadata_store, required=True)
    auth.add_token("t2", "User:alice")
    assert auth.authenticate(bearer("t2")) == "User:alice"
    assert remove_token(reopen(), token="t2")
    wait_until(lambda: auth.lookup("t2") is None, what="the revocation to reach the image")


def test_an_unknown_token_is_looked_up_in_etcd_once_per_cache_ttl(metadata_store):
    now = [0.0]
    auth = Authenticator(metadata=metadata_store, required=True, clock=lambda: now[0])
    assert auth.lookup("guess") is None  # loads the image
    reads = []
    original = metadata_store.client.get
    metadata_store.client.get = lambda key, **kw: reads.append(key) or original(key, **kw)  # type: ignore[method-assign]
    try:
        for _ in range(20):
            assert auth.lookup("guess") is None
        assert reads == []  # remembered as unknown: guessing costs no round trip
        now[0] += 1.5
        assert auth.lookup("guess") is None and len(reads) == 1
    finally:
        metadata_store.client.get = original  # type: ignore[method-assign]


def test_a_token_added_after_a_failed_attempt_works_at_once_through_add_token(metadata_store):
    auth = Authenticator(metadata=metadata_store, required=True)
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate(bearer("late"))
    auth.add_token("late", "User:late")
    assert auth.authenticate(bearer("late")) == "User:late"


def test_a_missing_tokens_file_is_an_error_naming_the_path(tmp_path):
    path = tmp_path / "nope" / "tokens"
    with pytest.raises(InvalidConfig, match=f"cannot read tokens file '{path}'"):
        Authenticator(tokens_file=path, required=True)


@pytest.mark.parametrize("line, message", [
    ("only-a-token", "expected 'TOKEN User:name', got 1 fields"),
    ("tok alice", "invalid principal 'alice'"),
    ("tok User:a extra", "expected 'TOKEN User:name', got 3 fields"),
])
def test_a_bad_tokens_file_line_is_an_error_naming_path_and_line(tmp_path, line, message):
    path = tmp_path / "tokens"
    path.write_text(f"# header\n{line}\n")
    with pytest.raises(InvalidConfig, match=re.escape(f"{path}:2: {message}")):
        Authenticator(tokens_file=path, required=True)


def test_one_token_mapped_to_two_principals_is_an_error(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("tok User:a\ntok User:b\n")
    with pytest.raises(InvalidConfig, match=":2: token already maps to User:a"):
        Authenticator(tokens_file=path, required=True)


def test_reload_picks_up_an_edited_tokens_file(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=True)
    tokens_file.write_text("new-token User:carol\n")
    auth.reload()
    assert auth.authenticate(bearer("new-token")) == "User:carol"
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate(bearer("file-token-alice"))


def test_with_mutual_tls_a_call_without_a_token_is_its_certificate_principal(tokens_file):
    auth = Authenticator(tokens_file=tokens_file, required=True, certificates=PrincipalMapper(LOWTIDE_RULES),
                         reserved_for_certificates=is_service_principal)
    assert auth.authenticate([], certificate_principal="User:broker-1") == "User:broker-1"
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate([])  # no token, no certificate


def test_with_mutual_tls_a_token_wins_over_the_certificate_for_an_ordinary_user(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alice-token User:alice\nbroker-token User:broker-2\n")
    auth = Authenticator(tokens_file=path, required=True, certificates=PrincipalMapper(LOWTIDE_RULES),
                         reserved_for_certificates=is_service_principal)
    assert auth.authenticate([("authorization", "Bearer alice-token")],
                             certificate_principal="User:admin") == "User:alice"


def test_with_mutual_tls_a_service_principal_cannot_come_from_a_token(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("broker-token User:broker-2\nfd-token User:frontdoor\n")
    auth = Authenticator(tokens_file=path, required=True, certificates=PrincipalMapper(LOWTIDE_RULES),
                         reserved_for_certificates=is_service_principal)
    for token in ("broker-token", "fd-token"):
        with pytest.raises(SaslAuthenticationFailed, match="authenticates with its certificate"):
            auth.authenticate([("authorization", f"Bearer {token}")], certificate_principal="User:admin")
    # without mutual TLS the same token is the broker, as before
    plain = Authenticator(tokens_file=path, required=True, reserved_for_certificates=is_service_principal)
    assert plain.authenticate([("authorization", "Bearer broker-token")]) == "User:broker-2"
