"""``ScannerClient``: the client of ``lowtide.v1.OrphanScanner`` (the CLI's ``orphans scan``, tests).

Reports come back as ``ScanResult`` dataclasses (plain data, same fields as the proto's
``ScanReport``); a whole-call failure raises the ``LowtideError`` it carried.

Thread-safety: the client may be shared by threads (one channel; gRPC stubs are thread-safe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lowtide.rpc.channels import ChannelPool, call, validate_address
from lowtide_pb import scanner_pb2, scanner_pb2_grpc

# A scan of a large store takes a while; a CLI waiting for one should not give up first.
DEFAULT_SCAN_TIMEOUT_S = 3600.0
# Where a running orphan scanner registers itself (lowtide/scanner/server.py): the section of the
# cluster metadata (lowtide.metadata.sections) holding one record per scanner, its name ->
# {"grpc": HOST:PORT, "metrics": URL, "since_ms"}; a front door forwards calls to it
# (lowtide/frontdoor/scanner_proxy.py).
SCANNER_REGISTRY = "scanners"
SCANNER_SERVICE = scanner_pb2.DESCRIPTOR.services_by_name["OrphanScanner"].full_name
SCANNER_METHODS = tuple(m.name for m in scanner_pb2.DESCRIPTOR.services_by_name["OrphanScanner"].methods)


@dataclass(frozen=True)
class ScanResult:
    """One scan's report (see protos/lowtide/v1/scanner.proto ``ScanReport`` for each field)."""

    dry_run: bool = False
    threshold_ms: int = 0
    listed: int = 0
    skipped: int = 0
    candidates: int = 0
    known: int = 0
    orphans: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    orphan_keys: tuple[str, ...] = ()
    deleted_keys: tuple[str, ...] = ()
    failure: str = ""
    failure_detail: str = ""
    duration_seconds: float = 0.0
    started_at_ms: int = 0
    shards: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failure

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["orphan_keys"], doc["deleted_keys"], doc["shards"] = (list(self.orphan_keys), list(self.deleted_keys),
                                                                  list(self.shards))
        return doc


@dataclass(frozen=True)
class ScannerStatus:
    running: bool
    current: ScanResult | None
    last: ScanResult | None
    grace_period_ms: int = 0
    scan_interval_ms: int = 0
    prefix: str = ""


def _result(msg: scanner_pb2.ScanReport) -> ScanResult:
    return ScanResult(
        dry_run=msg.dry_run, threshold_ms=msg.threshold_ms, listed=msg.listed, skipped=msg.skipped,
        candidates=msg.candidates, known=msg.known, orphans=msg.orphans, deleted=msg.deleted,
        deleted_bytes=msg.deleted_bytes, orphan_keys=tuple(msg.orphan_keys), deleted_keys=tuple(msg.deleted_keys),
        failure=msg.failure, failure_detail=msg.failure_detail, duration_seconds=msg.duration_seconds,
        started_at_ms=msg.started_at_ms, shards=tuple(msg.shards))


class ScannerClient:
    """Calls one orphan scanner (or a front door that forwards to it) at ``address``."""

    def __init__(self, address: str, *, metadata: Sequence[tuple[str, str]] = (),
                 channels: ChannelPool | None = None) -> None:
        self.address = validate_address(address)
        self.metadata = list(metadata)
        self._own_channels = channels is None
        self.channels = channels or ChannelPool()

    def _stub(self) -> scanner_pb2_grpc.OrphanScannerStub:
        return self.channels.stub(self.address, scanner_pb2_grpc.OrphanScannerStub)

    def scan_now(self, *, dry_run: bool = False, timeout_s: float = DEFAULT_SCAN_TIMEOUT_S) -> ScanResult:
        reply = call(self._stub().ScanNow, scanner_pb2.ScanNowRequest(dry_run=dry_run), metadata=self.metadata,
                     timeout=timeout_s)
        return _result(reply.report)

    def status(self, *, timeout_s: float = 10.0) -> ScannerStatus:
        reply = call(self._stub().Status, scanner_pb2.ScanStatusRequest(), metadata=self.metadata,
                     timeout=timeout_s)
        return ScannerStatus(running=reply.running,
                             current=_result(reply.current) if reply.HasField("current") else None,
                             last=_result(reply.last) if reply.HasField("last") else None,
                             grace_period_ms=reply.grace_period_ms, scan_interval_ms=reply.scan_interval_ms,
                             prefix=reply.prefix)

    def close(self) -> None:
        if self._own_channels:
            self.channels.close()
