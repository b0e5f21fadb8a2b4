"""A replica adopts a topic's changed config (AlterConfigs) on its next reconcile pass, without
reopening the log: the log's retention and cleanup policy and the partition's topic record change,
and the callback that wakes the cleaner is told which partitions changed. Real Redis, real logs."""

from __future__ import annotations

import dataclasses

from lowtide.log.partition_log import LogConfig
from lowtide.metadata.model import TopicInfo
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.reconcile import PartitionReconciler, ReconcileTrigger
from lowtide.replica.registry import PartitionRegistry


def reconciler(store, tmp_path, changed: list, *, log_defaults=None) -> tuple[PartitionReconciler, PartitionRegistry]:
    registry = PartitionRegistry(broker_id=0)
    r = PartitionReconciler(
        config=ReplicaConfig(broker_id=0, data_dir=tmp_path, log_defaults=dict(log_defaults or {})), store=store,
        registry=registry, trigger=ReconcileTrigger(), saved_log_start_offsets={}, saved_high_watermarks={},
        complete_waiting_deletes=lambda keys: None, on_reconciled=lambda: None,
        on_config_changed=lambda parts: changed.append(sorted(p.key for p in parts)))
    return r, registry


def set_config(store, name: str, config: dict[str, str]) -> None:
    store.update_topic_config(name, lambda topic: config)


def test_a_changed_topic_config_reaches_the_open_log(store, tmp_path):
    store.create_topic(name="orders", partitions=2, replication_factor=1, config={"retention.ms": "600000"},
                       assignment=[[0], [0]])
    changed: list = []
    r, registry = reconciler(store, tmp_path, changed)
    r.reconcile()
    p = registry.get("orders", 0)
    log_before = p.log
    assert p.log.config.retention_ms == 600000 and p.log.config.cleanup_policy == "delete"

    set_config(store, "orders", {"retention.ms": "5", "cleanup.policy": "compact,delete", "delete.retention.ms": "7"})
    r.reconcile()
    for partition in (0, 1):
        p = registry.get("orders", partition)
        assert (p.log.config.retention_ms, p.log.config.cleanup_policy, p.log.config.delete_retention_ms) == (
            5, "compact,delete", 7)
        assert p.topic_info.config["retention.ms"] == "5" and p.topic_info.cleanup_policy == {"compact", "delete"}
    assert registry.get("orders", 0).log is log_before  # adopted in place, not reopened
    assert changed == [[("orders", 0), ("orders", 1)]]


def test_a_removed_key_falls_back_to_the_broker_default_then_the_log_default(store, tmp_path):
    store.create_topic(name="orders", partitions=1, replication_factor=1,
                       config={"retention.ms": "5", "segment.bytes": "4096"}, assignment=[[0]])
    changed: list = []
    r, registry = reconciler(store, tmp_path, changed, log_defaults={"retention.ms": "1234"})
    r.reconcile()
    set_config(store, "orders", {})
    r.reconcile()
    config = registry.get("orders", 0).log.config
    assert config.retention_ms == 1234 and config.segment_bytes == LogConfig().segment_bytes


def test_an_unchanged_config_reports_nothing(store, tmp_path):
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    changed: list = []
    r, _ = reconciler(store, tmp_path, changed)
    r.reconcile()
    r.reconcile()
    assert changed == []


def test_a_config_the_replica_cannot_apply_keeps_the_old_settings(store, tmp_path):
    # The front door validates every change; a record written some other way must not take a
    # running partition's retention away.
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={"retention.ms": "5"},
                       assignment=[[0]])
    changed: list = []
    r, registry = reconciler(store, tmp_path, changed)
    r.reconcile()
    raw = TopicInfo.from_json(store.redis.hget("lowtide:topics", "orders"))
    store.redis.hset("lowtide:topics", "orders",
                     dataclasses.replace(raw, config={"retention.ms": "soon"}).to_json())
    r.reconcile()
    assert registry.get("orders", 0).log.config.retention_ms == 5 and changed == []
