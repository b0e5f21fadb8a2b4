"""`lowtide reassign plan|execute|verify|cancel|list`, `lowtide drain` and `lowtide rebalance`:
partition reassignment (KIP-455), shaped like Kafka's ``kafka-reassign-partitions``.

The files are Kafka's, read and written the same way: a reassignment is
``{"version":1,"partitions":[{"topic","partition","replicas","log_dirs"}]}`` (``log_dirs``
optional, and ``"any"`` only: a lowtide broker has one data directory), topics to move are
``{"version":1,"topics":[{"topic":"t"}]}``. Text output follows the Kafka tool's wording, so
runbooks written for it read the same; ``--output json`` prints one document per command:

* plan / rebalance --plan -> {"current": REASSIGNMENT, "proposed": REASSIGNMENT, "moves": copies,
  "brokers": [{"broker", "replicas", "leaders", "replicas_after", "leaders_after"}]}
* execute / rebalance --execute / drain -> {"current": REASSIGNMENT (for rollback), "started":
  ["t-0", ...], "throttle": bytes/s or null, "completed": bool (true only once waited for)}
* verify -> {"partitions": [{"topic", "partition", "status": "completed" | "in_progress" |
  "mismatch", "replicas"}], "throttles_cleared": bool}
* cancel -> {"cancelled": ["t-0", ...], "throttles_cleared": bool}; list -> {"reassignments":
  [{"topic", "partition", "replicas", "adding_replicas", "removing_replicas"}]}

Exit codes: 0 done; 1 a refused request, a partition that failed, verify with a move still in
progress, a wait that timed out (REQUEST_TIMED_OUT); 2 a bad command line. Waiting shows progress
on stderr (stdout stays one JSON document).

Throttles (KIP-73, ``--throttle BYTES_PER_S``) are set as Kafka's tool sets them: the topic
configs ``leader.replication.throttled.replicas`` (the partitions' current replicas) and
``follower.replication.throttled.replicas`` (the replicas being added), and the broker configs
``leader.replication.throttled.rate`` / ``follower.replication.throttled.rate`` on every broker
the moves touch; verify (and cancel, and a wait that completes) removes them unless
``--preserve-throttles``.

``lowtide drain --broker K`` moves every replica off K onto the other live brokers (least loaded
first, racks kept apart, replication factors unchanged) and waits until K holds none: the
Kubernetes chart's preStop hook runs it before a replica pod goes away, so its flags and exit
code (0 only when K is empty) are an interface.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from lowtide.cli.client_args import add_cluster_command, build_admin
from lowtide.cli.output import CliError, emit, progress
from lowtide.cli.reassign_plan import Assignment, brokers_load, changed, count_moves, plan_drain, plan_moves
from lowtide.client import Admin
from lowtide.client.admin import OngoingReassignment
from lowtide.client.metadata import ClusterSnapshot
from lowtide.client.replica import ReplicaClient
from lowtide.errors import LowtideError

TopicPartition = tuple[str, int]

LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
ALTER_LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"
WAIT_POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
MISMATCH_GRACE_S = 3.0


def register(subparsers: argparse._SubParsersAction) -> None:
    reassign = subparsers.add_parser("reassign", help="move partitions between brokers (kafka-reassign-partitions)")
    actions = reassign.add_subparsers(dest="reassign_action", required=True)

    plan = add_cluster_command(actions, "plan", func=run_plan,
                               help="propose a reassignment of topics onto brokers (Kafka's --generate)")
    plan.add_argument("--topics-to-move-json-file", required=True, metavar="FILE",
                      help='{"version":1,"topics":[{"topic":"t"}]}')
    plan.add_argument("--broker-list", required=True, metavar="ID,ID,...", help="brokers to place the replicas on")

    execute = add_cluster_command(actions, "execute", help="start the moves of a reassignment file", func=run_execute)
    execute.add_argument("--reassignment-json-file", required=True, metavar="FILE")
    add_move_flags(execute)
    execute.add_argument("--additional", action="store_true",
                         help="start even when some of these partitions are already moving (replaces their target)")
    execute.add_argument("--disallow-replication-factor-change", action="store_true",
                         help="refuse targets whose replica count differs from the current one")

    verify = add_cluster_command(actions, "verify", func=run_verify,
                                 help="report whether the moves of a file are done; clears throttles then")
    verify.add_argument("--reassignment-json-file", required=True, metavar="FILE")
    verify.add_argument("--preserve-throttles", action="store_true", help="leave the throttle configs in place")

    cancel = add_cluster_command(actions, "cancel", func=run_cancel,
                                 help="cancel the ongoing moves of a file's partitions")
    cancel.add_argument("--reassignment-json-file", required=True, metavar="FILE")
    cancel.add_argument("--preserve-throttles", action="store_true", help="leave the throttle configs in place")

    add_cluster_command(actions, "list", help="the moves in progress", func=run_list)

    drain = add_cluster_command(subparsers, "drain", func=run_drain,
                                help="move every replica off a broker and wait (before removing it)")
    drain.add_argument("--broker", type=int, required=True, metavar="ID", help="the broker to empty")
    drain.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                       help="give up (exit 1, REQUEST_TIMED_OUT) when the broker still holds replicas by then")
    drain.add_argument("--throttle", type=int, default=None, metavar="BYTES_PER_S",
                       help="cap the copy rate per broker (KIP-73 throttle), removed when done")

    rebalance = add_cluster_command(subparsers, "rebalance", func=run_rebalance,
                                    help="even replicas and preferred leaders over the live brokers")
    mode = rebalance.add_mutually_exclusive_group(required=True)
    mode.add_argument("--plan", action="store_true", help="print the proposed reassignment (Kafka's JSON)")
    mode.add_argument("--execute", action="store_true", help="start it")
    add_move_flags(rebalance)


def add_move_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--throttle", type=int, default=None, metavar="BYTES_PER_S",
                        help="cap the copy rate per broker (KIP-73 throttle); verify removes it")
    parser.add_argument("--wait", action="store_true",
                        help="show progress until the moves are done (rebalance: then elect the preferred leaders)")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS", help="with --wait: give up then")
    parser.add_argument("--preserve-throttles", action="store_true",
                        help="with --wait: leave the throttle configs in place when done")


# -- Kafka's JSON ------------------------------------------------------------------------------
def read_json_file(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise CliError("INVALID_REQUEST", f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise CliError("INVALID_REQUEST", f"{path} is not JSON: {exc}") from None


def _check_version(doc: Any, path: str, key: str) -> list:
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise CliError("INVALID_REQUEST", f'{path}: expected {{"version":1,"{key}":[...]}}')
    if doc.get("version", 1) != 1:
        raise CliError("INVALID_REQUEST", f"{path}: version {doc.get('version')!r} is not supported (only 1)")
    return doc[key]


def parse_reassignment(doc: Any, *, path: str = "reassignment") -> Assignment:
    """Kafka's reassignment JSON -> {(topic, partition): replicas}, checked as Kafka's tool checks it."""
    out: Assignment = {}
    for entry in _check_version(doc, path, "partitions"):
        if not isinstance(entry, dict):
            raise CliError("INVALID_REQUEST", f"{path}: each partition must be an object, got {entry!r}")
        topic, partition, replicas = entry.get("topic"), entry.get("partition"), entry.get("replicas")
        if not isinstance(topic, str) or not topic or type(partition) is not int or partition < 0:
            raise CliError("INVALID_REQUEST", f"{path}: a partition needs a topic name and a partition number, "
                                              f"got {entry!r}")
        name = f"{topic}-{partition}"
        if not isinstance(replicas, list) or not replicas or not all(type(r) is int and r >= 0 for r in replicas):
            raise CliError("INVALID_REPLICA_ASSIGNMENT", f"{path}: {name}: replicas must be a non-empty list of "
                                                         f"broker ids, got {replicas!r}")
        if len(set(replicas)) != len(replicas):
            raise CliError("INVALID_REPLICA_ASSIGNMENT", f"{path}: {name}: replicas {replicas} name a broker twice")
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None:
            if not isinstance(log_dirs, list) or len(log_dirs) != len(replicas):
                raise CliError("INVALID_REQUEST", f"{path}: {name}: log_dirs must list one entry per replica")
            if any(d != "any" for d in log_dirs):
                raise CliError("INVALID_REQUEST", f'{path}: {name}: log_dirs other than "any" are not supported '
                                                  f"(a lowtide broker has one data directory)")
        if (topic, partition) in out:
            raise CliError("INVALID_REQUEST", f"{path}: {name} is listed more than once")
        out[(topic, partition)] = tuple(replicas)
    if not out:
        raise CliError("INVALID_REQUEST", f"{path}: no partitions to reassign")
    return out


def parse_topics_to_move(doc: Any, *, path: str = "topics") -> list[str]:
    topics = []
    for entry in _check_version(doc, path, "topics"):
        if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str) or not entry["topic"]:
            raise CliError("INVALID_REQUEST", f'{path}: each entry must be {{"topic": "name"}}, got {entry!r}')
        if entry["topic"] not in topics:
            topics.append(entry["topic"])
    if not topics:
        raise CliError("INVALID_REQUEST", f"{path}: no topics to move")
    return topics


def reassignment_doc(assignment: Mapping[TopicPartition, Sequence[int]]) -> dict:
    """The Kafka tool's JSON for ``assignment``, partitions in topic and partition order."""
    return {"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r), "log_dirs": ["any"] * len(r)}
        for (t, p), r in sorted(assignment.items())]}


def to_json(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"))


def names(partitions: Iterable[TopicPartition]) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(partitions))


def parse_broker_list(text: str) -> list[int]:
    try:
        brokers = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise CliError("INVALID_REQUEST", f"--broker-list must look like 1,2,3, got {text!r}") from None
    if not brokers or len(set(brokers)) != len(brokers):
        raise CliError("INVALID_REQUEST", f"--broker-list must name distinct brokers, got {text!r}")
    return brokers


# -- the cluster as the commands see it --------------------------------------------------------
def read_cluster(admin: Admin, topics: Sequence[str] | None = None) -> tuple[ClusterSnapshot, Assignment]:
    """The metadata and every partition's replica list (during a move: target then removing);
    ``topics`` None: every topic, internal ones included, diskless ones left out (their partitions
    live with the coordinator shards and do not move)."""
    if topics is None:
        topics = admin.list_topics(include_internal=True)
    snapshot = admin.describe_cluster(list(topics))
    assignment: Assignment = {}
    for name in topics:
        meta = snapshot.topic(name)
        if meta.diskless:
            continue
        for p in meta.partitions:
            assignment[(name, p.partition)] = tuple(p.replicas)
    return snapshot, assignment


def targets_of(assignment: Assignment, ongoing: Sequence[OngoingReassignment]) -> Assignment:
    """Each partition's replicas once its move (if any) is done."""
    out = dict(assignment)
    for o in ongoing:
        if (o.topic, o.partition) in out:
            out[(o.topic, o.partition)] = o.target
    return out


def check_known(wanted: Iterable[TopicPartition], current: Assignment, snapshot: ClusterSnapshot) -> None:
    missing = [tp for tp in wanted if tp not in current]
    if missing:
        raise CliError("UNKNOWN_TOPIC_OR_PARTITION", f"unknown partition(s): {names(missing)}")


def status_of(targets: Assignment, current: Assignment, ongoing: Sequence[OngoingReassignment],
              ) -> dict[TopicPartition, str]:
    """completed | in_progress | mismatch (no move, but not on the target either), per partition."""
    moving = {(o.topic, o.partition) for o in ongoing}
    out = {}
    for tp, target in targets.items():
        if tp in moving:
            out[tp] = "in_progress"
        else:
            out[tp] = "completed" if tuple(current.get(tp, ())) == tuple(target) else "mismatch"
    return out


def status_line(tp: TopicPartition, status: str, *, target: Sequence[int], current: Sequence[int]) -> str:
    name = f"{tp[0]}-{tp[1]}"
    if status == "completed":
        return f"Reassignment of partition {name} is completed."
    if status == "in_progress":
        return f"Reassignment of partition {name} is still in progress."
    return (f"There is no active reassignment of partition {name}, but replica set is "
            f"{list(current)} rather than {list(target)}.")


# -- throttles ---------------------------------------------------------------------------------
def throttled_replicas(moves: Assignment, current: Assignment) -> dict[str, dict[str, str]]:
    """Per topic, the two throttled-replica lists Kafka's tool writes: the leader side lists the
    partitions' current replicas (those that may lead the copy), the follower side the adding ones."""
    out: dict[str, dict[str, list[str]]] = {}
    for (topic, partition), target in sorted(moves.items()):
        before = current.get((topic, partition), ())
        lists = out.setdefault(topic, {LEADER_THROTTLED_REPLICAS: [], FOLLOWER_THROTTLED_REPLICAS: []})
        lists[LEADER_THROTTLED_REPLICAS] += [f"{partition}:{b}" for b in before]
        lists[FOLLOWER_THROTTLED_REPLICAS] += [f"{partition}:{b}" for b in target if b not in before]
    return {t: {k: ",".join(v) for k, v in lists.items() if v} for t, lists in out.items()}


def set_throttles(args: argparse.Namespace, admin: Admin, *, rate: int, moves: Assignment,
                  current: Assignment) -> None:
    if rate <= 0:
        raise CliError("INVALID_REQUEST", f"--throttle must be a positive number of bytes/s, got {rate}")
    for topic, config in throttled_replicas(moves, current).items():
        admin.alter_topic_config(topic, set_config=config)
    brokers = sorted({b for tp, target in moves.items() for b in (*target, *current.get(tp, ()))})
    for b in brokers:
        admin.alter_broker_config(b, set_config=dict.fromkeys((LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE),
                                                              str(rate)))
    progress(args, f"The inter-broker throttle limit was set to {rate} B/s on brokers "
                   f"{','.join(map(str, brokers))}")


def clear_throttles(args: argparse.Namespace, admin: Admin, *, topics: Iterable[str],
                    snapshot: ClusterSnapshot) -> bool:
    """Remove the throttle configs (Kafka's verify: the topics' lists and every broker's rates).
    Only keys that are set are deleted, so a cluster that was never throttled is left as it is.
    True when something was removed."""
    cleared = False
    for topic in sorted(set(topics)):
        meta = snapshot.topics.get(topic)
        keys = [k for k in (LEADER_THROTTLED_REPLICAS, FOLLOWER_THROTTLED_REPLICAS)
                if meta is not None and meta.config.get(k)]
        if keys:
            admin.alter_topic_config(topic, delete_config=keys)
            progress(args, f"Clearing topic-level throttles on topic {topic}")
            cleared = True
    try:
        configs = admin.describe_broker_configs(sorted(snapshot.brokers))
    except LowtideError:
        return cleared  # broker configs are not served: no rate can be set
    throttled = [b for b, config in sorted(configs.items())
                 if any(config.get(k) for k in (LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE))]
    if throttled:
        for b in throttled:
            admin.alter_broker_config(b, delete_config=(LEADER_THROTTLED_RATE, FOLLOWER_THROTTLED_RATE,
                                                         ALTER_LOG_DIRS_RATE))
        progress(args, f"Clearing broker-level throttles on brokers {','.join(map(str, throttled))}")
        cleared = True
    return cleared


# -- starting and following moves --------------------------------------------------------------
def start_moves(args: argparse.Namespace, admin: Admin, *, moves: Assignment, current: Assignment,
                allow_replication_factor_change: bool = True) -> list[TopicPartition]:
    """Throttles first (so no copy starts unthrottled), then the moves; raises when any failed."""
    if args.throttle is not None:
        set_throttles(args, admin, rate=args.throttle, moves=moves, current=current)
    results = admin.alter_partition_reassignments(
        moves, allow_replication_factor_change=allow_replication_factor_change)
    failed = {tp: e for tp, e in results.items() if e is not None}
    missing = [tp for tp in moves if tp not in results]
    if failed or missing:
        started = sorted(tp for tp, e in results.items() if e is None)
        detail = "; ".join([f"{t}-{p}: {e.name}: {e.message}" for (t, p), e in sorted(failed.items())]
                           + [f"{t}-{p}: no answer" for t, p in missing])
        first = next(iter(failed.values()), None)
        raise CliError(first.name if first else "UNKNOWN_SERVER_ERROR",
                       f"Error reassigning partition(s): {detail}"
                       + (f" (started: {names(started)})" if started else ""))
    return sorted(moves)


def wait_for(args: argparse.Namespace, admin: Admin, *, targets: Assignment, timeout_s: float,
             label: str) -> tuple[ClusterSnapshot, Assignment]:
    """Poll until every partition of ``targets`` is on its target with no move left, showing
    progress; REQUEST_TIMED_OUT after ``timeout_s``."""
    started = time.monotonic()
    last_report = -PROGRESS_EVERY_S
    last_done = -1
    mismatched_since: float | None = None
    topics = sorted({t for t, _ in targets})
    while True:
        # The moves first, then the metadata: a move that ends between the two reads shows as
        # completed, never as a replica set that is neither moving nor on its target.
        ongoing = admin.list_partition_reassignments(list(targets))
        snapshot, current = read_cluster(admin, topics)
        states = status_of(targets, current, ongoing)
        done = sum(s == "completed" for s in states.values())
        elapsed = time.monotonic() - started
        if done != last_done or elapsed - last_report >= PROGRESS_EVERY_S:
            progress(args, f"{label}: {done} of {len(targets)} partition(s) moved ({elapsed:.0f} s)")
            last_report, last_done = elapsed, done
        if done == len(targets):
            return snapshot, current
        stuck = [tp for tp, s in states.items() if s == "mismatch"]
        # The front door's metadata view may trail the move record by a moment: only a mismatch
        # that lasts is a move cancelled or replaced by someone else.
        mismatched_since = (mismatched_since or elapsed) if stuck else None
        if stuck and elapsed - mismatched_since >= MISMATCH_GRACE_S:
            raise CliError("INVALID_REQUEST", f"{names(stuck)} no longer move to the planned replicas "
                                              f"(cancelled or replaced by another reassignment)")
        if elapsed >= timeout_s:
            pending = [tp for tp, s in states.items() if s != "completed"]
            raise CliError("REQUEST_TIMED_OUT", f"{label}: {len(pending)} partition(s) still moving after "
                                                f"{timeout_s:g} s: {names(pending)}")
        time.sleep(WAIT_POLL_S)


def execute_moves(args: argparse.Namespace, admin: Admin, *, moves: Assignment, current: Assignment,
                  label: str, allow_replication_factor_change: bool = True, elect: bool = False) -> int:
    """Shared by execute, rebalance --execute: rollback JSON, start, optionally wait. ``elect``:
    once waited for, move leadership to the new preferred leaders (else the controller's leader
    balance does it within its check interval)."""
    rollback = {tp: current[tp] for tp in moves}
    text = ["Current partition replica assignment", "", to_json(reassignment_doc(rollback)), "",
            "Save this to use as the --reassignment-json-file option during rollback"]
    started = start_moves(args, admin, moves=moves, current=current,
                          allow_replication_factor_change=allow_replication_factor_change)
    text.append(f"Successfully started partition reassignment(s) for {names(started)}")
    if args.throttle is not None and not args.wait:
        text.append("Warning: You must run --verify periodically, until the reassignment completes, "
                    "to ensure the throttle is removed.")
    completed = False
    if args.wait:
        snapshot, _ = wait_for(args, admin, targets=moves, timeout_s=args.timeout, label=label)
        completed = True
        if args.throttle is not None and not args.preserve_throttles:
            clear_throttles(args, admin, topics={t for t, _ in moves}, snapshot=snapshot)
        text.append(f"Reassignment of {len(moves)} partition(s) is completed.")
        if elect:
            elect_preferred(args, admin, moves)
    emit(args, {"current": reassignment_doc(rollback), "started": [f"{t}-{p}" for t, p in started],
                "throttle": args.throttle, "completed": completed}, "\n".join(text))
    return 0


def elect_preferred(args: argparse.Namespace, admin: Admin, partitions: Iterable[TopicPartition]) -> None:
    """Preferred elections for ``partitions``; a failure is reported, not fatal (the moves are done
    and the controller's leader balance retries)."""
    results = admin.elect_leaders(election_type="preferred", partitions=sorted(partitions))
    failed = {tp: e for tp, e in results.items() if e is not None and e.name != "ELECTION_NOT_NEEDED"}
    for (t, p), e in sorted(failed.items()):
        progress(args, f"warning: preferred leader election for {t}-{p} failed: {e.name}: {e.message}")


# -- commands ----------------------------------------------------------------------------------
def run_plan(args: argparse.Namespace) -> int:
    topics = parse_topics_to_move(read_json_file(args.topics_to_move_json_file), path=args.topics_to_move_json_file)
    brokers = parse_broker_list(args.broker_list)
    with build_admin(args) as admin:
        snapshot, current = read_cluster(admin, topics)
        ongoing = admin.list_partition_reassignments(list(current))
    unknown = [b for b in brokers if b not in snapshot.brokers]
    if unknown:
        raise CliError("INVALID_REQUEST", f"--broker-list names unknown broker(s) {','.join(map(str, unknown))}")
    targets = targets_of(current, ongoing)
    racks = {b: snapshot.brokers[b].rack for b in brokers}
    proposed = plan_moves(current=targets, brokers=brokers, racks=racks)
    return emit_plan(args, current=targets, proposed=proposed, brokers=brokers)


def emit_plan(args: argparse.Namespace, *, current: Assignment, proposed: Assignment, brokers: Sequence[int],
              whole: Assignment | None = None) -> int:
    """Print a proposal; the per-broker counts are over ``whole`` (default ``current``) before and
    after it, so a rebalance shows the cluster's load, not only the moving partitions'."""
    whole = current if whole is None else whole
    # The brokers placed on, and those the moves take replicas off (their counts going down); the
    # chart's scale-down check reads the live brokers from rebalance --plan's list.
    shown = sorted(set(brokers) | {b for r in current.values() for b in r})
    before, after = brokers_load(whole, shown), brokers_load({**whole, **proposed}, shown)
    doc = {"current": reassignment_doc(current), "proposed": reassignment_doc(proposed),
           "moves": count_moves(current, proposed),
           "brokers": [{"broker": b, "replicas": before[b][0], "leaders": before[b][1],
                        "replicas_after": after[b][0], "leaders_after": after[b][1]} for b in shown]}
    text = ["Current partition replica assignment", to_json(reassignment_doc(current)), "",
            "Proposed partition reassignment configuration", to_json(reassignment_doc(proposed))]
    emit(args, doc, "\n".join(text))
    return 0


def run_execute(args: argparse.Namespace) -> int:
    moves = parse_reassignment(read_json_file(args.reassignment_json_file), path=args.reassignment_json_file)
    with build_admin(args) as admin:
        snapshot, current = read_cluster(admin, sorted({t for t, _ in moves}))
        check_known(moves, current, snapshot)
        ongoing = admin.list_partition_reassignments(list(moves))
        if ongoing and not args.additional:
            raise CliError("INVALID_REQUEST", f"Cannot execute because there is an existing partition reassignment "
                                              f"of {names((o.topic, o.partition) for o in ongoing)}. Use "
                                              f"--additional to override this and replace it.")
        return execute_moves(args, admin, moves=moves, current=current, label="reassign",
                             allow_replication_factor_change=not args.disallow_replication_factor_change)


def run_verify(args: argparse.Namespace) -> int:
    targets = parse_reassignment(read_json_file(args.reassignment_json_file), path=args.reassignment_json_file)
    with build_admin(args) as admin:
        ongoing = admin.list_partition_reassignments(list(targets))  # before the metadata, as wait_for
        snapshot, current = read_cluster(admin, sorted({t for t, _ in targets}))
        check_known(targets, current, snapshot)
        states = status_of(targets, current, ongoing)
        done = all(s == "completed" for s in states.values())
        cleared = False
        if done and not args.preserve_throttles:
            cleared = clear_throttles(args, admin, topics={t for t, _ in targets}, snapshot=snapshot)
    lines = ["Status of partition reassignment:"] + [
        status_line(tp, states[tp], target=targets[tp], current=current[tp]) for tp in sorted(targets)]
    emit(args, {"partitions": [{"topic": t, "partition": p, "status": states[(t, p)],
                                "replicas": list(current[(t, p)])} for t, p in sorted(targets)],
                "throttles_cleared": cleared}, "\n".join(lines))
    return 0 if done else 1


def run_cancel(args: argparse.Namespace) -> int:
    asked = parse_reassignment(read_json_file(args.reassignment_json_file), path=args.reassignment_json_file)
    with build_admin(args) as admin:
        ongoing = admin.list_partition_reassignments(list(asked))
        moving = sorted((o.topic, o.partition) for o in ongoing)
        results = admin.alter_partition_reassignments({tp: None for tp in moving}) if moving else {}
        failed = {tp: e for tp, e in results.items() if e is not None}
        if failed:
            first = next(iter(failed.values()))
            raise CliError(first.name, "Error cancelling partition reassignment(s): " + "; ".join(
                f"{t}-{p}: {e.name}: {e.message}" for (t, p), e in sorted(failed.items())))
        cleared = False
        if not args.preserve_throttles:
            snapshot, _ = read_cluster(admin, sorted({t for t, _ in asked}))
            cleared = clear_throttles(args, admin, topics={t for t, _ in asked}, snapshot=snapshot)
    text = (f"Successfully cancelled partition reassignment(s) for: {names(moving)}" if moving
            else "None of the specified partition reassignments are active.")
    emit(args, {"cancelled": [f"{t}-{p}" for t, p in moving], "throttles_cleared": cleared}, text)
    return 0


def run_list(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        ongoing = admin.list_partition_reassignments()
    rows = sorted(ongoing, key=lambda o: (o.topic, o.partition))
    text = ("Current partition reassignments:\n" + "\n".join(
        f"{o.topic}-{o.partition}: replicas: {','.join(map(str, o.replicas))}. adding: "
        f"{','.join(map(str, o.adding))}. removing: {','.join(map(str, o.removing))}." for o in rows)
            if rows else "No partition reassignments found.")
    emit(args, {"reassignments": [{"topic": o.topic, "partition": o.partition, "replicas": list(o.replicas),
                                   "adding_replicas": list(o.adding), "removing_replicas": list(o.removing)}
                                  for o in rows]}, text)
    return 0


def run_drain(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    with build_admin(args) as admin:
        snapshot, current = read_cluster(admin)
        if args.broker not in snapshot.brokers:
            raise CliError("INVALID_REQUEST", f"broker {args.broker} is not registered "
                                              f"(brokers: {','.join(map(str, sorted(snapshot.brokers)))})")
        ongoing = admin.list_partition_reassignments()
        targets = targets_of(current, ongoing)
        live = [b for b, meta in snapshot.brokers.items() if meta.live]
        racks = {b: meta.rack for b, meta in snapshot.brokers.items()}
        moves = plan_drain(current=targets, broker=args.broker, live=live, racks=racks)
        holding = sorted(tp for tp, r in current.items() if args.broker in r)
        if not holding:
            emit(args, {"current": reassignment_doc({}), "started": [], "throttle": args.throttle, "completed": True},
                 f"Broker {args.broker} holds no replica.")
            return 0
        progress(args, f"drain: moving {len(moves)} partition(s) off broker {args.broker} "
                       f"({len(holding) - len(moves)} already leaving it)")
        if moves:
            start_moves(args, admin, moves=moves, current=current)
        watched = {**{tp: targets[tp] for tp in holding}, **moves}
        snapshot, after = wait_for(args, admin, targets=watched, timeout_s=max(0.0, deadline - time.monotonic()),
                                   label=f"drain of broker {args.broker}")
        left = sorted(tp for tp, r in after.items() if args.broker in r)
        if left:
            raise CliError("REQUEST_TIMED_OUT", f"broker {args.broker} still holds {names(left)} "
                                                f"(a new assignment put them there)")
        if args.throttle is not None:
            clear_throttles(args, admin, topics={t for t, _ in moves}, snapshot=snapshot)
    emit(args, {"current": reassignment_doc({tp: current[tp] for tp in moves}),
                "started": [f"{t}-{p}" for t, p in sorted(moves)], "throttle": args.throttle, "completed": True},
         f"Broker {args.broker} holds no replica: moved {names(moves) or 'nothing'}.")
    return 0


def partition_sizes(args: argparse.Namespace, admin: Admin, snapshot: ClusterSnapshot,
                    live: Sequence[int]) -> dict[tuple[str, int], int]:
    """Bytes per partition (the largest copy any live broker reports: DescribeLogs), so a rebalance
    evens bytes as well as counts. A broker that does not answer (down, or the caller may not
    describe its logs) leaves its partitions at their other copies' size; none answering at all
    plans by count only, said on stderr."""
    sizes: dict[tuple[str, int], int] = {}
    replicas = ReplicaClient(channels=admin.channels, metadata=admin.metadata)
    failed = []
    for b in live:
        meta = snapshot.brokers[b]
        try:
            for info in replicas.describe_logs(f"{meta.host}:{meta.port}", timeout_s=10).logs:
                key = (info.topic, info.partition)
                sizes[key] = max(sizes.get(key, 0), info.size_bytes)
        except (LowtideError, grpc.RpcError) as exc:
            failed.append(f"{b} ({exc})")
    if failed:
        progress(args, f"rebalance: no partition sizes from broker(s) {', '.join(failed)}"
                       + ("; planning by replica counts only" if not sizes else ""))
    return sizes


def run_rebalance(args: argparse.Namespace) -> int:
    with build_admin(args) as admin:
        snapshot, current = read_cluster(admin)
        ongoing = admin.list_partition_reassignments()
        if ongoing and args.execute:
            moving = names((o.topic, o.partition) for o in ongoing)
            raise CliError("INVALID_REQUEST", f"partitions are moving ({moving}); wait for them "
                                              f"(lowtide reassign list) before rebalancing")
        targets = targets_of(current, ongoing)
        live = sorted(b for b, meta in snapshot.brokers.items() if meta.live)
        racks = {b: snapshot.brokers[b].rack for b in live}
        # A partition with a replica on a broker that is down is left alone: the broker may only be
        # restarting, and moving its replicas away is a drain's decision (lowtide drain), not a
        # rebalance's. Its live replicas still count in the per-broker load.
        down = {tp: r for tp, r in targets.items() if any(b not in live for b in r)}
        if down:
            progress(args, f"rebalance: leaving {len(down)} partition(s) alone, with replicas on brokers that are "
                           f"down ({','.join(map(str, sorted({b for r in down.values() for b in r} - set(live))))})")
        movable = {tp: r for tp, r in targets.items() if tp not in down}
        sizes = partition_sizes(args, admin, snapshot, live)
        moves = changed(movable, plan_moves(current=movable, brokers=live, racks=racks, load=targets, sizes=sizes))
        if args.plan:
            return emit_plan(args, current={tp: targets[tp] for tp in moves}, proposed=moves, brokers=live,
                             whole=targets)
        if not moves:
            emit(args, {"current": reassignment_doc({}), "started": [], "throttle": args.throttle, "completed": True},
                 "The cluster is balanced: nothing to move.")
            return 0
        return execute_moves(args, admin, moves=moves, current=current, label="rebalance", elect=True)
