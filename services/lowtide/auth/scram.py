"""SCRAM (RFC 5802) with SHA-256 (RFC 7677) and SHA-512, as Kafka speaks it (KIP-84): the
messages, the keys and the proof check. Pure functions and small objects: no I/O, no store.

The exchange, carried by two SaslAuthenticate round trips after a SaslHandshake::

    client-first  = gs2-header client-first-bare
      gs2-header  = ("n" | "y") "," ["a=" saslname] ","           "p=<cb-name>" is refused
      client-first-bare = "n=" saslname ",r=" c-nonce *("," ext)  ext "tokenauth=true" is refused
    server-first  = "r=" c-nonce s-nonce ",s=" base64(salt) ",i=" iterations
    client-final  = "c=" base64(gs2-header) ",r=" c-nonce s-nonce *("," ext) ",p=" base64(ClientProof)
    server-final  = "v=" base64(ServerSignature)

    saslname: "," is written "=2C" and "=" "=3D"; a nonce is printable ASCII without ",".

The keys (RFC 5802 §3). The server keeps salt, iterations, StoredKey and ServerKey, never the
password nor SaltedPassword (either would let a reader log in)::

    SaltedPassword  = PBKDF2-HMAC-H(UTF-8 password, salt, iterations)
    ClientKey       = HMAC(SaltedPassword, "Client Key")       StoredKey = H(ClientKey)
    ServerKey       = HMAC(SaltedPassword, "Server Key")
    AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
    ClientSignature = HMAC(StoredKey, AuthMessage)             ClientProof = ClientKey XOR ClientSignature
    ServerSignature = HMAC(ServerKey, AuthMessage)

The server recovers ClientKey = ClientProof XOR ClientSignature and accepts when H(ClientKey)
equals StoredKey (``hmac.compare_digest``). The password is not SASLprep-normalized: Kafka's Java
client, librdkafka and kafka-python all hash its UTF-8 bytes as they are, and a credential must
work from every client.

Every refusal raises ``SaslAuthenticationFailed``; the listener answers it and closes the connection.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from lowtide.errors import SaslAuthenticationFailed, UnacceptableCredential

# Kafka's ScramMechanism bounds: AlterUserScramCredentials refuses other counts.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
# Kafka's own tools default to 4096; twice that costs a client ~10 ms once per login, and the
# server nothing (it never runs PBKDF2 at login), for a stolen StoredKey that is twice as hard to crack.
DEFAULT_ITERATIONS = 8192
SALT_BYTES = 32
_NONCE_BYTES = 24


@dataclass(frozen=True, slots=True)
class Mechanism:
    """A SCRAM mechanism: its SASL name, Kafka's number for it (KIP-554) and its hash."""

    name: str
    code: int
    hash_name: str

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    def h(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """Hi(password, salt, i) of RFC 5802: PBKDF2 with this mechanism's HMAC."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)


SCRAM_SHA_256 = Mechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = Mechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
_BY_CODE = {m.code: m for m in MECHANISMS.values()}


def mechanism_named(name: str) -> Mechanism | None:
    return MECHANISMS.get(name.upper())


def mechanism_by_code(code: int) -> Mechanism | None:
    """Kafka's ScramMechanism number (1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512); None for others."""
    return _BY_CODE.get(int(code))


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server stores for one user and mechanism (RFC 5802's "authentication information")."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_salted_password(cls, mechanism: Mechanism, salted_password: bytes, salt: bytes,
                             iterations: int) -> ScramCredential:
        """The stored keys for a SaltedPassword (what Kafka's AlterUserScramCredentials carries)."""
        check_credential_input(mechanism, salt=salt, iterations=iterations, salted_password=salted_password)
        client_key = mechanism.hmac(salted_password, b"Client Key")
        return cls(salt=salt, iterations=iterations, stored_key=mechanism.h(client_key),
                   server_key=mechanism.hmac(salted_password, b"Server Key"))

    @classmethod
    def from_password(cls, mechanism: Mechanism, password: str, *, salt: bytes | None = None,
                      iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
        salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
        check_credential_input(mechanism, salt=salt, iterations=iterations)
        return cls.from_salted_password(mechanism, mechanism.salted_password(password, salt, iterations),
                                        salt, iterations)


def check_credential_input(mechanism: Mechanism, *, salt: bytes, iterations: int,
                           salted_password: bytes | None = None) -> None:
    """UnacceptableCredential unless the parts make a credential Kafka would accept."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise UnacceptableCredential(
            f"{mechanism.name} needs {MIN_ITERATIONS} to {MAX_ITERATIONS} iterations, got {iterations}")
    if not salt:
        raise UnacceptableCredential("the salt must not be empty")
    if salted_password is not None and len(salted_password) != mechanism.digest_size:
        # Every client derives SaltedPassword with PBKDF2 of the hash's size: another length can
        # never match a login, so it is refused when stored rather than at every login after.
        raise UnacceptableCredential(f"a {mechanism.name} salted password has {mechanism.digest_size} bytes, "
                                     f"got {len(salted_password)}")


# -- message pieces ---------------------------------------------------------------------------
def _fail(message: str) -> SaslAuthenticationFailed:
    return SaslAuthenticationFailed(f"Authentication failed: {message}")


def _text(data: bytes, what: str) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(f"the SCRAM {what} is not UTF-8") from None


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def decode_saslname(text: str) -> str:
    """RFC 5802 saslname: "=2C" -> ",", "=3D" -> "="; any other "=" is malformed."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "=":
            escape = text[i:i + 3]
            if escape not in ("=2C", "=3D"):
                raise _fail("malformed user name (a '=' must be written =2C or =3D)")
            out.append("," if escape == "=2C" else "=")
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _valid_nonce(nonce: str) -> bool:
    return bool(nonce) and all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce)


def _attribute(part: str, key: str, what: str) -> str:
    if not part.startswith(key + "="):
        raise _fail(f"malformed {what}: expected '{key}=' where {part[:16]!r} is")
    return part[len(key) + 1:]


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(f"{what} is not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class ClientFirst:
    gs2_header: str  # "n,," / "y,," / "n,a=alice," : the client-final's c= must repeat it
    username: str
    nonce: str
    bare: str  # client-first-bare, a part of the AuthMessage


def parse_client_first(data: bytes) -> ClientFirst:
    text = _text(data, "client-first message")
    parts = text.split(",")
    if len(parts) < 4:
        raise _fail("malformed SCRAM client-first message: expected 'n,,n=<user>,r=<nonce>'")
    flag, authz = parts[0], parts[1]
    if flag.startswith("p="):
        raise _fail("channel binding is not supported (use gs2 header 'n,,')")
    if flag not in ("n", "y"):
        raise _fail(f"malformed SCRAM gs2 header flag {flag[:16]!r}")
    bare_parts = parts[2:]
    if bare_parts[0].startswith("m="):
        raise _fail("SCRAM mandatory extensions are not supported")
    username = decode_saslname(_attribute(bare_parts[0], "n", "client-first message"))
    nonce = _attribute(bare_parts[1], "r", "client-first message")
    if not username:
        raise _fail("empty SCRAM user name")
    if not _valid_nonce(nonce):
        raise _fail("malformed SCRAM client nonce")
    if authz:
        authzid = decode_saslname(_attribute(authz, "a", "gs2 header"))
        if authzid != username:
            # Kafka's rule too: the identity logged in is the one acted as, never a second name.
            raise _fail(f"authorization id {authzid!r} differs from user {username!r}")
    for ext in bare_parts[2:]:
        key, sep, value = ext.partition("=")
        if not sep or not key:
            raise _fail("malformed SCRAM extension")
        if key == "tokenauth" and value.lower() == "true":
            raise _fail("delegation tokens (tokenauth=true) are not supported")
    return ClientFirst(gs2_header=f"{flag},{authz},", username=username, nonce=nonce, bare=",".join(bare_parts))


@dataclass(frozen=True, slots=True)
class ClientFinal:
    channel_binding: str
    nonce: str
    proof: bytes
    without_proof: str


def parse_client_final(data: bytes) -> ClientFinal:
    text = _text(data, "client-final message")
    head, sep, proof_text = text.rpartition(",p=")
    if not sep or "," in proof_text:
        raise _fail("malformed SCRAM client-final message: no proof at its end")
    parts = head.split(",")
    if len(parts) < 2:
        raise _fail("malformed SCRAM client-final message: expected 'c=...,r=...,p=...'")
    return ClientFinal(channel_binding=_attribute(parts[0], "c", "client-final message"),
                       nonce=_attribute(parts[1], "r", "client-final message"),
                       proof=_b64decode(proof_text, "the SCRAM client proof"), without_proof=head)


def new_nonce() -> str:
    """A fresh nonce: url-safe base64 never contains ','."""
    return secrets.token_urlsafe(_NONCE_BYTES)


# -- the server's side of one exchange --------------------------------------------------------
@dataclass
class ServerExchange:
    """One login's server state between the two SaslAuthenticate rounds.

    ``credential`` None means the user is unknown: the exchange still answers a server-first
    (with ``decoy_salt``) and fails only at the proof, with the same message as a wrong password,
    so a client cannot tell which user names exist.
    """

    mechanism: Mechanism
    client_first: ClientFirst
    credential: ScramCredential | None
    decoy_salt: bytes = b""
    server_nonce: str = field(default_factory=new_nonce)
    server_first: str = field(init=False)

    def __post_init__(self) -> None:
        if not _valid_nonce(self.server_nonce):
            raise ValueError("a server nonce is printable ASCII without ','")
        salt = self.credential.salt if self.credential is not None else self.decoy_salt
        iterations = self.credential.iterations if self.credential is not None else DEFAULT_ITERATIONS
        self.server_first = f"r={self.nonce},s={_b64(salt)},i={iterations}"

    @property
    def username(self) -> str:
        return self.client_first.username

    @property
    def nonce(self) -> str:
        return self.client_first.nonce + self.server_nonce

    def finish(self, client_final: bytes) -> str:
        """Check the client's proof; the server-final message when it holds, else raises."""
        final = parse_client_final(client_final)
        expected_binding = _b64(self.client_first.gs2_header.encode("utf-8"))
        if final.channel_binding != expected_binding:
            raise _fail("the SCRAM channel binding differs from the client-first message's gs2 header")
        if not hmac.compare_digest(final.nonce.encode("utf-8"), self.nonce.encode("utf-8")):
            raise _fail("the SCRAM nonce differs from the one this exchange started with")
        credential = self.credential
        auth_message = f"{self.client_first.bare},{self.server_first},{final.without_proof}".encode()
        if credential is None or len(final.proof) != self.mechanism.digest_size:
            raise _fail("invalid user credentials")
        client_signature = self.mechanism.hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(final.proof, client_signature, strict=True))
        if not hmac.compare_digest(self.mechanism.h(client_key), credential.stored_key):
            raise _fail("invalid user credentials")
        return "v=" + _b64(self.mechanism.hmac(credential.server_key, auth_message))


# -- the client's side (tests, tools) ---------------------------------------------------------
@dataclass
class ClientExchange:
    """A SCRAM client: ``first()``, then ``final(server_first)``, then ``verify(server_final)``."""

    mechanism: Mechanism
    username: str
    password: str
    nonce: str = field(default_factory=new_nonce)
    gs2_header: str = "n,,"
    _auth_message: bytes = b""
    _server_key: bytes = b""

    def first(self) -> bytes:
        return f"{self.gs2_header}{self.bare}".encode()

    @property
    def bare(self) -> str:
        return f"n={encode_saslname(self.username)},r={self.nonce}"

    def final(self, server_first: bytes) -> bytes:
        text = server_first.decode("utf-8")
        parts = text.split(",")
        nonce = _attribute(parts[0], "r", "server-first message")
        salt = _b64decode(_attribute(parts[1], "s", "server-first message"), "the salt")
        iterations = int(_attribute(parts[2], "i", "server-first message"))
        if not nonce.startswith(self.nonce):
            raise _fail("the server's nonce does not extend ours")
        salted = self.mechanism.salted_password(self.password, salt, iterations)
        client_key = self.mechanism.hmac(salted, b"Client Key")
        without_proof = f"c={_b64(self.gs2_header.encode('utf-8'))},r={nonce}"
        self._auth_message = f"{self.bare},{text},{without_proof}".encode()
        self._server_key = self.mechanism.hmac(salted, b"Server Key")
        signature = self.mechanism.hmac(self.mechanism.h(client_key), self._auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        expected = "v=" + _b64(self.mechanism.hmac(self._server_key, self._auth_message))
        if not hmac.compare_digest(server_final, expected.encode("ascii")):
            raise _fail("the server's signature is wrong: it does not know this credential")
