"""Length-prefixed frames on a plain (or TLS) socket: the wire of the framed listeners
(lowtide.rpc.framed.listener), which carry follower fetch rounds, coordinator appends and
CommitFile calls to coordinator shards without gRPC.

Why not gRPC for this one exchange: a follower round is one small request and one answer, all day
long, on one connection. On this 2-core machine a round on a gRPC stream costs ~520 us of CPU
(client 300 + server 220: four thread hand-offs per message in grpcio's Python layer), a round on a
socket ~80 us (``docs/design/kip-107-delete-records.md#replication-and-the-low-watermark``); with
small produce requests and diskless commits every append costs one round per follower.

Frame layout (all integers big-endian)::

    frame   := length:uint32  kind:uint8  payload:bytes[length - 1]
    length  := 1 + len(payload), at most MAX_FRAME_BYTES (64 MiB, the gRPC message limit)

    kind 1  HELLO     client -> server, first frame only: JSON {"metadata": [[key, value], ...]},
                      the call metadata a gRPC call would carry (``authorization: Bearer ...``)
    kind 2  REQUEST   client -> server: a serialized protobuf request (replica.proto FetchRequest)
    kind 3  RESPONSE  server -> client: the serialized answer to the last REQUEST
    kind 4  ERROR     server -> client: JSON {"code": <Kafka error code>, "message": str}; the
                      server closes the connection after it
    kind 5  PRODUCE   client -> server: a serialized replica.proto ProduceRequest (a coordinator's
                      append to its internal topic); answered by a RESPONSE (ProduceResponse)
    kind 6  CALL      client -> server: method_length:uint8  method:ASCII  request:bytes, a
                      serialized request of that method of the server's gRPC service (a
                      coordinator shard's ``CommitFile``); answered by a RESPONSE (its response)

One frame on the wire, byte by byte (``encode_frame(REQUEST, b"abc")``)::

    offset   0     1     2     3     4     5     6     7
           +-----+-----+-----+-----+-----+-----+-----+-----+
           | 00  | 00  | 00  | 04  | 02  | 'a' | 'b' | 'c' |
           +-----+-----+-----+-----+-----+-----+-----+-----+
           |  length = 1 + 3 (BE uint32) | kind| payload ...
                                           = REQUEST

    a CALL frame's payload (``encode_call("CommitFile", request)``)::

           +-----+-----+-----+-- ... --+-----+------------ ... ------------+
           | 0a  | 'C' | 'o' |   ...   | 'e' | request (serialized protobuf) |
           +-----+-----+-----+-- ... --+-----+------------ ... ------------+
           len=10 |<--- method: 10 ASCII bytes --->|

    a connection: HELLO, then REQUEST/PRODUCE/CALL and RESPONSE in turn, or an ERROR and the end::

        client                                   server
          | HELLO {"metadata": [...]}           ->  |  authenticated once per connection
          | REQUEST | PRODUCE | CALL            ->  |
          | <-  RESPONSE                             |
          | ...                                      |
          | REQUEST | PRODUCE | CALL            ->  |
          | <-  ERROR {"code", "message"}            |  then the server closes

Requests and answers alternate: a client sends a REQUEST, PRODUCE or CALL only after it read the answer
to the previous one, so no correlation id is needed.

Thread-safety: ``FrameReader`` belongs to one reading thread (``read_frame_async`` to one
coroutine); ``write_frame`` sends a frame with one ``sendall`` (callers writing one socket from
several threads serialize themselves).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

from lowtide.errors import InvalidRequest, LowtideError, NetworkException, error_for_code

HELLO, REQUEST, RESPONSE, ERROR, PRODUCE, CALL = 1, 2, 3, 4, 5, 6
KINDS = (HELLO, REQUEST, RESPONSE, ERROR, PRODUCE, CALL)
MAX_FRAME_BYTES = 64 * 1024 * 1024
HEADER = struct.Struct(">IB")


def frame_header(kind: int, payload_bytes: int) -> bytes:
    """A frame's length and kind, checked (INVALID_REQUEST for an unknown kind or an oversize frame)."""
    if kind not in KINDS:
        raise InvalidRequest(f"unknown frame kind {kind}")
    if payload_bytes + 1 > MAX_FRAME_BYTES:
        raise InvalidRequest(f"a frame of {payload_bytes + 1} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    return HEADER.pack(payload_bytes + 1, kind)


def encode_frame(kind: int, payload: bytes) -> bytes:
    """One frame's bytes (see the module's layout)."""
    return frame_header(kind, len(payload)) + payload


def write_frame(sock: socket.socket, kind: int, payload: bytes) -> None:
    header = frame_header(kind, len(payload))
    if len(payload) < 65536:
        sock.sendall(header + payload)
    else:  # a large answer: no copy of its payload into a joined buffer
        sock.sendall(header)
        sock.sendall(payload)


def encode_call(method: str, request: bytes) -> bytes:
    """A CALL frame's payload: ``method`` (ASCII, at most 255 bytes) then the serialized request."""
    name = method.encode("ascii", errors="replace")
    if not 0 < len(name) < 256 or not method.isascii():
        raise InvalidRequest(f"method name {method!r} must be 1 to 255 ASCII bytes")
    return bytes((len(name),)) + name + request


def decode_call(payload: bytes) -> tuple[str, bytes]:
    """(method, serialized request) of a CALL frame's payload; INVALID_REQUEST if it is not one."""
    if not payload or len(payload) < 1 + payload[0] or payload[0] == 0:
        raise InvalidRequest("malformed CALL frame: no method name")
    size = payload[0]
    try:
        method = payload[1:1 + size].decode("ascii")
    except UnicodeDecodeError:
        raise InvalidRequest("malformed CALL frame: the method name is not ASCII") from None
    return method, payload[1 + size:]


def encode_error(error: LowtideError) -> bytes:
    return json.dumps({"code": error.code, "message": str(error)}).encode()


def decode_error(payload: bytes) -> LowtideError:
    """The error an ERROR frame carries (a malformed one: NETWORK_EXCEPTION saying so)."""
    try:
        body = json.loads(payload)
        return error_for_code(int(body["code"]), str(body.get("message", "")))
    except (ValueError, KeyError, TypeError):
        return NetworkException(f"the peer sent a malformed error frame: {payload[:80]!r}")


def encode_hello(metadata: list[tuple[str, str]]) -> bytes:
    return json.dumps({"metadata": [[k, v] for k, v in metadata]}).encode()


def decode_hello(payload: bytes) -> list[tuple[str, str]]:
    """The call metadata of a HELLO frame; INVALID_REQUEST if it is not one."""
    try:
        body: Any = json.loads(payload)
        pairs = body["metadata"]
        if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and
                                                  all(isinstance(s, str) for s in p) for p in pairs):
            raise TypeError("metadata must be a list of [key, value] strings")
        return [(k, v) for k, v in pairs]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"malformed HELLO frame: {exc}") from None


def check_header(length: int, kind: int) -> None:
    """INVALID_REQUEST for a frame header no reader may trust (unknown kind, length out of range)."""
    if kind not in KINDS:
        raise InvalidRequest(f"unknown frame kind {kind}")
    if not 1 <= length <= MAX_FRAME_BYTES:
        raise InvalidRequest(f"frame length {length} is outside 1..{MAX_FRAME_BYTES}")


async def read_frame_async(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """``FrameReader.read`` on an asyncio stream: (kind, payload), None at a clean end of stream
    between frames, NETWORK_EXCEPTION inside one, INVALID_REQUEST for a bad header."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise NetworkException(f"the connection closed inside a frame header ({len(exc.partial)} bytes)") from None
    length, kind = HEADER.unpack(header)
    check_header(length, kind)
    try:
        payload = await reader.readexactly(length - 1) if length > 1 else b""
    except asyncio.IncompleteReadError as exc:
        raise NetworkException(f"the connection closed inside a frame ({len(exc.partial)} of {length - 1} "
                               "bytes read)") from None
    return kind, payload


class FrameReader:
    """Reads whole frames from a socket: ``read()`` -> (kind, payload), or None at a clean end of
    stream (the peer closed between frames). A stream ending inside a frame raises
    NETWORK_EXCEPTION; a bad length or kind raises INVALID_REQUEST (nothing after it can be
    trusted: the caller closes the connection)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def _read_exactly(self, n: int, *, at_start: bool = False) -> bytes | None:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:], n - got)
            if k == 0:
                if at_start and got == 0:
                    return None
                raise NetworkException(f"the connection closed inside a frame ({got} of {n} bytes read)")
            got += k
        return bytes(buf) if n < 65536 else buf  # type: ignore[return-value]  # both are buffers

    def read(self) -> tuple[int, bytes] | None:
        header = self._read_exactly(HEADER.size, at_start=True)
        if header is None:
            return None
        length, kind = HEADER.unpack(header)
        check_header(length, kind)
        payload = self._read_exactly(length - 1) if length > 1 else b""
        assert payload is not None
        return kind, payload
