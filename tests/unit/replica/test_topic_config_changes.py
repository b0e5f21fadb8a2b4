"""A replica adopts a topic's changed config (AlterConfigs) on its next reconcile pass, without
reopening the log: the log's retention and cleanup policy and the partition's topic record change,
and the callback that wakes the cleaner is told which partitions changed. Real etcd, real logs."""

from __future__ import annotations

import dataclasses

from lowtide.log.filenames import is_stray_partition_dir
from lowtide.log.partition_log import LogConfig, PartitionLog
from lowtide.metadata.model import TopicInfo
from lowtide.record import BatchBuilder
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.reconcile import PartitionReconciler, ReconcileTrigger
from lowtide.replica.registry import PartitionRegistry


def reconciler(store, tmp_path, changed: list, *, log_defaults=None,
               saved: dict | None = None) -> tuple[PartitionReconciler, PartitionRegistry]:
    registry = PartitionRegistry(broker_id=0)
    r = PartitionReconciler(
        config=ReplicaConfig(broker_id=0, data_dir=tmp_path, log_defaults=dict(log_defaults or {})), store=store,
        registry=registry, trigger=ReconcileTrigger(), saved_log_start_offsets=dict(saved or {}),
        saved_high_watermarks=dict(saved or {}),
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
    key = store._k("topics", "orders")  # the topic's record, written straight into etcd
    raw = TopicInfo.from_json(store.client.get(key).value)
    store.client.put(key, dataclasses.replace(raw, config={"retention.ms": "soon"}).to_json().encode())
    assert store.sync() and store.topic("orders").config == {"retention.ms": "soon"}
    r.reconcile()
    assert registry.get("orders", 0).log.config.retention_ms == 5 and changed == []


def test_a_checkpoint_read_at_start_counts_only_for_a_log_on_disk_and_only_once(store, tmp_path):
    # Start-up read checkpoints naming orders-0 (LSO and HW 10) and orders-1 (4); only orders-1
    # has a directory (a log kept over the restart, of 7 records, whose own LSO file says 0).
    # Broker 0 leads orders-0 and follows orders-1 (a follower keeps the HW it recovered with).
    store.create_topic(name="orders", partitions=2, replication_factor=2, config={}, assignment=[[0, 1], [1, 0]])
    kept = PartitionLog.open(tmp_path / "orders-1", topic="orders", partition=1, config=LogConfig())
    builder = BatchBuilder()
    for _ in range(7):
        builder.append(timestamp_ms=1_700_000_000_000, key=None, value=b"v")
    kept.append_as_leader(bytearray(builder.build()), leader_epoch=0)
    kept.close()
    r, registry = reconciler(store, tmp_path, [], saved={("orders", 0): 10, ("orders", 1): 4})
    r.reconcile()
    new = registry.get("orders", 0).log
    assert (new.log_start_offset, new.log_end_offset, new.high_watermark) == (0, 0, 0)  # created since: at 0
    kept = registry.get("orders", 1).log
    assert (kept.log_end_offset, kept.high_watermark) == (7, 4)  # recovered, with its checkpointed HW
    # Deleted and created again under the same name: a new log again, not the checkpointed one.
    store.delete_topic("orders")
    r.reconcile()
    store.create_topic(name="orders", partitions=2, replication_factor=1, config={}, assignment=[[0], [0]])
    r.reconcile()
    assert [registry.get("orders", p).log.log_end_offset for p in (0, 1)] == [0, 0]


def test_a_reconcile_pass_finishes_interrupted_deletes_and_sets_logs_the_metadata_does_not_name_aside(store,
                                                                                                    tmp_path):
    store.create_topic(name="orders", partitions=1, replication_factor=1, config={}, assignment=[[0]])
    interrupted = tmp_path / "gone-0.0123456789abcdef0123456789abcdef-delete"
    (interrupted / "x").mkdir(parents=True)
    unassigned = tmp_path / "old-2"
    unassigned.mkdir()
    (unassigned / "00000000000000000000.log").write_bytes(b"")
    r, registry = reconciler(store, tmp_path, [])
    r.reconcile()
    dirs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    # The metadata's silence never deletes a log: old-2 is kept, renamed aside, and not served.
    assert len(dirs) == 2 and dirs[1] == "orders-0"
    assert dirs[0].startswith("old-2.") and is_stray_partition_dir(dirs[0])
    assert (tmp_path / dirs[0] / "00000000000000000000.log").exists()
    assert registry.get("orders", 0) is not None and registry.find("old", 2) is None


def test_the_logs_of_a_topic_deleted_through_the_api_are_deleted_not_set_aside(store, tmp_path):
    store.create_topic(name="gone", partitions=2, replication_factor=1, config={}, assignment=[[0], [0]])
    r, registry = reconciler(store, tmp_path, [])
    r.reconcile()
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["gone-0", "gone-1"]
    store.delete_topic("gone")  # records the topic's id as deleted
    r.reconcile()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []
    assert registry.find("gone", 0) is None


def test_many_new_partitions_are_created_in_bulk_with_one_filesystem_sync_and_stale_checkpoints_ignored(
        store, tmp_path, monkeypatch):
    import traceback

    from lowtide.log import checkpoint
    from lowtide.log.filenames import CREATING_DIR
    from lowtide.replica import reconcile

    syncs, fsyncs = [], []
    monkeypatch.setattr(reconcile, "sync_filesystem", lambda path: syncs.append(path))
    real_fsync = checkpoint.os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync",
                        lambda fd: fsyncs.append([f.name for f in traceback.extract_stack()]) or real_fsync(fd))
    n = reconcile.BULK_CREATE_MIN
    store.create_topic(name="wide", partitions=n, replication_factor=1, config={}, assignment=[[0]] * n)
    # A crash left a bulk creation's staging behind; a start-up checkpoint names wide-3 (an earlier topic's).
    (tmp_path / CREATING_DIR / "wide-0").mkdir(parents=True)
    r, registry = reconciler(store, tmp_path, [], saved={("wide", 3): 40})
    r.reconcile()
    assert syncs == [tmp_path / CREATING_DIR], "one filesystem sync for the batch"
    # ... and one fsync, of the data directory after the renames; becoming leader writes each
    # partition's leader-epoch file as before.
    assert len([f for f in fsyncs if "assign_leader_epoch" not in f]) == 1
    assert not (tmp_path / CREATING_DIR).exists()
    logs = [registry.get("wide", p).log for p in range(n)]
    assert {(log.log_start_offset, log.log_end_offset) for log in logs} == {(0, 0)}
    builder = BatchBuilder()
    builder.append(timestamp_ms=1, key=None, value=b"v")
    logs[3].append_as_leader(bytearray(builder.build()), leader_epoch=0)
    assert logs[3].log_end_offset == 1
    assert (tmp_path / "wide-5" / "partition.metadata").read_text().endswith(
        f"topic_id: {store.topic('wide').topic_id}\n")
