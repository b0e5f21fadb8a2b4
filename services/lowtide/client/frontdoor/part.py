"""``RemotePart``: the base of the front door's remote domain objects (package doc)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from lowtide.rpc.channels import call
from lowtide_pb import admin_pb2_grpc

T = TypeVar("T")


class RemotePart:
    """Base of one remote domain object: the Admin stub, the caller's metadata, the deadline."""

    def __init__(self, stub: admin_pb2_grpc.AdminStub, *, metadata: Sequence[tuple[str, str]],
                 timeout_s: float) -> None:
        self._stub = stub
        self._metadata = metadata
        self._timeout_s = timeout_s

    def _call(self, rpc: Callable[..., T], request: Any, *, timeout_s: float | None = None) -> T:
        """One unary call; a failed call raises the LowtideError it carried."""
        return call(rpc, request, metadata=self._metadata, timeout=timeout_s or self._timeout_s)
