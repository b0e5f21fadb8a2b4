"""Prometheus metrics of the orphan scanner (names are a contract: the Diskless dashboard and the
LowtideOrphanScansFailing alert read them)::

    lowtide_orphan_scan_duration_seconds         gauge    the last finished scan
    lowtide_orphan_scan_candidates               gauge    objects older than the last scan's threshold
    lowtide_orphan_scan_threshold_seconds        gauge    the last scan's threshold (epoch s)
    lowtide_orphan_scans_total{result}           counter  success | error (dry runs included)
    lowtide_orphan_scan_failures_total{reason}   counter  shard_unavailable | shard_error | not_coordinator |
                                                          shards_missing | registry_unavailable | list_failed |
                                                          delete_failed
    lowtide_orphan_files_deleted_total           counter
    lowtide_orphan_reclaimed_bytes_total         counter  bytes of the deleted orphans
    lowtide_orphan_scan_last_success_timestamp_seconds  gauge
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SCAN_DURATION = Gauge("lowtide_orphan_scan_duration_seconds", "Duration of the last finished orphan scan")
CANDIDATES = Gauge("lowtide_orphan_scan_candidates", "Objects older than the last orphan scan's threshold")
THRESHOLD = Gauge("lowtide_orphan_scan_threshold_seconds", "The last orphan scan's age threshold (epoch seconds)")
SCANS = Counter("lowtide_orphan_scans", "Orphan scans finished, by result", ["result"])
FAILURES = Counter("lowtide_orphan_scan_failures", "Orphan scans stopped early (deleting nothing more), by reason",
                   ["reason"])
DELETED = Counter("lowtide_orphan_files_deleted", "Orphan WAL files deleted")
RECLAIMED = Counter("lowtide_orphan_reclaimed_bytes", "Bytes of orphan WAL files deleted")
LAST_SUCCESS = Gauge("lowtide_orphan_scan_last_success_timestamp_seconds", "When the last orphan scan succeeded")

for _result in ("success", "error"):
    SCANS.labels(result=_result)  # both series exist from the start, so rate()/increase() see the first error
