"""Time and size retention of diskless partitions, run by their coordinator shard (KIP-1164).

A diskless partition has no log on any broker, so Kafka's per-segment retention pass becomes a pass
over the shard's ``batches`` table: every ``interval_ms`` the leading shard computes, per partition
of a topic with ``cleanup.policy`` delete, the new log start offset

* time:  the base offset of the first batch (in offset order) whose max timestamp is at least
         now - ``retention.ms`` (every batch expired: the high watermark), so deletion stops at
         the first batch still inside the window, as Kafka stops at the first unexpired segment;
* size:  the offset after the newest batch that no longer fits when the batches are summed from
         the newest down while the sum stays within ``retention.bytes``;

and, where that moves the LSO, issues its own DeleteRecords through the shard's normal pipeline
(a RecordsDeleted record in the metadata log, so a restarted or new leader agrees; the file
lifetime rules then free the WAL files). Settings come from the topic's config in the cluster
metadata (Kafka's defaults: 7 days, no size limit; -1 = no limit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lowtide.clock import Clock, now_ms
from lowtide.messages.coordinator import DeleteRecordsPartition, DeleteRecordsRequest, DeleteRecordsTopic

log = logging.getLogger(__name__)
DEFAULT_RETENTION_MS = 7 * 24 * 3600 * 1000

_PARTITIONS = "SELECT partition_key, topic_id, topic_name, partition_index, log_start_offset, high_watermark " \
              "FROM partitions"
_FIRST_KEPT_BY_TIME = "SELECT MIN(base_offset) FROM batches WHERE partition_key = ? AND batch_max_timestamp >= ?"
_LAST_DROPPED_BY_SIZE = """
SELECT last_offset FROM (
  SELECT last_offset, SUM(byte_size) OVER (ORDER BY base_offset DESC) AS newer_bytes
  FROM batches WHERE partition_key = ?)
WHERE newer_bytes > ? ORDER BY last_offset DESC LIMIT 1
"""


def retention_targets(db: Any, configs: Mapping[str, Mapping[str, str]], *, now: int) -> dict[tuple[bytes, int], int]:
    """(topic id, partition) -> the offset retention deletes below, where above the current LSO."""
    out: dict[tuple[bytes, int], int] = {}
    for key, topic_id, name, index, lso, hw in db.execute(_PARTITIONS).fetchall():
        config = configs.get(name)
        if config is None or "delete" not in config.get("cleanup.policy", "delete"):
            continue
        target = lso
        retention_ms = int(config.get("retention.ms", DEFAULT_RETENTION_MS))
        if retention_ms >= 0:
            (first_kept,) = db.execute(_FIRST_KEPT_BY_TIME, (key, now - retention_ms)).fetchone()
            target = max(target, hw if first_kept is None else first_kept)
        retention_bytes = int(config.get("retention.bytes", -1))
        if retention_bytes >= 0:
            row = db.execute(_LAST_DROPPED_BY_SIZE, (key, retention_bytes)).fetchone()
            if row is not None:
                target = max(target, row[0] + 1)
        if target > lso:
            out[(bytes(topic_id), index)] = min(target, hw)
    return out


class RetentionPass:
    """Runs retention every ``interval_ms`` on a leading shard (called from its shard thread).

    ``topic_configs()`` gives topic name -> config (read from the cluster metadata each pass).
    Thread-safety: one thread (the shard loop) calls ``run_due``.
    """

    def __init__(self, *, topic_configs: Callable[[], Mapping[str, Mapping[str, str]]], interval_ms: int,
                 clock: Clock = now_ms) -> None:
        self.topic_configs = topic_configs
        self.interval_s = interval_ms / 1000
        self.clock = clock
        self._last = 0.0
        self.deleted_passes = 0

    def run_due(self, shard: Any) -> None:
        if self.interval_s <= 0 or time.monotonic() - self._last < self.interval_s:
            return
        self._last = time.monotonic()
        configs = self.topic_configs()
        targets = shard.read(lambda core: retention_targets(core.state.db, configs, now=self.clock()))
        if not targets:
            return
        by_topic: dict[bytes, list[DeleteRecordsPartition]] = {}
        for (topic_id, index), offset in targets.items():
            by_topic.setdefault(topic_id, []).append(DeleteRecordsPartition(partition_index=index, offset=offset))
        request = DeleteRecordsRequest(topics=[DeleteRecordsTopic(topic_id=t, partitions=ps)
                                               for t, ps in by_topic.items()])
        shard.mutate(lambda core: core.delete_records(request))
        self.deleted_passes += 1
        log.info("retention deleted records", extra={"fields": {"partitions": len(targets)}})
