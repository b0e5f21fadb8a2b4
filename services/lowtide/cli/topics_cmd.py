"""`lowtide topics create|describe|list|alter|delete`: topic admin, shaped like kafka-topics.sh
(alter: like kafka-configs.sh --alter --entity-type topics, and kafka-topics.sh --alter
--partitions).

JSON output: create -> {"topic", "partitions", "replication_factor"}; describe -> {"topics": [{name,
partitions: [{partition, leader, leader_epoch, replicas, isr, adding_replicas, removing_replicas}],
config, replication_factor, diskless}]} (adding/removing: a reassignment in progress, lowtide
reassign); list -> {"topics": [names]}; alter -> {"topic", "config": {k: v}, "validate_only"} (the
config after the change), or with only --partitions {"topic", "partitions", "validate_only"};
delete -> {"topic", "deleted": true}.
"""

from __future__ import annotations

import argparse

from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import CliError, emit
from lowtide.client import Admin
from lowtide.client.admin import OngoingReassignment
from lowtide.client.metadata import TopicMetadata
from lowtide.errors import ClusterAuthorizationFailed, TopicAlreadyExists


def register(subparsers: argparse._SubParsersAction) -> None:
    topics = subparsers.add_parser("topics", help="create, describe, list, alter and delete topics")
    actions = topics.add_subparsers(dest="topics_action", required=True)

    create = add_cluster_command(actions, "create", help="create a topic", func=run_create)
    create.add_argument("--topic", required=True)
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--replication-factor", type=int, default=0,
                        help="replicas per partition (default: min(3, live replicas))")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="topic config (repeatable), e.g. retention.ms=600000 or cleanup.policy=compact; "
                             "unknown keys and bad values fail with INVALID_CONFIG")
    create.add_argument("--diskless", action="store_true",
                        help="keep the data in object storage (KIP-1164; not implemented yet: the front "
                             "door refuses it with INVALID_CONFIG)")
    create.add_argument("--if-not-exists", action="store_true", help="succeed if the topic already exists")

    describe = add_cluster_command(actions, "describe", func=run_describe,
                                   help="partitions, leaders, replicas and ISR of topics")
    describe.add_argument("--topic", action="append", default=[], help="topic (repeatable; default all)")

    listing = add_cluster_command(actions, "list", help="list topic names", func=run_list)
    listing.add_argument("--include-internal", action="store_true", help="also list __* topics")

    alter = add_cluster_command(actions, "alter", func=run_alter,
                                help="change a topic's config (takes effect on the running replicas)")
    alter.add_argument("--topic", required=True)
    alter.add_argument("--add-config", action="append", default=[], metavar="KEY=VALUE",
                       help="set a topic config (repeatable), e.g. retention.ms=600000 or "
                            "cleanup.policy=compact,delete; unknown keys and bad values fail with INVALID_CONFIG "
                            "and change nothing")
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                       help="return a config to its default (repeatable, or comma-separated)")
    alter.add_argument("--append-config", action="append", default=[], metavar="KEY=VALUE",
                       help="add items to a list config (repeatable), e.g. cleanup.policy=compact")
    alter.add_argument("--subtract-config", action="append", default=[], metavar="KEY=VALUE",
                       help="remove items from a list config (repeatable), e.g. cleanup.policy=delete")
    alter.add_argument("--partitions", type=int, default=None, metavar="N",
                       help="grow the topic to N partitions (never fewer; keyed records may then map elsewhere)")
    alter.add_argument("--replica-assignment", default=None, metavar="B:B:B,B:B:B",
                       help="with --partitions: the new partitions' replicas, as kafka-topics takes them "
                            "(partitions by ',', brokers by ':', the first the preferred leader)")
    alter.add_argument("--validate-only", action="store_true", help="check the change, change nothing")

    elect = add_cluster_command(actions, "elect-leaders", func=run_elect_leaders,
                                help="move leaders to the preferred replicas (kafka-leader-election)")
    elect.add_argument("--election-type", choices=("preferred", "unclean"), default="preferred",
                       help="preferred: the first replica leads again; unclean (kept clean): elect where no "
                            "leader is live")
    elect.add_argument("--topic", default=None, help="only this topic (default: every partition of every topic)")
    elect.add_argument("--partition", type=int, default=None, help="with --topic: only this partition")

    delete = add_cluster_command(actions, "delete", help="delete a topic", func=run_delete)
    delete.add_argument("--topic", required=True)


def parse_config_pairs(pairs: list[str], *, flag: str = "--config") -> dict[str, str]:
    """``["k=v", ...]`` -> dict; a pair without '=', with an empty key, or a key given twice (which
    value would win is a guess) is INVALID_CONFIG."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError("INVALID_CONFIG", f"{flag} expects KEY=VALUE, got {pair!r}")
        if key in out:
            raise CliError("INVALID_CONFIG", f"topic config '{key}' is given more than once")
        out[key] = value.strip()
    return out


def parse_replica_assignment(text: str | None) -> list[list[int]]:
    """kafka-topics' ``--replica-assignment``: ``"0:1:2,1:2:0"`` -> [[0, 1, 2], [1, 2, 0]]."""
    if not text:
        return []
    try:
        return [[int(b) for b in part.split(":")] for part in text.split(",")]
    except ValueError:
        raise CliError("INVALID_REPLICA_ASSIGNMENT", f"--replica-assignment must look like 0:1:2,1:2:0, "
                                                     f"got {text!r}") from None


Moves = dict[tuple[str, int], OngoingReassignment]


def render_topic(meta: TopicMetadata, moves: Moves | None = None) -> str:
    configs = ",".join(f"{k}={v}" for k, v in sorted(meta.config.items()))
    lines = [f"Topic: {meta.name}\tTopicId: {meta.topic_id}\tPartitionCount: {len(meta.partitions)}\t"
             f"ReplicationFactor: {meta.replication_factor}\tDiskless: {str(meta.diskless).lower()}\t"
             f"Configs: {configs}"]
    for p in meta.partitions:
        lines.append(f"\tTopic: {meta.name}\tPartition: {p.partition}\tLeader: {p.leader}\t"
                     f"LeaderEpoch: {p.leader_epoch}\tReplicas: {','.join(map(str, p.replicas))}\t"
                     f"Isr: {','.join(map(str, p.isr))}")
        move = (moves or {}).get((meta.name, p.partition))
        # As kafka-topics --describe: shown only while the partition moves.
        if move is not None and move.adding:
            lines[-1] += f"\tAdding Replicas: {','.join(map(str, move.adding))}"
        if move is not None and move.removing:
            lines[-1] += f"\tRemoving Replicas: {','.join(map(str, move.removing))}"
    return "\n".join(lines)


def read_moves(admin: Admin, topics: list[TopicMetadata]) -> Moves:
    """The reassignments in progress among ``topics``' partitions. Listing them needs DESCRIBE on
    the CLUSTER (Kafka's rule): a caller allowed only the topics sees no moves rather than no topics."""
    asked = [(t.name, p.partition) for t in topics if t.error is None for p in t.partitions]
    try:
        return {(o.topic, o.partition): o for o in admin.list_partition_reassignments(asked)}
    except ClusterAuthorizationFailed:
        return {}


def topic_doc(meta: TopicMetadata, moves: Moves) -> dict:
    doc = meta.as_dict()
    for p in doc["partitions"]:
        move = moves.get((meta.name, p["partition"]))
        p["adding_replicas"] = list(move.adding) if move else []
        p["removing_replicas"] = list(move.removing) if move else []
    return doc


def run_create(args: argparse.Namespace) -> int:
    config = parse_config_pairs(args.config)
    with build_admin(args) as admin:
        try:
            admin.create_topic(args.topic, partitions=args.partitions, replication_factor=args.replication_factor,
                               config=config, diskless=args.diskless)
        except TopicAlreadyExists:
            if not args.if_not_exists:
                raise
        meta = admin.describe_cluster([args.topic]).topic(args.topic)
    emit(args, {"topic": args.topic, "partitions": len(meta.partitions),
                "replication_factor": meta.replication_factor},
         f"Created topic {args.topic} ({len(meta.partitions)} partitions, replication factor "
         f"{meta.replication_factor}).")
    return 0


def run_describe(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        snapshot = admin.describe_cluster(args.topic)
        topics = [snapshot.topic(name) for name in (args.topic or sorted(snapshot.topics))]
        moves = read_moves(admin, topics)
    emit(args, {"topics": [topic_doc(t, moves) for t in topics]}, "\n".join(render_topic(t, moves) for t in topics))
    return 0


def run_list(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        names = admin.list_topics(include_internal=args.include_internal)
    emit(args, {"topics": names}, "\n".join(names))
    return 0


def run_alter(args: argparse.Namespace) -> int:
    set_config = parse_config_pairs(args.add_config, flag="--add-config")
    append = parse_config_pairs(args.append_config, flag="--append-config")
    subtract = parse_config_pairs(args.subtract_config, flag="--subtract-config")
    delete = [k.strip() for item in args.delete_config for k in item.split(",") if k.strip()]
    if args.replica_assignment is not None and args.partitions is None:
        raise CliError("INVALID_REQUEST", "--replica-assignment goes with --partitions")
    if args.partitions is not None:
        assignment = parse_replica_assignment(args.replica_assignment)
        with build_admin(args) as admin:
            error = admin.create_partitions({args.topic: args.partitions},
                                            assignments={args.topic: assignment} if assignment else None,
                                            validate_only=args.validate_only).get(args.topic)
        if error is not None:
            raise error
        verb = "Validated adding partitions to" if args.validate_only else "Altered"
        if not (set_config or append or subtract or delete):
            emit(args, {"topic": args.topic, "partitions": args.partitions, "validate_only": args.validate_only},
                 f"{verb} topic {args.topic}: {args.partitions} partitions.")
            return 0
    if not (set_config or append or subtract or delete):
        raise CliError("INVALID_REQUEST", "nothing to change: give --partitions, --add-config, --delete-config, "
                                          "--append-config or --subtract-config")
    with build_admin(args) as admin:
        config = admin.alter_topic_config(args.topic, set_config=set_config, delete_config=delete,
                                          append_config=append, subtract_config=subtract,
                                          validate_only=args.validate_only)
    configs = ",".join(f"{k}={v}" for k, v in sorted(config.items()))
    verb = "Validated the change of" if args.validate_only else "Altered"
    emit(args, {"topic": args.topic, "config": config, "validate_only": args.validate_only},
         f"{verb} topic {args.topic}. Configs: {configs}")
    return 0


def run_elect_leaders(args: argparse.Namespace) -> int:
    """JSON: {"election_type", "results": [{"topic", "partition", "error": null | {code, message}}]};
    exit 1 when an election failed (ELECTION_NOT_NEEDED is not a failure), as kafka-leader-election."""
    if args.partition is not None and args.topic is None:
        raise CliError("INVALID_REQUEST", "--partition goes with --topic")
    with build_admin(args) as admin:
        partitions = None
        if args.topic is not None:
            topic = admin.describe_topics([args.topic])[args.topic]
            if topic.error is not None:
                raise topic.error
            partitions = [(args.topic, p.partition) for p in topic.partitions
                          if args.partition is None or p.partition == args.partition]
            if not partitions:
                raise CliError("UNKNOWN_TOPIC_OR_PARTITION", f"{args.topic}-{args.partition} does not exist")
        results = admin.elect_leaders(election_type=args.election_type, partitions=partitions)
    rows = [{"topic": t, "partition": p, "error": None if e is None else {"code": e.name, "message": e.message}}
            for (t, p), e in sorted(results.items())]
    elected = [f"{r['topic']}-{r['partition']}" for r in rows if r["error"] is None]
    not_needed = [f"{r['topic']}-{r['partition']}" for r in rows
                  if r["error"] and r["error"]["code"] == "ELECTION_NOT_NEEDED"]
    failed = [r for r in rows if r["error"] and r["error"]["code"] != "ELECTION_NOT_NEEDED"]
    lines = [f"Successfully completed leader election ({args.election_type.upper()}) for partitions "
             f"{', '.join(elected)}" if elected else "No partition needed a leader election"]
    if not_needed:
        lines.append(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    lines += [f"Error completing leader election ({args.election_type.upper()}) for partition "
              f"{r['topic']}-{r['partition']}: {r['error']['code']}: {r['error']['message']}" for r in failed]
    emit(args, {"election_type": args.election_type, "results": rows}, "\n".join(lines))
    return 1 if failed else 0


def run_delete(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        admin.delete_topic(args.topic)
    emit(args, {"topic": args.topic, "deleted": True}, f"Deleted topic {args.topic}.")
    return 0
