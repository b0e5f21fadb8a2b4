"""Kafka's request/response framing and headers, over ``kio``'s generated message entities.

A connection carries frames; every request is answered in order (``acks=0`` Produce excepted)::

    frame     := size:int32 payload[size]             size <= socket.request.max.bytes
    request   := header body
    header v1 := api_key:int16 api_version:int16 correlation_id:int32 client_id:nullable_string(int16 len)
    header v2 := header v1 tagged_fields:uvarint-count{...}    (the API version is "flexible")
    response  := correlation_id:int32 [tagged_fields if header v1] body
                 (ApiVersions answers always use response header v0: no tagged fields, so a
                 client that does not know our versions yet can read the answer)

Bodies are ``kio`` dataclasses generated from Kafka's own message schemas (every version, flexible
versions and tagged fields included): ``read_request`` turns bytes into one, ``encode_response``
turns one into a frame. Record batches inside them stay ``bytes`` (kio's ``Records``): nothing here
looks at a record.

``error_response`` builds the answer Kafka gives a request it will not serve (an unsupported
version, a refused identity): every error code of the response set to the error, every list empty.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import uuid
from collections.abc import Callable
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

# Kafka's socket.request.max.bytes default: a bigger frame closes the connection unread.
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024

API_VERSIONS_KEY = 18
_HEAD = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")
_CLASSIC_HEAD = struct.Struct(">ii")  # size, correlation_id
_FLEXIBLE_HEAD = struct.Struct(">iiB")  # size, correlation_id, no tagged fields

UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42


class FrameError(Exception):
    """The bytes are not a Kafka request this listener can read: the connection is closed
    (Kafka closes it too: a reader cannot find the next frame's start after garbage)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHead:
    """The fixed start of every request header: enough to answer even an unreadable body."""

    api_key: int
    api_version: int
    correlation_id: int

    @classmethod
    def parse(cls, payload: bytes | memoryview) -> RequestHead:
        if len(payload) < _HEAD.size:
            raise FrameError(f"a request of {len(payload)} bytes has no header")
        return cls(*_HEAD.unpack_from(payload, 0))


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    head: RequestHead
    client_id: str | None
    body: Any  # a kio request entity


@cache
def request_type(api_key: int, version: int) -> type | None:
    """kio's request entity of (api_key, version), or None when kio (Kafka) has no such message."""
    try:
        return load_request_schema(api_key, version)
    except Exception:  # kio raises its own index errors, and ImportError for a missing module
        return None


@cache
def response_type(api_key: int, version: int) -> type | None:
    try:
        return load_response_schema(api_key, version)
    except Exception:
        return None


@cache
def _reader(entity: type) -> Callable:
    return entity_reader(entity)


@cache
def _writer(entity: type) -> Callable:
    return entity_writer(entity)


def read_request(payload: bytes, head: RequestHead) -> Request:
    """Parse header and body of a request whose (api_key, version) kio knows.

    Raises ``FrameError`` when the bytes do not parse. Bytes after the body are ignored, as Kafka
    ignores them (librdkafka's Metadata v12 carries three).
    """
    entity = request_type(head.api_key, head.api_version)
    if entity is None:
        raise FrameError(f"no message schema for api {head.api_key} v{head.api_version}")
    try:
        header, offset = _reader(entity.__header_schema__)(payload, 0)
        body, _ = _reader(entity)(payload, offset)
    except Exception as exc:  # the native reader raises ValueError/IndexError/OverflowError...
        raise FrameError(f"unreadable api {head.api_key} v{head.api_version} request: {exc}") from exc
    return Request(head=head, client_id=header.client_id, body=body)


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedBody:
    """A response body a hot path encoded itself (``kafka/produce_codec.py``), with whether its
    version is flexible (which decides the response header)."""

    data: bytes
    flexible: bool


def encode_body(body: Any) -> EncodedBody:
    """A kio response entity encoded once, to be sent again as it is (``EncodedBody``)."""
    buf = io.BytesIO()
    _writer(type(body))(buf, body)
    return EncodedBody(buf.getvalue(), flexible=bool(type(body).__flexible__))


def encode_response(head: RequestHead, body: Any) -> bytes:
    """The whole response frame (size prefix included) answering ``head`` with ``body`` (a kio
    entity, or an ``EncodedBody``)."""
    if isinstance(body, EncodedBody):
        if body.flexible and head.api_key != API_VERSIONS_KEY:
            return _FLEXIBLE_HEAD.pack(len(body.data) + 5, head.correlation_id, 0) + body.data
        return _CLASSIC_HEAD.pack(len(body.data) + 4, head.correlation_id) + body.data
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    buf.write(struct.pack(">i", head.correlation_id))
    flexible_header = type(body).__flexible__ and head.api_key != API_VERSIONS_KEY
    if flexible_header:
        buf.write(b"\0")  # no tagged fields in the response header
    _writer(type(body))(buf, body)
    frame = buf.getbuffer()
    _SIZE.pack_into(frame, 0, len(frame) - 4)
    out = bytes(frame)
    del frame
    return out


NO_THROTTLE = datetime.timedelta(0)


def millis(value: datetime.timedelta | int) -> int:
    """A Kafka duration field (kio gives timedeltas) in milliseconds."""
    return int(value.total_seconds() * 1000) if isinstance(value, datetime.timedelta) else int(value)


def error_code(code: int) -> ErrorCode:
    """kio's enum member of a Kafka error code (lowtide's errors carry Kafka's numbers)."""
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def error_response(api_key: int, version: int, code: int) -> Any | None:
    """The response Kafka sends for a request it refuses as a whole: every ``error_code`` field
    is ``code``, numbers are -1/0, strings empty, lists empty. None if kio has no response schema."""
    entity = response_type(api_key, version)
    if entity is None:
        # A version newer (or older) than Kafka's schemas know: answered in the nearest known one,
        # so the client still gets its correlation id and the error instead of a closed socket.
        known = [v for v in range(0, 64) if response_type(api_key, v) is not None]
        if not known:
            return None
        entity = response_type(api_key, min(known, key=lambda v: abs(v - version)))
    return _filled(entity, error_code(code))


def _filled(entity: type, code: ErrorCode) -> Any:
    values = {}
    for f in dataclasses.fields(entity):
        kafka_type = f.metadata.get("kafka_type")
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            if kafka_type == "error_code":
                values[f.name] = code
            continue
        values[f.name] = _default_for(f, kafka_type, code)
    return entity(**values)


def _default_for(f: dataclasses.Field, kafka_type: str | None, code: ErrorCode) -> Any:
    if kafka_type is None:  # a list of entities, or one nested entity
        hint = str(f.type)
        if hint.startswith("tuple"):
            return ()
        nested = _nested_type(f)
        return None if nested is None or "None" in hint else _filled(nested, code)
    if kafka_type == "error_code":
        return code
    if kafka_type in ("string",):
        return None if "None" in str(f.type) else ""
    if kafka_type in ("bytes", "records"):
        return None if "None" in str(f.type) else b""
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return None if "None" in str(f.type) else uuid.UUID(int=0)
    if kafka_type.startswith("timedelta"):
        return datetime.timedelta(0)
    if kafka_type.startswith("datetime"):
        return None if "None" in str(f.type) else datetime.datetime.fromtimestamp(0, datetime.UTC)
    if kafka_type == "float64":
        return 0.0
    return -1 if kafka_type in ("int32", "int64") and f.name.endswith(("_id", "epoch", "offset")) else 0


def _nested_type(f: dataclasses.Field) -> type | None:
    resolved = f.type if isinstance(f.type, type) else None
    return resolved
