"""Bearer-token authentication from gRPC metadata, with tokens in a file and in a real Redis."""

from __future__ import annotations

import re

import pytest

from lowtide.auth.identity import is_service_principal
from lowtide.auth.tokens import TOKENS_KEY, Authenticator, add_token, remove_token
from lowtide.errors import InvalidConfig, SaslAuthenticationFailed
from lowtide.tls.principal import LOWTIDE_RULES, PrincipalMapper


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


def test_a_known_token_from_redis_authenticates_its_principal(redis_client):
    auth = Authenticator(redis=redis_client, required=True)
    auth.add_token("redis-token", "User:spark")
    assert auth.authenticate(bearer("redis-token")) == "User:spark"


def test_redis_stores_a_digest_never_the_token_itself(redis_client):
    add_token(redis_client, token="s3cr3t", principal="User:alice")
    fields = redis_client.hkeys(TOKENS_KEY)
    assert len(fields) == 1 and b"s3cr3t" not in fields[0] and fields[0].startswith(b"sha256:")


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
def test_an_unknown_token_always_fails(tokens_file, redis_client, required):
    auth = Authenticator(redis=redis_client, tokens_file=tokens_file, required=required)
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


def test_a_revoked_redis_token_stops_working_once_the_cache_expires(redis_client):
    now = [0.0]
    auth = Authenticator(redis=redis_client, required=True, clock=lambda: now[0])
    auth.add_token("t1", "User:alice")
    assert auth.authenticate(bearer("t1")) == "User:alice"
    assert remove_token(redis_client, token="t1")
    now[0] += 1.5
    with pytest.raises(SaslAuthenticationFailed):
        auth.authenticate(bearer("t1"))


def test_a_token_added_after_a_failed_attempt_works_at_once_through_add_token(redis_client):
    auth = Authenticator(redis=redis_client, required=True)
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
