"""The replica's share-partition flags (Kafka's ``group.share.*`` broker settings) and the wiring
of a replica's share-partitions, kept here so the replica's server module only calls them."""

from __future__ import annotations

import argparse

from lowtide.client.replica import ReplicaClient
from lowtide.common.server import add_flag
from lowtide.metadata.group_configs import GroupConfigs
from lowtide.metadata.store import MetadataStore
from lowtide.share.partitions import EARLIEST, LATEST, ShareConfig, SharePartitions
from lowtide.share.persist import DEFAULT_STATE_PARTITIONS, ShareStateLog
from lowtide.share.state import SharePartitionConfig


def add_share_flags(parser: argparse.ArgumentParser) -> None:
    defaults = SharePartitionConfig()
    add_flag(parser, "--group-share-record-lock-duration-ms", type=int, default=defaults.lock_duration_ms,
             help="how long a share group member holds the records it fetched before they are delivered again "
                  "(group.share.record.lock.duration.ms)")
    add_flag(parser, "--group-share-delivery-count-limit", type=int, default=defaults.delivery_count_limit,
             help="deliveries of a record before it is archived (group.share.delivery.count.limit)")
    add_flag(parser, "--group-share-auto-offset-reset", default=LATEST,
             help="where a share group starts on a partition it has no state for: the log start or the high "
                  "watermark (the default of Kafka's share.auto.offset.reset group config)")
    add_flag(parser, "--group-share-max-share-sessions", type=int, default=ShareConfig().max_sessions,
             help="share sessions this replica holds at most; a member opening one more is told "
                  "SHARE_SESSION_LIMIT_REACHED (group.share.max.share.sessions)")
    add_flag(parser, "--share-state-partitions", type=int, default=DEFAULT_STATE_PARTITIONS,
             help="partitions of __share_group_state when this replica creates it "
                  "(share.coordinator.state.topic.num.partitions)")


def build_share_partitions(args: argparse.Namespace, *, store: MetadataStore, replicas: ReplicaClient,
                           name: str) -> SharePartitions:
    """The replica's share-partitions, their state kept in ``__share_group_state``."""
    if args.group_share_record_lock_duration_ms < 1:
        raise SystemExit(f"{name}: --group-share-record-lock-duration-ms must be >= 1")
    if args.group_share_delivery_count_limit < 1:
        raise SystemExit(f"{name}: --group-share-delivery-count-limit must be >= 1")
    if args.group_share_auto_offset_reset not in (EARLIEST, LATEST):
        raise SystemExit(f"{name}: --group-share-auto-offset-reset must be {EARLIEST} or {LATEST}")
    if args.group_share_max_share_sessions < 1:
        raise SystemExit(f"{name}: --group-share-max-share-sessions must be >= 1")
    if args.share_state_partitions < 1:
        raise SystemExit(f"{name}: --share-state-partitions must be >= 1")
    config = ShareConfig(partition=SharePartitionConfig(lock_duration_ms=args.group_share_record_lock_duration_ms,
                                                        delivery_count_limit=args.group_share_delivery_count_limit),
                         auto_offset_reset=args.group_share_auto_offset_reset,
                         max_sessions=args.group_share_max_share_sessions)
    return SharePartitions(config=config, state_log=ShareStateLog(store=store, replicas=replicas,
                                                                  partitions=args.share_state_partitions),
                           group_configs=GroupConfigs(store).of)
