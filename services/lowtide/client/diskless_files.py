"""DescribeFiles on one diskless coordinator shard: the one coordinator call the orphan scanner makes.

Kept apart from any broker-side coordinator client: the scanner needs nothing else of the
coordinator API, and callers outside ``rpc``/``client`` and the servicers may not touch generated
protobuf code. Errors: a whole-call failure raises the ``LowtideError`` it carried (an unreachable
shard is NETWORK_EXCEPTION, a passed deadline REQUEST_TIMED_OUT, a process that lost the shard's
lease NOT_COORDINATOR); a per-file error comes back in ``FileDescriptions.errors``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lowtide.errors import LowtideError, UnknownServerError, error_or_none
from lowtide.rpc.channels import ChannelPool, call
from lowtide_pb import coordinator_pb2, coordinator_pb2_grpc


@dataclass(frozen=True)
class FileDescriptions:
    """One shard's answer: which of the asked keys it knows (any row or a pending commit), the
    creation time of the oldest file it has a row for (None: no file), and per-key errors."""

    known: frozenset[str]
    oldest_file_created_ms: int | None
    errors: dict[str, LowtideError] = field(default_factory=dict)


def describe_files(channels: ChannelPool, address: str, keys: Sequence[str], *,
                   metadata: Sequence[tuple[str, str]] = (), timeout_s: float = 10.0) -> FileDescriptions:
    """Ask the shard served at ``address`` about ``keys`` (may be empty: then only the oldest file)."""
    stub = channels.stub(address, coordinator_pb2_grpc.DisklessCoordinatorStub)
    reply = call(stub.DescribeFiles, coordinator_pb2.DisklessDescribeFilesRequest(
        files=[coordinator_pb2.DisklessDescribeFileEntry(object_key=k) for k in keys],
        timeout_ms=int(timeout_s * 1000)), metadata=metadata, timeout=timeout_s)
    known, errors = set(), {}
    for result in reply.files:
        error = error_or_none(result.error_code, result.error_message)
        if error is not None:
            errors[result.object_key] = error
        elif result.known:
            known.add(result.object_key)
    answered = {r.object_key for r in reply.files}
    for key in keys:
        if key not in answered:
            errors[key] = UnknownServerError(f"the shard did not answer for {key}")
    oldest = reply.oldest_file_created_at_ms
    return FileDescriptions(known=frozenset(known), oldest_file_created_ms=None if oldest < 0 else oldest,
                            errors=errors)
