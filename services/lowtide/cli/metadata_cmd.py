"""`lowtide metadata migrate --from-redis URL --metadata-url etcd://...`: move a cluster's metadata
from the Redis where releases before etcd kept it into the etcd store (docs/design/metadata.md).

Copies the cluster id, topics, partitions (with their leaders, epochs and ISRs), broker
registrations and dynamic broker configs, and raises the producer-id counter above the last id the
old Redis handed out (an id given twice would break two idempotent producers). Idempotent: keys
already in etcd are kept, so it can be run again after an interruption, and by the chart's upgrade
hook on every upgrade. Refuses an etcd
that holds another cluster. ``--dry-run`` reads and reports without writing.

json output: ``{"cluster_id", "dry_run", "read": {...counts}, "written": {...counts}}``.
"""

from __future__ import annotations

import argparse

from lowtide.cli.main import add_output_flag
from lowtide.cli.output import emit, progress
from lowtide.frontdoor.transactions.producer_ids import raise_floor
from lowtide.metadata.legacy_redis import read_legacy_metadata
from lowtide.metadata.store import MetadataStore, import_cluster


def register(subparsers: argparse._SubParsersAction) -> None:
    metadata = subparsers.add_parser("metadata", help="the cluster metadata store (etcd)")
    sub = metadata.add_subparsers(dest="metadata_command", required=True)
    migrate = sub.add_parser("migrate", help="copy the cluster metadata from Redis (releases before etcd) to etcd")
    migrate.add_argument("--from-redis", required=True, metavar="URL", help="the old Redis, e.g. redis://host:6379/0")
    migrate.add_argument("--metadata-url", required=True, metavar="URL",
                         help="the etcd store: etcd://HOST:PORT[,HOST:PORT...]")
    migrate.add_argument("--dry-run", action="store_true", help="read and report, write nothing")
    add_output_flag(migrate)
    migrate.set_defaults(func=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    progress(args, f"reading the cluster metadata from {args.from_redis}...")
    legacy = read_legacy_metadata(args.from_redis)
    read = {"topics": len(legacy.topics), "partitions": len(legacy.states), "brokers": len(legacy.brokers),
            "broker_configs": len(legacy.broker_configs), "last_producer_id": legacy.last_producer_id}
    result = {"cluster_id": legacy.cluster_id, "dry_run": bool(args.dry_run), "read": read, "written": {}}
    if legacy.cluster_id is None:
        result["message"] = "the Redis holds no lowtide cluster (no lowtide:cluster_id): nothing to migrate"
    elif not args.dry_run:
        progress(args, f"writing {read['topics']} topics and {read['partitions']} partitions to {args.metadata_url}...")
        store = MetadataStore.from_url(args.metadata_url)
        try:
            store.start(timeout_s=30)
            result["written"] = import_cluster(store, cluster_id=legacy.cluster_id, topics=legacy.topics,
                                               states=legacy.states, brokers=legacy.brokers,
                                               broker_configs=legacy.broker_configs)
            # Ids the old Redis handed out are never handed out again.
            result["written"]["producer_id_floor"] = int(raise_floor(store, legacy.last_producer_id + 1))
        finally:
            store.close()
    emit(args, result, text=_text(result))
    return 0


def _text(result: dict) -> str:
    if result.get("message"):
        return result["message"]
    read, written = result["read"], result["written"]
    verb = "would copy" if result["dry_run"] else "copied"
    counts = written if not result["dry_run"] else read
    return (f"cluster {result['cluster_id']}: {verb} " + ", ".join(f"{n} {k}" for k, n in counts.items())
            + (f" (read {', '.join(f'{n} {k}' for k, n in read.items())})" if not result["dry_run"] else ""))
