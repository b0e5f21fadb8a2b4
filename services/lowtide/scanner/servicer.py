"""gRPC servicer of ``lowtide.v1.OrphanScanner``: check CLUSTER_ACTION (when auth is on), call the
scanner service, pack its report. Thread-safety: stateless apart from the (thread-safe) service."""

from __future__ import annotations

from lowtide.auth.access import AccessControl
from lowtide.auth.acl import AclOperation
from lowtide.scanner.scan import ScanReport
from lowtide.scanner.service import ScannerService
from lowtide_pb import scanner_pb2 as pb
from lowtide_pb import scanner_pb2_grpc


def pack_report(report: ScanReport, *, started_at_ms: int, shards: tuple[str, ...]) -> pb.ScanReport:
    return pb.ScanReport(
        dry_run=report.dry_run, threshold_ms=report.threshold_ms, listed=report.listed, skipped=report.skipped,
        candidates=report.candidates, known=report.known, orphans=report.orphans, deleted=report.deleted_count,
        deleted_bytes=report.deleted_bytes, orphan_keys=report.orphan_keys, deleted_keys=report.deleted,
        failure=report.failure or "", failure_detail=report.failure_detail, duration_seconds=report.duration_s,
        started_at_ms=started_at_ms, shards=list(shards))


class ScannerServicer(scanner_pb2_grpc.OrphanScannerServicer):
    """ScanNow and Status of one scanner process."""

    def __init__(self, service: ScannerService, *, access: AccessControl) -> None:
        self.service = service
        self.access = access

    def _authorize(self, context) -> None:
        principal = self.access.authenticate_call(context)
        self.access.require_cluster(principal, AclOperation.CLUSTER_ACTION)

    def ScanNow(self, request, context):
        self._authorize(context)
        report, started_ms, shards = self.service.scan(dry_run=request.dry_run)
        return pb.ScanNowResponse(report=pack_report(report, started_at_ms=started_ms, shards=shards))

    def Status(self, request, context):
        self._authorize(context)
        state = self.service.state()
        config = self.service.config
        reply = pb.ScanStatusResponse(running=state.running, grace_period_ms=config.scan.grace_period_ms,
                                      scan_interval_ms=config.scan_interval_ms, prefix=config.scan.prefix)
        if state.current is not None:
            reply.current.CopyFrom(pack_report(state.current, started_at_ms=state.started_at_ms, shards=state.shards))
        if state.last is not None:
            reply.last.CopyFrom(pack_report(state.last, started_at_ms=state.last_started_at_ms,
                                            shards=state.last_shards))
        return reply
