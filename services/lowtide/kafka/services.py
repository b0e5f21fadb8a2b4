"""What a Kafka request reaches: the same gRPC servicers a gRPC request reaches, never a copy.

A Kafka handler turns the Kafka message into the lowtide.v1 protobuf request and calls the
service by method name; the answer comes back as the protobuf response. Two kinds of callers:

* ``InProcess``: the servicer object of this process (the replica's ``ReplicaServicer``, the front
  door's ``AdminServicer``), called directly with a context that carries the connection's
  identity. Access checks, errors and metrics are those of the gRPC path.
* ``Remote``: a gRPC stub to another service (a replica's Kafka listener sends admin and group
  requests to the front door), with the connection's identity as call metadata.

Either raises ``LowtideError`` for a whole-call failure, as ``lowtide.client`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from lowtide.errors import LowtideError, UnknownServerError
from lowtide.kafka.listener import Connection
from lowtide.rpc.channels import ChannelPool, call


class ServiceCaller(Protocol):
    def __call__(self, method: str, request: Any, *, conn: Connection, timeout_s: float | None = None) -> Any: ...


class _Context:
    """The part of ``grpc.ServicerContext`` the servicers use, backed by a Kafka connection."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def invocation_metadata(self) -> Sequence[tuple[str, str]]:
        return self._conn.metadata

    def peer(self) -> str:
        return self._conn.peer

    def auth_context(self) -> dict[str, list[bytes]]:
        # No gRPC peer certificate: a Kafka connection's identity, a client certificate's on an SSL
        # listener included, reaches the services as call metadata only (kafka/tls_identity.py).
        return {}

    def add_callback(self, callback) -> bool:
        self._conn.on_close(callback)
        return True

    def is_active(self) -> bool:
        return not self._conn.closed.is_set()

    def time_remaining(self) -> float | None:
        return None

    def abort(self, code: grpc.StatusCode, details: str):
        raise UnknownServerError(f"{code.name}: {details}")

    def set_code(self, code) -> None:  # pragma: no cover - servicers only abort through errors
        pass

    def set_details(self, details) -> None:  # pragma: no cover
        pass


@dataclass(frozen=True)
class InProcess:
    """Calls ``servicer.<method>(request, context)`` in this process."""

    servicer: Any

    def __call__(self, method: str, request: Any, *, conn: Connection, timeout_s: float | None = None) -> Any:
        return getattr(self.servicer, method)(request, _Context(conn))


class Remote:
    """Calls ``method`` on the gRPC service at ``address`` with the connection's identity."""

    def __init__(self, *, address: str, stub_type: type, channels: ChannelPool | None = None,
                 timeout_s: float = 30.0) -> None:
        self.address = address
        self._stub_type = stub_type
        self.channels = self._channels = channels or ChannelPool()
        self._timeout_s = timeout_s

    def __call__(self, method: str, request: Any, *, conn: Connection, timeout_s: float | None = None) -> Any:
        stub = self._channels.stub(self.address, self._stub_type)
        return call(getattr(stub, method), request, metadata=conn.metadata, timeout=timeout_s or self._timeout_s)

    def close(self) -> None:
        self._channels.close()


def unavailable(what: str) -> ServiceCaller:
    """A caller for a service this listener cannot reach (a front door has no local replicas)."""

    def refuse(method: str, request: Any, *, conn: Connection, timeout_s: float | None = None) -> Any:
        raise LowtideError(f"{what} is not served here")

    return refuse
