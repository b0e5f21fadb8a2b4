"""A framed listener's sessions (lowtide.rpc.framed.listener): the contract a server's handler
keeps (``FramedSession``) and the dispatch every server's session shares (``FrameDispatcher``).

The listener does the connection's plumbing for every server alike: the HELLO and its
authentication, one request at a time, RESPONSE and ERROR frames, closing after an error. What
is left to a server is what each frame kind (and each CALL's method) means to it: a replica
answers REQUEST (a follower round) and PRODUCE (a coordinator's append); a coordinator shard
answers CALL ``CommitFile``. A server's session subclasses ``FrameDispatcher`` and keeps only
those handlers, named in its tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from lowtide.errors import InvalidRequest
from lowtide.rpc.framed.codec import decode_call
from lowtide.rpc.steps import Steps

T = TypeVar("T")
# A handler: the session and one frame's payload (a CALL's: its request) in, the RESPONSE payload out, as steps.
Handler = Callable[[Any, bytes], Steps[bytes]]


class FramedSession(Protocol):
    """One connection's requests, as the handler answers them (``open_framed_session``)."""

    def handle_steps(self, kind: int, payload: bytes) -> Steps[bytes]:
        """The RESPONSE payload for one REQUEST, PRODUCE or CALL frame, as steps (rpc/steps.py);
        raises a LowtideError to refuse (a kind the handler does not serve: INVALID_REQUEST)."""

    def cancel(self) -> None:
        """The peer went away (EOF or a broken connection), perhaps with a request in flight:
        release what that request waits for, so it ends now rather than after its long poll."""

    def close(self) -> None:
        """The connection ended."""


class FrameDispatcher:
    """A ``FramedSession`` that answers each frame with the handler its class names for the
    frame's kind: ``FRAMES`` maps a kind to a handler (``handler(session, payload)`` -> the
    RESPONSE payload as steps); ``CALLS`` maps a CALL's method name to the handler of its
    serialized request, for a class that routes CALL frames to ``call_steps``.

    Refusals, as INVALID_REQUEST (the listener sends the ERROR frame and closes): a kind missing
    from ``FRAMES`` (``UNSERVED_KIND``, formatted with ``kind``), a malformed CALL, a CALL of a
    method missing from ``CALLS``. ``cancel`` and ``close`` do nothing unless a subclass has
    something to release.

    Thread-safety: the listener's loop only (one session per connection, one request at a time).
    """

    FRAMES: ClassVar[Mapping[int, Handler]] = {}
    CALLS: ClassVar[Mapping[str, Handler]] = {}
    UNSERVED_KIND: ClassVar[str] = "this framed listener serves no frame of kind {kind}"

    def __init__(self, principal: str, peer: str) -> None:
        self.principal, self.peer = principal, peer

    def handle_steps(self, kind: int, payload: bytes) -> Steps[bytes]:
        handler = self.FRAMES.get(kind)
        if handler is None:
            raise InvalidRequest(self.UNSERVED_KIND.format(kind=kind))
        return (yield from handler(self, payload))

    def call_steps(self, payload: bytes) -> Steps[bytes]:
        """A CALL frame: its method's handler (``CALLS``) on its serialized request."""
        method, request = decode_call(payload)
        handler = self.CALLS.get(method)
        if handler is None:
            raise InvalidRequest(f"{method} is not served on the framed listener; call it over gRPC")
        return (yield from handler(self, request))

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


def parse_request(parse: Callable[[bytes], T], payload: bytes, name: str) -> T:
    """``parse(payload)``; whatever it raises (upb's DecodeError, a WireFormatError) refused as
    the gRPC port would: INVALID_REQUEST "malformed ``name``: ..."."""
    try:
        return parse(payload)
    except Exception as exc:
        raise InvalidRequest(f"malformed {name}: {exc}") from None
