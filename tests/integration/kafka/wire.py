"""Raw Kafka requests for tests: one request entity (a ``kio`` class built from Kafka's own message
schemas) encoded with its header, sent on a fresh connection, and its answer decoded. No client
library decides what is sent."""

from __future__ import annotations

import io
import socket
import struct
import sys
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer


def request_module(api_key: int, version: int) -> Any:
    """The module of (api_key, version)'s request: its class and nested entity classes."""
    return sys.modules[load_request_schema(api_key, version).__module__]


def kafka_call(address: str, body: Any, *, correlation_id: int = 7, client_id: str = "lowtide-test") -> Any:
    """Send ``body`` to the Kafka listener at ``address`` (HOST:PORT) and return the response entity."""
    cls = type(body)
    buf = io.BytesIO()
    entity_writer(cls.__header_schema__)(buf, cls.__header_schema__(
        request_api_key=cls.__api_key__, request_api_version=cls.__version__, correlation_id=correlation_id,
        client_id=client_id))
    entity_writer(cls)(buf, body)
    payload = buf.getvalue()
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        answer = sock.recv(size, socket.MSG_WAITALL)
    response = load_response_schema(cls.__api_key__, cls.__version__)
    header, offset = entity_reader(response.__header_schema__)(answer, 0)
    assert header.correlation_id == correlation_id
    return entity_reader(response)(answer, offset)[0]
