"""gRPC channels of the client: one per address, shared by the client objects that made them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from lowtide.common.interceptor import error_from_rpc
from lowtide.common.server import MAX_MESSAGE_BYTES

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]

T = TypeVar("T")


def validate_address(address: str) -> str:
    """``HOST:PORT`` or raise InvalidRequest naming it (a typo must not hang a CLI for 30 s)."""
    from lowtide.errors import InvalidRequest

    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidRequest(f"bootstrap server must be HOST:PORT, got {address!r}")
    return address


class ChannelPool:
    """Caches one channel and stub per (address, stub type). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[str, type], Any] = {}

    def stub(self, address: str, stub_type: Callable[[grpc.Channel], T]) -> T:
        key = (address, stub_type)
        stub = self._stubs.get(key)
        if stub is None:
            with self._lock:
                stub = self._stubs.get(key)
                if stub is None:
                    channel = self._channels.get(address)
                    if channel is None:
                        channel = self._channels[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                    stub = self._stubs[key] = stub_type(channel)
        return stub

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()


def call(method: Callable[..., T], request: Any, *, metadata: Sequence[tuple[str, str]], timeout: float) -> T:
    """Invoke a unary RPC; a failed call raises the LowtideError it carried."""
    try:
        return method(request, metadata=list(metadata), timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
