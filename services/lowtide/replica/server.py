"""Replica server: hosts partition replicas (`lowtide serve replica`).

With ``--auth-enabled`` every call needs a bearer token (``--tokens-file`` and the digests in the
metadata store) and passes the ACL checks of ``ReplicaServicer``; ``--token-file`` holds this
broker's own token (principal ``User:broker-<id>``) that its follower fetches present to the
leaders.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from prometheus_client import REGISTRY

from lowtide.auth.access import parse_super_users
from lowtide.auth.scram_store import build_scram_login
from lowtide.auth.tokens import end_session, mint_session
from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.client.replica import ReplicaClient
from lowtide.common.bootstrap import ServerBootstrap
from lowtide.common.server import add_auth_flags, add_common_flags, add_flag, listener_from_flag
from lowtide.diskless.broker import DisklessBroker
from lowtide.diskless.produce import DisklessConfig
from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.metadata_responses import MetadataResponses
from lowtide.kafka.server import KafkaEndpoint, add_kafka_flags, all_apis, certificate_login, client_telemetry
from lowtide.purgatory.connection import RedisClient, RedisError, wait_for_redis
from lowtide.purgatory.events import publish_low_watermarks
from lowtide.replica.config import ReplicaConfig
from lowtide.replica.consumed_retention import ConsumedRetentionCollector
from lowtide.replica.manager import ReplicaManager
from lowtide.replica.metrics import ReplicaCollector
from lowtide.replica.parking import FetchLimits
from lowtide.replica.registration import add_replica_service
from lowtide.replica.servicer import ReplicaServicer
from lowtide.share.flags import add_share_flags, build_share_partitions
from lowtide.share.metrics import ShareCollector
from lowtide_pb import replica_pb2

log = logging.getLogger(__name__)


def _parse_kv(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--config expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


# Broker-level keys accepted through --config (Kafka's names) and the flag each one overrides;
# every other key is a broker default of a topic config (segment.bytes, retention.ms, ...).
BROKER_KEYS = {
    "replica.lag.time.max.ms": "replica_lag_time_max_ms",
    "replica.fetch.wait.max.ms": "replica_fetch_wait_max_ms",
    "fetch.max.wait.ms": "fetch_max_wait_ms",
    "broker.session.timeout.ms": "session_timeout_ms",
    "broker.heartbeat.interval.ms": "heartbeat_interval_ms",
    "log.checkpoint.interval.ms": "checkpoint_interval_ms",
    "log.retention.check.interval.ms": "retention_check_interval_ms",
    "producer.id.expiration.check.interval.ms": "producer_id_expiration_check_interval_ms",
    "diskless.commit.interval.ms": "diskless_commit_interval_ms",
    "diskless.buffer.max.bytes": "diskless_buffer_max_bytes",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_flags(parser, grpc_port=9092)
    add_flag(parser, "--id", type=int, required=True, help="broker id of this replica server")
    add_flag(parser, "--data-dir", required=True, help="directory of the partition logs")
    add_flag(parser, "--advertised-host", default="127.0.0.1", help="host other services use to reach us")
    add_flag(parser, "--rack", default="", help="rack id")
    add_flag(parser, "--session-timeout-ms", type=int, default=6000, help="liveness session timeout")
    add_flag(parser, "--stray-retention-ms", type=int, default=-1,
             help="remove stray partitions (set aside: the metadata does not name them) after this long; "
                  "-1 keeps them until `lowtide strays remove`")
    add_flag(parser, "--log-open-threads", type=int, default=8,
             help="threads that open the partition logs at start and close them at shutdown "
                  "(Kafka's num.recovery.threads.per.data.dir)")
    add_flag(parser, "--heartbeat-interval-ms", type=int, default=0,
             help="heartbeat period (0 = a quarter of the session timeout)")
    add_flag(parser, "--replica-lag-time-max-ms", type=int, default=10000, help="ISR lag limit")
    add_flag(parser, "--replica-fetch-wait-max-ms", type=int, default=500, help="follower long-poll")
    add_flag(parser, "--replication-listener", default="auto",
             help="where followers fetch from this broker and coordinators append to it without gRPC "
                  "(lowtide.rpc.framed.listener): "
                  "HOST:PORT, 'auto' (the gRPC listen host, a free port, advertised in the broker's registration) "
                  "or 'off'")
    add_flag(parser, "--replication-transport", default="socket",
             help="how followers fetch: stream (one Replicate stream per leader) | fetch (unary Fetch calls)")
    add_flag(parser, "--replica-fetch-sessions", default="on",
             help="followers fetch in incremental fetch sessions (KIP-227): a round lists and answers only the "
                  "partitions that changed; off = every round carries every followed partition")
    add_flag(parser, "--replication-linger-ms", type=int, default=ReplicaConfig.replication_linger_ms,
             help="how long a leader holds a woken follower fetch (under 64 KiB) while Kafka Produce requests "
                  "are about to append, so they share one replication round (0 = never)")
    add_flag(parser, "--fetch-max-wait-ms", type=int, default=FetchLimits.max_wait_ms,
             help="cap on any fetch's long-poll wait")
    add_flag(parser, "--fetch-max-bytes", type=int, default=FetchLimits.max_bytes,
             help="cap on a consumer fetch's bytes")
    add_flag(parser, "--max-parked-fetches", type=int, default=FetchLimits.max_parked,
             help="consumer fetches that may wait for data at once (beyond: answered at once)")
    add_flag(parser, "--max-parked-fetches-per-connection", type=int, default=FetchLimits.max_parked_per_connection,
             help="the same bound per client connection")
    add_flag(parser, "--checkpoint-interval-ms", type=int, default=5000, help="HW/LSO checkpoint period")
    add_flag(parser, "--retention-check-interval-ms", type=int, default=5000, help="retention pass period")
    add_flag(parser, "--segment-file-idle-ms", type=int, default=30000,
             help="a log segment unused this long closes its file until next used (0 = never)")
    add_flag(parser, "--producer-id-expiration-check-interval-ms", type=int, default=600000,
             help="how often producers idle for producer.id.expiration.ms are forgotten (KIP-854)")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="broker default of a topic config (segment.bytes, retention.ms, ...)")
    add_auth_flags(parser, checks="require a bearer token on every call and check ACLs",
                   own_token="this broker's own token (User:broker-<id>) for its calls to other brokers")
    add_flag(parser, "--object-store", default=None,
             help="object store URL of diskless topics' WAL files (file:///dir, s3://...); unset = no diskless")
    add_flag(parser, "--diskless-commit-interval-ms", type=int, default=DisklessConfig.commit_interval_ms,
             help="diskless.commit.interval.ms: a WAL file is closed this long after its first batch")
    add_flag(parser, "--diskless-buffer-max-bytes", type=int, default=DisklessConfig.buffer_max_bytes,
             help="diskless.buffer.max.bytes: a WAL file is closed at once when it holds this much")
    add_kafka_flags(parser, needs_frontdoor=True)
    add_share_flags(parser)


def run(args: argparse.Namespace) -> int:
    name = f"replica-{args.id}"
    boot = ServerBootstrap(args, name=name)
    log_defaults = _parse_kv(args.config)
    for key, attr in BROKER_KEYS.items():
        if key in log_defaults:
            setattr(args, attr, int(log_defaults.pop(key)))
    if args.heartbeat_interval_ms <= 0:
        # Several heartbeats per session, so one late heartbeat on a busy machine does not make a
        # healthy broker look dead (Kafka: 2 s heartbeats, 9 s session).
        args.heartbeat_interval_ms = max(100, args.session_timeout_ms // 4)
    kafka = KafkaEndpoint.from_args(args, name=name, tls=boot.tls)
    if kafka is not None and not args.frontdoor_addr:
        raise SystemExit(f"{name}: --kafka-listener needs --frontdoor-addr (env LOWTIDE_FRONTDOOR_ADDR): the "
                         "Kafka listener sends topic, group and DeleteRecords requests to the front door")
    kafka_port, kafka_listeners = 0, {}
    if kafka is not None:
        kafka.start()
        kafka_port = kafka.advertised_port(args.advertised_host)
        kafka_listeners = kafka.advertised(args.advertised_host)
    replication = listener_from_flag(args.replication_listener, grpc_addr=args.grpc_addr, tls=boot.tls, name=name,
                                     flag="--replication-listener")
    config = ReplicaConfig(
        replication_port=replication.bind() if replication is not None else 0,
        broker_id=args.id, data_dir=Path(args.data_dir), advertised_host=args.advertised_host,
        grpc_port=boot.grpc_port, kafka_port=kafka_port, kafka_listeners=kafka_listeners, rack=args.rack,
        metrics_url=boot.metrics_url,
        session_timeout_ms=args.session_timeout_ms, heartbeat_interval_ms=args.heartbeat_interval_ms,
        stray_retention_ms=args.stray_retention_ms, log_open_threads=args.log_open_threads,
        replica_lag_time_max_ms=args.replica_lag_time_max_ms,
        replica_fetch_wait_max_ms=args.replica_fetch_wait_max_ms,
        replication_transport=args.replication_transport, replication_linger_ms=args.replication_linger_ms,
        replica_fetch_sessions=args.replica_fetch_sessions == "on",
        checkpoint_interval_ms=args.checkpoint_interval_ms,
        retention_check_interval_ms=args.retention_check_interval_ms,
        segment_file_idle_ms=args.segment_file_idle_ms,
        producer_id_expiration_check_interval_ms=args.producer_id_expiration_check_interval_ms,
        fetch_limits=FetchLimits(max_wait_ms=args.fetch_max_wait_ms, max_bytes=args.fetch_max_bytes,
                                 max_parked=args.max_parked_fetches,
                                 max_parked_per_connection=args.max_parked_fetches_per_connection),
        log_defaults=log_defaults, auth_enabled=args.auth_enabled,
        tokens_file=Path(args.tokens_file) if args.tokens_file else None,
        super_users=parse_super_users(args.super_users),
        # With mutual TLS the broker's certificate is its identity (its token would be refused).
        token_file=Path(args.token_file) if args.token_file and not (boot.tls and boot.tls.mutual) else None)
    if args.replica_fetch_sessions not in ("on", "off"):
        raise SystemExit(f"{name}: --replica-fetch-sessions must be on or off, got {args.replica_fetch_sessions!r}")
    if config.replication_transport not in ("socket", "stream", "fetch"):
        raise SystemExit(f"{name}: --replication-transport must be socket, stream or fetch, "
                         f"got {config.replication_transport!r}")
    boot.require_token_file(f"the token of User:broker-{args.id}, which this broker presents when it fetches "
                            "from leaders")
    connections = boot.connect()
    redis, access = connections.redis, connections.access
    manager = ReplicaManager(config=config, store=connections.metadata, redis=redis)
    manager.on_leader_lw_change = lambda changes: _publish(redis, changes, args.id)
    REGISTRY.register(ReplicaCollector(manager))
    REGISTRY.register(ConsumedRetentionCollector(manager.consumed_retention, broker_id=args.id))

    diskless = None
    if args.object_store:
        diskless = DisklessBroker(config=DisklessConfig(
            broker_id=args.id, commit_interval_ms=args.diskless_commit_interval_ms,
            buffer_max_bytes=args.diskless_buffer_max_bytes), object_store_url=args.object_store,
            metadata=connections.metadata,
            call_metadata=connections.call_metadata)
    # KIP-932: the share-partitions this replica leads, their state in __share_group_state; share
    # fetches come over gRPC (ShareFetch) and, with a Kafka listener, over the Kafka protocol.
    share_partitions = build_share_partitions(
        args, store=connections.metadata, replicas=ReplicaClient(metadata=connections.call_metadata), name=name)
    # consumed.retention.groups may name share groups ("share:<group>"): their start offsets.
    manager.consumed_retention.read_share_starts = share_partitions.read_share_starts
    share_partitions.on_start_offset_moved = lambda _key, _offset: manager.housekeeping.wake_retention()
    REGISTRY.register(ShareCollector(share_partitions, broker_id=args.id, topic_names=lambda: {
        i.topic_id: n for n, i in connections.metadata.topics().items()}, low_watermark=lambda t, p: (
            -1 if (part := manager.registry.find(t, p)) is None else part.low_watermark(manager.live_brokers))))
    servicer = ReplicaServicer(manager, access=access, diskless=diskless, share_partitions=share_partitions)
    remote_front = None
    if kafka is not None:
        remote_front = RemoteFrontDoor(address=args.frontdoor_addr)
        kafka.attach(KafkaBroker(apis=all_apis(), services=KafkaServices(
            node=Node(node_id=args.id, host=args.advertised_host, port=config.kafka_port, rack=args.rack),
            producer=servicer.producer, fetcher=servicer.fetcher,
            offsets=servicer.offsets, deleter=servicer.deleter, epochs=servicer.epochs,
            front_door=remote_front.bound,
            transaction_version=args.kafka_transaction_version,
            txn_markers=servicer.txn_markers, producer_states=servicer.producer_states,
            telemetry=client_telemetry(args, name=name), share=servicer.shares,
            metadata_responses=MetadataResponses(revision=connections.metadata.version),
            authenticate=access.authenticate, auth_required=config.auth_enabled,
            sasl_login=access.authenticate if config.auth_enabled else None,
            scram=build_scram_login(connections.metadata, auth_enabled=config.auth_enabled,
                                    session_lifetime_ms=args.kafka_connections_max_reauth_ms),
            certificates=certificate_login(
                kafka, session_lifetime_ms=args.kafka_connections_max_reauth_ms,
                mint=(lambda principal, ttl_s: mint_session(connections.metadata, principal=principal,
                                                            ttl_s=ttl_s))
                if config.auth_enabled else None,
                end=(lambda token: end_session(connections.metadata, token)) if config.auth_enabled else None,
                verify=access.authenticate if config.auth_enabled else None))))

    def register(server) -> None:
        add_replica_service(servicer, server)

    def on_stop() -> None:
        if replication is not None:
            replication.stop()
        if kafka is not None:
            kafka.stop()
            remote_front.close()
        if diskless is not None:
            diskless.stop()  # flushes and commits what producers are waiting for
        manager.stop()

    def start() -> None:
        wait_for_redis(redis, timeout_s=args.redis_wait_seconds, service=name)
        if kafka is not None and kafka.loop is not None:
            # The follower rounds too: an answer is read and appended by the loop that serves this
            # broker's Produce requests, without waking a thread per round (replica/fetcher.py).
            manager.fetchers.run_on(kafka.loop)
        manager.start()
        if replication is not None:
            # On the Kafka listener's loop: a Produce's append, the follower rounds it wakes and the
            # HW move answering it then run on one thread (rpc/framed/listener.py).
            replication.start(open_session=servicer.open_framed_session, authenticate=access.authenticate_peer,
                              draining=lambda: servicer.draining, loop=kafka.loop if kafka is not None else None)

    return boot.serve(service_names=[replica_pb2.DESCRIPTOR.services_by_name["Replica"].full_name],
                      register=register, on_stop=on_stop, on_draining=servicer.drain, ready=start)


def _publish(redis: RedisClient, changes: list[tuple[tuple[str, int], int]], replica_id: int) -> None:
    """Low-watermark change events, one pipeline per batch of changes (hints: one lost is logged)."""
    try:
        publish_low_watermarks(redis, changes, replica_id=str(replica_id))
    except RedisError as exc:
        log.debug("could not publish low watermarks: %s", exc)
