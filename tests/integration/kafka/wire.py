"""Raw Kafka requests for tests: request entities (``kio`` classes built from Kafka's own message
schemas) encoded with their header, sent on a connection, and their answers decoded. No client
library decides what is sent."""

from __future__ import annotations

import io
import socket
import struct
import sys
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 17, 36


def request_module(api_key: int, version: int) -> Any:
    """The module of (api_key, version)'s request: its class and nested entity classes."""
    return sys.modules[load_request_schema(api_key, version).__module__]


class KafkaConnection:
    """One connection to a Kafka listener; requests are answered in order. A context manager."""

    def __init__(self, address: str, *, client_id: str = "lowtide-test") -> None:
        host, port = address.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=20)
        self._client_id = client_id
        self._next_id = 1

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._sock.close()

    def call(self, body: Any) -> Any:
        """Send ``body`` and return the response entity."""
        cls = type(body)
        correlation_id, self._next_id = self._next_id, self._next_id + 1
        buf = io.BytesIO()
        entity_writer(cls.__header_schema__)(buf, cls.__header_schema__(
            request_api_key=cls.__api_key__, request_api_version=cls.__version__, correlation_id=correlation_id,
            client_id=self._client_id))
        entity_writer(cls)(buf, body)
        payload = buf.getvalue()
        self._sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", self._read_exactly(4))[0]
        answer = self._read_exactly(size)
        response = load_response_schema(cls.__api_key__, cls.__version__)
        header, offset = entity_reader(response.__header_schema__)(answer, 0)
        assert header.correlation_id == correlation_id
        return entity_reader(response)(answer, offset)[0]

    def _read_exactly(self, size: int) -> bytes:
        """``size`` bytes: MSG_WAITALL may still return short on a large answer (a signal, a full
        socket buffer), so read until all came or the peer closed."""
        chunks, missing = [], size
        while missing:
            chunk = self._sock.recv(missing, socket.MSG_WAITALL)
            if not chunk:
                raise ConnectionError(f"connection closed with {missing} of {size} bytes of an answer unread")
            chunks.append(chunk)
            missing -= len(chunk)
        return b"".join(chunks)

    def sasl_plain(self, user: str, password: str) -> None:
        """Log in with SASL/PLAIN (SaslHandshake v1, SaslAuthenticate v2); asserts it succeeded."""
        handshake = self.call(request_module(SASL_HANDSHAKE_KEY, 1).SaslHandshakeRequest(mechanism="PLAIN"))
        assert int(handshake.error_code) == 0, handshake
        answer = self.call(request_module(SASL_AUTHENTICATE_KEY, 2).SaslAuthenticateRequest(
            auth_bytes=b"\0" + user.encode() + b"\0" + password.encode()))
        assert int(answer.error_code) == 0, answer


def kafka_call(address: str, body: Any) -> Any:
    """Send ``body`` on a fresh connection to the Kafka listener at ``address`` (HOST:PORT)."""
    with KafkaConnection(address) as conn:
        return conn.call(body)
