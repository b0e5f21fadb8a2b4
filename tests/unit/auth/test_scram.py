"""SCRAM math and messages (RFC 5802, RFC 7677): the RFC's own exchange byte for byte, and every
way a client-first or client-final message can be refused."""

from __future__ import annotations

import base64

import pytest

from lowtide.auth.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ClientExchange,
    ScramCredential,
    ServerExchange,
    decode_saslname,
    encode_saslname,
    mechanism_by_code,
    parse_client_first,
)
from lowtide.errors import SaslAuthenticationFailed, UnacceptableCredential

# RFC 7677 §3: user "user", password "pencil", SCRAM-SHA-256, 4096 iterations.
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_credential() -> ScramCredential:
    return ScramCredential.from_password(SCRAM_SHA_256, "pencil", salt=RFC_SALT, iterations=4096)


def server(credential: ScramCredential | None, client_first: bytes = RFC_CLIENT_FIRST,
           nonce: str = RFC_SERVER_NONCE) -> ServerExchange:
    return ServerExchange(mechanism=SCRAM_SHA_256, client_first=parse_client_first(client_first),
                          credential=credential, decoy_salt=b"decoy-salt", server_nonce=nonce)


def test_the_server_side_reproduces_rfc_7677_byte_for_byte():
    exchange = server(rfc_credential())
    assert exchange.server_first.encode() == RFC_SERVER_FIRST
    assert exchange.finish(RFC_CLIENT_FINAL).encode() == RFC_SERVER_FINAL


def test_the_client_side_reproduces_rfc_7677_byte_for_byte():
    client = ClientExchange(SCRAM_SHA_256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)  # raises when the server's signature is not the RFC's


def test_the_stored_credential_holds_keys_but_neither_the_password_nor_the_salted_password():
    credential = rfc_credential()
    salted = SCRAM_SHA_256.salted_password("pencil", RFC_SALT, 4096)
    assert credential == ScramCredential.from_salted_password(SCRAM_SHA_256, salted, RFC_SALT, 4096)
    assert salted not in (credential.stored_key, credential.server_key)
    assert b"pencil" not in credential.stored_key + credential.server_key + credential.salt


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512], ids=lambda m: m.name)
def test_a_client_with_the_right_password_logs_in_and_verifies_the_server(mechanism):
    credential = ScramCredential.from_password(mechanism, "s3cret, with = signs", iterations=MIN_ITERATIONS)
    client = ClientExchange(mechanism, "ali,ce=", "s3cret, with = signs")
    exchange = ServerExchange(mechanism=mechanism, client_first=parse_client_first(client.first()),
                              credential=credential)
    assert exchange.username == "ali,ce="
    client.verify(exchange.finish(client.final(exchange.server_first.encode())).encode())


def test_a_wrong_password_is_refused():
    client = ClientExchange(SCRAM_SHA_256, "user", "not-pencil", nonce=RFC_CLIENT_NONCE)
    exchange = server(rfc_credential(), client.first())
    with pytest.raises(SaslAuthenticationFailed, match="invalid user credentials"):
        exchange.finish(client.final(exchange.server_first.encode()))


def test_an_unknown_user_gets_a_server_first_message_and_fails_like_a_wrong_password():
    client = ClientExchange(SCRAM_SHA_256, "nobody", "pencil")
    exchange = server(None, client.first())
    assert f"s={base64.b64encode(b'decoy-salt').decode()}" in exchange.server_first
    with pytest.raises(SaslAuthenticationFailed, match="invalid user credentials"):
        exchange.finish(client.final(exchange.server_first.encode()))


def test_a_client_final_message_with_another_nonce_is_refused():
    tampered = RFC_CLIENT_FINAL.replace(b"hNlF$k0", b"hNlF$k1")
    with pytest.raises(SaslAuthenticationFailed, match="nonce"):
        server(rfc_credential()).finish(tampered)


def test_a_proof_replayed_into_a_new_exchange_is_refused():
    # the same client nonce, but this server picked a fresh nonce: the old proof is worthless
    with pytest.raises(SaslAuthenticationFailed, match="nonce"):
        server(rfc_credential(), nonce="fresh-server-nonce").finish(RFC_CLIENT_FINAL)


def test_a_client_final_message_whose_channel_binding_differs_from_the_gs2_header_is_refused():
    tampered = RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws")  # "y,," while the client-first said "n,,"
    with pytest.raises(SaslAuthenticationFailed, match="channel binding"):
        server(rfc_credential()).finish(tampered)


@pytest.mark.parametrize("message", [
    b"c=biws,r=" + RFC_CLIENT_NONCE.encode() + RFC_SERVER_NONCE.encode(),  # no proof
    RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=!!zb"),  # proof not base64
    RFC_CLIENT_FINAL.replace(b"=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=", b"=AAAA"),  # proof too short
    b"r=x,c=biws,p=AAAA",  # attributes out of order
    b"\xff\xfe",  # not UTF-8
], ids=["no-proof", "proof-not-base64", "short-proof", "out-of-order", "not-utf8"])
def test_a_malformed_client_final_message_is_refused(message):
    with pytest.raises(SaslAuthenticationFailed):
        server(rfc_credential()).finish(message)


def test_the_y_flag_without_an_authorization_id_is_accepted():
    first = parse_client_first(b"y,,n=user,r=abc")
    assert (first.gs2_header, first.username, first.nonce, first.bare) == ("y,,", "user", "abc", "n=user,r=abc")


def test_an_authorization_id_equal_to_the_user_is_accepted():
    assert parse_client_first(b"n,a=alice,n=alice,r=abc").gs2_header == "n,a=alice,"


@pytest.mark.parametrize(("message", "reason"), [
    (b"n,a=admin,n=alice,r=abc", "authorization id"),
    (b"p=tls-unique,,n=alice,r=abc", "channel binding"),
    (b"q,,n=alice,r=abc", "gs2 header"),
    (b"n,,m=ext,n=alice,r=abc", "mandatory extensions"),
    (b"n,,n=alice,r=abc,tokenauth=true", "delegation tokens"),
    (b"n,,n=,r=abc", "empty SCRAM user"),
    (b"n,,n=al=2Xice,r=abc", "user name"),
    (b"n,,n=alice,r=", "nonce"),
    (b"n,,n=alice,r=a\x7fb", "nonce"),
    (b"n,,r=abc,n=alice", "expected 'n='"),
    (b"n,,n=alice", "malformed"),
    (b"\xc3\x28,,n=alice,r=abc", "UTF-8"),
], ids=["other-authzid", "channel-binding", "bad-flag", "mandatory-ext", "tokenauth", "empty-user",
        "bad-escape", "empty-nonce", "nonprintable-nonce", "out-of-order", "too-short", "not-utf8"])
def test_a_client_first_message_is_refused_when(message, reason):
    with pytest.raises(SaslAuthenticationFailed, match=reason):
        parse_client_first(message)


def test_sasl_names_escape_commas_and_equals_signs():
    assert encode_saslname("a,b=c") == "a=2Cb=3Dc"
    assert decode_saslname("a=2Cb=3Dc") == "a,b=c"


@pytest.mark.parametrize("iterations", [MIN_ITERATIONS - 1, MAX_ITERATIONS + 1])
def test_a_credential_outside_kafkas_iteration_bounds_is_unacceptable(iterations):
    with pytest.raises(UnacceptableCredential, match="iterations"):
        ScramCredential.from_password(SCRAM_SHA_256, "pw", iterations=iterations)


def test_a_salted_password_of_the_wrong_length_is_unacceptable():
    with pytest.raises(UnacceptableCredential, match="32 bytes"):
        ScramCredential.from_salted_password(SCRAM_SHA_256, b"short", b"salt", 4096)


def test_kafkas_mechanism_numbers_name_the_mechanisms():
    assert (mechanism_by_code(1), mechanism_by_code(2), mechanism_by_code(0)) == (SCRAM_SHA_256, SCRAM_SHA_512, None)
