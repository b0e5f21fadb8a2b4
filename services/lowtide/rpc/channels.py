"""gRPC channels: the one ``ChannelPool`` every client, service and tool creates channels with.

One channel per address (gRPC multiplexes every call over it), one cached stub per (address,
stub type). A pool dials TLS when it is given a ``ClientTls`` or the process has a default one
(a server's own certificate, or ``LOWTIDE_TLS_*``; lowtide.tls.config), plaintext otherwise.
A TLS pool notices renewed certificate files (checked at most once a second): later calls go over
new channels presenting the new client certificate, calls in flight finish on the old ones.
``call`` invokes a unary RPC and turns a failed call back into the ``LowtideError`` it carried
(``rpc.status``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc

from lowtide.errors import InvalidRequest
from lowtide.rpc.status import error_from_rpc
from lowtide.tls.config import ClientTls, default_client_tls

# Large enough for a fetch or produce of several 8 MiB batches; the same limit on both ends.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A restarted Kubernetes pod keeps its DNS name but gets a new IP: re-resolve within a second
    # of a failed connection, not gRPC's default 30 s (during which calls to it fail).
    ("grpc.dns_min_time_between_resolutions_ms", 1000),
]

T = TypeVar("T")
ROTATION_CHECK_S = 1.0


def validate_address(address: str) -> str:
    """``HOST:PORT`` or raise InvalidRequest naming it (a typo must not hang a CLI for 30 s)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidRequest(f"bootstrap server must be HOST:PORT, got {address!r}")
    return address


class ChannelPool:
    """Caches one channel per address and one stub per (address, stub type).

    ``close()`` closes every channel; ``forget(address)`` closes one (a broker that moved).
    ``tls``: how to dial (None: the process default, see module doc; ``False``: plaintext).
    Thread-safe.
    """

    def __init__(self, *, tls: ClientTls | None | bool = None) -> None:
        self.tls: ClientTls | None = default_client_tls() if tls is None else (tls or None)  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[str, type], Any] = {}
        self._retired: list[grpc.Channel] = []  # channels opened before a certificate renewal
        self._stamp = _files_stamp(self.tls)
        self._next_check = time.monotonic() + ROTATION_CHECK_S

    def _channel_locked(self, address: str) -> grpc.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self.tls)
        return channel

    @staticmethod
    @contextmanager
    def oneshot(address: str, tls: ClientTls | None | bool = None) -> Iterator[grpc.Channel]:
        """An uncached channel, closed on exit. For probes of processes that come and go (health
        checks while a service restarts): a cached channel that saw the port closed would wait out
        gRPC's reconnect backoff (1 s, growing) before trying again."""
        channel = open_channel(address, default_client_tls() if tls is None else (tls or None))  # type: ignore[arg-type]
        try:
            yield channel
        finally:
            channel.close()

    def stub(self, address: str, stub_type: Callable[[grpc.Channel], T]) -> T:
        if self.tls is not None and time.monotonic() >= self._next_check:
            self._check_renewal()
        key = (address, stub_type)
        stub = self._stubs.get(key)
        if stub is None:
            with self._lock:
                stub = self._stubs.get(key)
                if stub is None:
                    stub = self._stubs[key] = stub_type(self._channel_locked(address))
        return stub

    def _check_renewal(self) -> None:
        with self._lock:
            now = time.monotonic()
            if now < self._next_check:
                return
            self._next_check = now + ROTATION_CHECK_S
            stamp = _files_stamp(self.tls)
            if stamp == self._stamp:
                return
            # A renewed certificate (or CA): new calls dial again and present it. The old channels
            # stay open for the calls (and streams) in flight on them; closed with the pool.
            self._stamp = stamp
            self._retired.extend(self._channels.values())
            self._channels, self._stubs = {}, {}

    def forget(self, address: str) -> None:
        with self._lock:
            channel = self._channels.pop(address, None)
            for key in [k for k in self._stubs if k[0] == address]:
                del self._stubs[key]
        if channel is not None:
            channel.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
            channels += self._retired
            self._retired = []
        for channel in channels:
            channel.close()


def _files_stamp(tls: ClientTls | None) -> tuple:
    """(inode, size, mtime) of the TLS files: what changes when a certificate is renewed."""
    if tls is None:
        return ()
    stamp = []
    for path in (tls.ca, tls.cert, tls.key):
        try:
            st = os.stat(path) if path is not None else None
            stamp.append((st.st_ino, st.st_size, st.st_mtime_ns) if st else None)
        except OSError:
            stamp.append(None)
    return tuple(stamp)


def open_channel(address: str, tls: ClientTls | None = None) -> grpc.Channel:
    """A channel to ``address``, over TLS when ``tls`` is given. The only place lowtide creates
    a channel: every one gets the same message-size limits."""
    if tls is None:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    # Files are read per channel, so a channel opened after a rotation presents the new certificate.
    return grpc.secure_channel(address, tls.channel_credentials(), options=[*CHANNEL_OPTIONS, *tls.channel_options()])


def call(method: Callable[..., T], request: Any, *, metadata: Sequence[tuple[str, str]] = (),
         timeout: float) -> T:
    """Invoke a unary RPC; a failed call raises the LowtideError it carried."""
    try:
        return method(request, metadata=list(metadata), timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None


class PooledClient:
    """Base of lowtide's gRPC clients: a channel pool (its own unless one is given) and the call
    metadata (``authorization: Bearer ...``) sent on every call.

    Thread-safe; ``close()`` closes the pool only if this client made it.
    """

    def __init__(self, *, channels: ChannelPool | None = None, metadata: Sequence[tuple[str, str]] = (),
                 tls: ClientTls | None = None) -> None:
        self._owns_channels = channels is None
        self.channels = channels or ChannelPool(tls=tls)
        self.metadata = tuple(metadata)

    def close(self) -> None:
        if self._owns_channels:
            self.channels.close()
