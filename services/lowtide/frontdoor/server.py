"""Front door server: the lowtide.v1.Admin service (topics, metadata, DeleteRecords, groups, ACLs).

``lowtide serve frontdoor --redis-url URL [--auth-enabled --tokens-file F --super-users U,..
--token-file F]``. Stateless: any number may run against one Redis; exactly one of them acts as
controller at a time. With auth on every call needs a bearer token, and the front door calls the
leaders (ListOffsets, DeleteRecords fan-out) as ``User:frontdoor`` with the token in
``--token-file``, after authorizing its own caller.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
from prometheus_client import REGISTRY

from lowtide.auth.access import parse_super_users
from lowtide.auth.acl import Authorizer
from lowtide.auth.identity import is_service_principal, token_file_metadata
from lowtide.auth.scram_store import ScramStore, build_scram_login
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import Authenticator, end_session, mint_session
from lowtide.client.diskless import DisklessCoordinatorClient
from lowtide.client.replica import ReplicaClient
from lowtide.common.bootstrap import ServerBootstrap, join_cluster
from lowtide.common.server import add_auth_flags, add_common_flags, add_flag
from lowtide.diskless.topics import ShardDirectory
from lowtide.frontdoor.admin.acls import AclAdmin
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.admin.config_admin import TopicConfigAdmin
from lowtide.frontdoor.admin.delete_records import RecordsDeleter
from lowtide.frontdoor.admin.diskless import DisklessTopicAdmin
from lowtide.frontdoor.admin.partitions import PartitionCreator
from lowtide.frontdoor.admin.scram import ScramAdmin
from lowtide.frontdoor.controller.controller import Controller, ControllerConfig
from lowtide.frontdoor.controller.elections import BalanceConfig, LeaderBalancer, LeaderElections
from lowtide.frontdoor.controller.reassignments import PartitionReassigner
from lowtide.frontdoor.groups.classic_members import MIGRATION_POLICIES
from lowtide.frontdoor.groups.consumer_membership import ConsumerGroupConfig, ConsumerGroups
from lowtide.frontdoor.groups.groups import GroupCoordinator, GroupStore
from lowtide.frontdoor.groups.membership import GroupMembership, MembershipConfig
from lowtide.frontdoor.groups.offsets_migration import migrate_legacy_offsets
from lowtide.frontdoor.groups.offsets_topic import DEFAULT_OFFSETS_TOPIC_PARTITIONS, OffsetsTopic, OffsetsTopicConfig
from lowtide.frontdoor.metrics import ClusterCollector
from lowtide.frontdoor.scanner_proxy import add_scanner_proxy
from lowtide.frontdoor.servicer import AdminServicer, FrontDoor
from lowtide.frontdoor.transactions.transactions import (
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
    TransactionCoordinator,
    TxnStateStore,
)
from lowtide.frontdoor.transactions.txn_log import DEFAULT_TXN_STATE_PARTITIONS, TxnLogConfig, TxnStateLog
from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.metadata_responses import MetadataResponses
from lowtide.kafka.server import KafkaEndpoint, add_kafka_flags, all_apis, certificate_login, client_telemetry
from lowtide.leases import add_lease_flags, check_backend, kubernetes_lease
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.group_configs import GroupConfigs
from lowtide.metadata.store import MetadataStore
from lowtide.purgatory.connection import RedisClient, connect_redis
from lowtide.share.groups import ShareGroupConfig, ShareGroups
from lowtide.share.persist import ShareStateLog
from lowtide.tls.principal import PrincipalMapper
from lowtide_pb import admin_pb2, admin_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_GRPC_PORT = 9092
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name


@dataclass(frozen=True)
class FrontDoorConfig:
    redis_url: str
    metadata_url: str = "etcd://127.0.0.1:2379"
    auth_enabled: bool = False
    tokens_file: str | None = None
    super_users: frozenset[str] = field(default_factory=frozenset)
    # This front door's own token (User:frontdoor) for its calls to the replicas.
    token_file: str | None = None
    fanout_threads: int = 32
    # Partitions of __consumer_offsets when this front door creates it (Kafka's
    # offsets.topic.num.partitions); an existing topic keeps its own count.
    offsets_topic_partitions: int = DEFAULT_OFFSETS_TOPIC_PARTITIONS
    # Consumer group membership (JoinGroup...): session timeout bounds, initial rebalance delay,
    # group size limit (Kafka's group.* broker settings; frontdoor/groups/membership.py).
    membership: MembershipConfig = field(default_factory=MembershipConfig)
    # KIP-848 consumer groups: session timeout, heartbeat interval, size limit, assignors (Kafka's
    # group.consumer.* settings; frontdoor/groups/consumer_membership.py).
    consumer_groups: ConsumerGroupConfig = field(default_factory=ConsumerGroupConfig)
    # KIP-932 share groups: session timeout, heartbeat interval, size limit (Kafka's group.share.*
    # settings; share/groups.py).
    share_groups: ShareGroupConfig = field(default_factory=ShareGroupConfig)
    # Partitions of __transaction_state when this front door creates it (Kafka's
    # transaction.state.log.num.partitions); an existing topic keeps its own count.
    txn_state_partitions: int = DEFAULT_TXN_STATE_PARTITIONS
    # Kafka's transactional.id.expiration.ms (frontdoor/transactions/transactions.py).
    transactional_id_expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS
    # Mutual TLS: callers' principals from their client certificates (tls/principal.py); the
    # front door's own identity is then its certificate, not token_file.
    certificates: PrincipalMapper | None = None


@dataclass
class FrontDoorParts:
    """Everything one front door owns; ``close`` releases it (pool, channels, Redis)."""

    front: FrontDoor
    store: MetadataStore
    replicas: ReplicaClient
    pool: ThreadPoolExecutor
    redis: RedisClient
    offsets: OffsetsTopic | None = None
    cache: MetadataCache | None = None

    def register(self, server: grpc.Server) -> None:
        admin_pb2_grpc.add_AdminServicer_to_server(AdminServicer(self.front), server)
        add_scanner_proxy(server, store=self.store, channels=self.replicas.channels)  # lowtide orphans scan

    def close(self) -> None:
        if self.front.members is not None:
            self.front.members.stop()
        if self.front.consumer_groups is not None:
            self.front.consumer_groups.stop()
        if self.front.share_groups is not None:
            self.front.share_groups.stop()
        if self.front.transactions is not None:
            self.front.transactions.stop()
        if self.offsets is not None:
            self.offsets.stop()
        if self.cache is not None:
            self.cache.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.replicas.close()
        self.store.close()
        self.redis.close()


def build_front_door(config: FrontDoorConfig) -> FrontDoorParts:
    """Wire the domain objects of a front door (also used in-process by tests)."""
    redis = connect_redis(config.redis_url)
    store = MetadataStore.from_url(config.metadata_url)
    acls = AclStore(metadata=store)  # ACLs, tokens and SCRAM credentials live in the metadata store
    authorizer = Authorizer(store=acls, enabled=config.auth_enabled, super_users=config.super_users)
    # A caller without a token is User:ANONYMOUS and the ACLs decide, which by default deny: the
    # contract (docs/design/kip-107-delete-records.md#request-and-answers) is that an
    # unauthenticated DeleteRecords gets TOPIC_AUTHORIZATION_FAILED per partition (not a failed call),
    # and Metadata/ListTopics show it no topic. A wrong token is refused outright. The replica port,
    # which has no such contract, refuses a missing token too.
    authenticator = Authenticator(metadata=store, tokens_file=config.tokens_file, required=False,
                                  certificates=config.certificates, reserved_for_certificates=is_service_principal)
    replicas = ReplicaClient(metadata=token_file_metadata(config.token_file))
    pool = ThreadPoolExecutor(max_workers=config.fanout_threads, thread_name_prefix="fanout")
    # Routes DeleteRecords and ListOffsets from an immutable snapshot of the metadata image.
    cache = MetadataCache(store=store)
    cache.start()
    directory = ShardDirectory(store=store)  # diskless topics: the coordinator shards (KIP-1164)
    diskless = DisklessTopicAdmin(store=store, directory=directory, pool=pool, cache=cache,
                                  coordinators=DisklessCoordinatorClient(
                                      lookup=directory.lookup, channels=replicas.channels,
                                      metadata=token_file_metadata(config.token_file)))
    topics = TopicAdmin(store=store, authorizer=authorizer, replicas=replicas, pool=pool, diskless=diskless,
                        cache=cache)
    offsets = OffsetsTopic(store=store, replicas=replicas, topics=topics,
                           config=OffsetsTopicConfig(partitions=config.offsets_topic_partitions))
    offsets.run_after_load(lambda: migrate_legacy_offsets(redis=redis, topic=offsets))
    # Transaction states in __transaction_state, producer ids in blocks from the metadata store
    # (frontdoor/transactions/txn_log.py, frontdoor/transactions/producer_ids.py): nothing of transactions is in Redis.
    txn_states = TxnStateLog(store=store, replicas=replicas, topics=topics,
                             config=TxnLogConfig(partitions=config.txn_state_partitions),
                             migrate_from=TxnStateStore(metadata=store))
    # Group membership lives in this process's memory (frontdoor/groups/membership.py says what follows).
    members = GroupMembership(authorizer=authorizer, config=config.membership)
    # KIP-848 consumer groups: in memory and in __consumer_offsets (frontdoor/groups/consumer_membership.py).
    consumer_groups = ConsumerGroups(log_=offsets, topics=store, authorizer=authorizer, config=config.consumer_groups,
                                     classic=members)
    members.is_consumer_group = consumer_groups.is_consumer_group
    # KIP-932 share groups: membership in memory (share/groups.py); a group id of another type is refused.
    share_state = ShareStateLog(store=store, replicas=replicas)  # DeleteGroups tombstones a group's state
    share_groups = ShareGroups(topics=store, authorizer=authorizer, config=config.share_groups,
                               other_group=lambda g: consumer_groups.is_consumer_group(g) or members.has_members(g),
                               forget_state=share_state.delete_group, read_state=share_state.read_group,
                               reset_state=lambda key, offset: share_state.reset(key, offset, int(time.time() * 1000)),
                               group_configs=GroupConfigs(store).of)
    front = FrontDoor(
        authenticator=authenticator,
        authorizer=authorizer,
        topics=topics,
        deleter=RecordsDeleter(store=store, authorizer=authorizer, replicas=replicas, pool=pool, diskless=diskless,
                               cache=cache),
        groups=GroupCoordinator(store=GroupStore(topic=offsets), metadata=store, authorizer=authorizer,
                                members=members, consumer=consumer_groups, share=share_groups),
        acls=AclAdmin(store=acls, authorizer=authorizer),
        transactions=TransactionCoordinator(store=txn_states, metadata=store, authorizer=authorizer,
                                            replicas=replicas, offsets_partition=offsets.partition_of,
                                            offsets_written=offsets.nudge,
                                            transactional_id_expiration_ms=config.transactional_id_expiration_ms),
        members=members,
        consumer_groups=consumer_groups,
        share_groups=share_groups,
        scram=ScramAdmin(store=ScramStore(metadata=store), authorizer=authorizer),
        configs=TopicConfigAdmin(store=store, authorizer=authorizer),
        partitions=PartitionCreator(store=store, authorizer=authorizer, diskless=diskless),
        elections=LeaderElections(store=store, authorizer=authorizer),
        reassigner=PartitionReassigner(store=store, authorizer=authorizer),
    )
    members.start()  # session timeouts and rebalance deadlines
    consumer_groups.start()  # consumer group members' session and revocation timeouts
    share_groups.start()  # share group members' session timeouts
    front.transactions.start()  # the expiry of timed-out transactions (frontdoor/transactions/transactions.py)
    offsets.start()
    return FrontDoorParts(front=front, store=store, replicas=replicas, pool=pool, redis=redis, offsets=offsets,
                          cache=cache)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in ("1", "true", "yes", "on")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_flags(parser, grpc_port=DEFAULT_GRPC_PORT)
    add_auth_flags(parser, checks="require a bearer token on every call and check ACLs",
                   own_token="this front door's own token (User:frontdoor) for its calls to the replicas")
    parser.add_argument("--controller", action=argparse.BooleanOptionalAction,
                        default=_env_bool("LOWTIDE_CONTROLLER", True),
                        help="take part in controller election (env LOWTIDE_CONTROLLER)")
    add_flag(parser, "--controller-interval-ms", default=300, type=int, help="controller round interval")
    add_flag(parser, "--controller-lease-ms", default=2000, type=int, help="controller lease")
    raw = os.environ.get("LOWTIDE_AUTO_LEADER_REBALANCE_ENABLE", "true")
    parser.add_argument("--auto-leader-rebalance-enable", action=argparse.BooleanOptionalAction,
                        default=raw.strip().lower() in ("1", "true", "yes", "on"),
                        help="the controller moves leaders back to preferred replicas (Kafka's "
                             "auto.leader.rebalance.enable; env LOWTIDE_AUTO_LEADER_REBALANCE_ENABLE)")
    add_flag(parser, "--leader-imbalance-per-broker-percentage", default=10, type=int,
             help="a broker not leading more than this share of its preferred partitions is rebalanced")
    add_flag(parser, "--leader-imbalance-check-interval-seconds", default=300.0, type=float,
             help="how often the controller checks leader balance")
    add_lease_flags(parser)
    add_flag(parser, "--name", default="frontdoor", help="service name in logs")
    add_flag(parser, "--offsets-topic-partitions", default=DEFAULT_OFFSETS_TOPIC_PARTITIONS, type=int,
             help="partitions of __consumer_offsets when this front door creates it "
                  "(Kafka's offsets.topic.num.partitions)")
    defaults = MembershipConfig()
    add_flag(parser, "--group-min-session-timeout-ms", default=defaults.min_session_timeout_ms, type=int,
             help="smallest session timeout a JoinGroup may ask for (Kafka's group.min.session.timeout.ms, "
                  "whose default is 6000)")
    add_flag(parser, "--group-max-session-timeout-ms", default=defaults.max_session_timeout_ms, type=int,
             help="largest session timeout a JoinGroup may ask for (group.max.session.timeout.ms)")
    add_flag(parser, "--group-initial-rebalance-delay-ms", default=defaults.initial_rebalance_delay_ms, type=int,
             help="how long an empty group's first rebalance waits for more members "
                  "(group.initial.rebalance.delay.ms)")
    add_flag(parser, "--group-max-size", default=defaults.max_group_size, type=int,
             help="most members a group may have (group.max.size)")
    consumer = ConsumerGroupConfig()
    add_flag(parser, "--group-consumer-session-timeout-ms", default=consumer.session_timeout_ms, type=int,
             help="a KIP-848 consumer group member not heard from for this long is removed "
                  "(group.consumer.session.timeout.ms)")
    add_flag(parser, "--group-consumer-heartbeat-interval-ms", default=consumer.heartbeat_interval_ms, type=int,
             help="how often KIP-848 consumer group members heartbeat (group.consumer.heartbeat.interval.ms)")
    add_flag(parser, "--group-consumer-max-size", default=consumer.max_size, type=int,
             help="most members a KIP-848 consumer group may have (group.consumer.max.size)")
    add_flag(parser, "--group-consumer-migration-policy", default=consumer.migration_policy,
             help="online conversion between classic and consumer groups (group.consumer.migration.policy): "
                  f"one of {', '.join(MIGRATION_POLICIES)}")
    share = ShareGroupConfig()
    add_flag(parser, "--group-share-session-timeout-ms", default=share.session_timeout_ms, type=int,
             help="a KIP-932 share group member not heard from for this long is removed "
                  "(group.share.session.timeout.ms)")
    add_flag(parser, "--group-share-heartbeat-interval-ms", default=share.heartbeat_interval_ms, type=int,
             help="how often KIP-932 share group members heartbeat (group.share.heartbeat.interval.ms)")
    add_flag(parser, "--group-share-max-size", default=share.max_size, type=int,
             help="most members a KIP-932 share group may have (group.share.max.size)")
    add_flag(parser, "--transaction-state-partitions", default=DEFAULT_TXN_STATE_PARTITIONS, type=int,
             help="partitions of __transaction_state when this front door creates it "
                  "(Kafka's transaction.state.log.num.partitions)")
    add_flag(parser, "--transactional-id-expiration-ms", default=DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS, type=int,
             help="forget a transactional id with no transaction for this long (Kafka's "
                  "transactional.id.expiration.ms, default 7 days)")
    add_kafka_flags(parser, needs_frontdoor=False)


def run(args: argparse.Namespace) -> int:
    # Its Redis and access control come from build_front_door (also used in-process by tests): a
    # caller without a token is User:ANONYMOUS here, where the other servers refuse one.
    boot = ServerBootstrap(args, name=args.name)
    mutual = boot.tls is not None and boot.tls.mutual
    boot.require_token_file("the token of User:frontdoor, which the front door presents to the replicas it calls")
    args.lease_backend = check_backend(args.name, args.lease_backend)
    if args.offsets_topic_partitions < 1:
        raise SystemExit(f"{args.name}: --offsets-topic-partitions must be >= 1, got {args.offsets_topic_partitions}")
    if args.group_consumer_migration_policy not in MIGRATION_POLICIES:
        raise SystemExit(f"{args.name}: --group-consumer-migration-policy must be one of "
                         f"{', '.join(MIGRATION_POLICIES)}, got {args.group_consumer_migration_policy!r}")
    if args.transaction_state_partitions < 1:
        raise SystemExit(f"{args.name}: --transaction-state-partitions must be >= 1, "
                         f"got {args.transaction_state_partitions}")
    if args.transactional_id_expiration_ms < 1:
        raise SystemExit(f"{args.name}: --transactional-id-expiration-ms must be >= 1, "
                         f"got {args.transactional_id_expiration_ms}")
    parts = build_front_door(FrontDoorConfig(redis_url=args.redis_url, metadata_url=args.metadata_url,
                                             auth_enabled=args.auth_enabled,
                                             tokens_file=args.tokens_file,
                                             super_users=parse_super_users(args.super_users),
                                             token_file=None if mutual else args.token_file,
                                             certificates=boot.tls.mapper if mutual and boot.tls else None,
                                             offsets_topic_partitions=args.offsets_topic_partitions,
                                             transactional_id_expiration_ms=args.transactional_id_expiration_ms,
                                             txn_state_partitions=args.transaction_state_partitions,
                                             membership=MembershipConfig(
                                                 min_session_timeout_ms=args.group_min_session_timeout_ms,
                                                 max_session_timeout_ms=args.group_max_session_timeout_ms,
                                                 initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
                                                 max_group_size=args.group_max_size),
                                             consumer_groups=ConsumerGroupConfig(
                                                 session_timeout_ms=args.group_consumer_session_timeout_ms,
                                                 heartbeat_interval_ms=args.group_consumer_heartbeat_interval_ms,
                                                 max_size=args.group_consumer_max_size,
                                                 migration_policy=args.group_consumer_migration_policy),
                                             share_groups=ShareGroupConfig(
                                                 session_timeout_ms=args.group_share_session_timeout_ms,
                                                 heartbeat_interval_ms=args.group_share_heartbeat_interval_ms,
                                                 max_size=args.group_share_max_size)))
    REGISTRY.register(ClusterCollector(parts.store))
    # Stateless: no data directory to compare, but it stops if the store forgets the cluster.
    guard = join_cluster(parts.store, data_dir=None, node_id=args.name, timeout_s=args.redis_wait_seconds)
    controller = None
    if args.controller:
        lease = None
        if args.lease_backend == "kubernetes":
            lease = kubernetes_lease(args, role="controller", owner=f"{args.name}-{uuid.uuid4().hex[:8]}",
                                     lease_ms=args.controller_lease_ms,
                                     margin_ms=min(500, args.controller_lease_ms // 4))
        balancer = LeaderBalancer(store=parts.store, config=BalanceConfig(
            enabled=args.auto_leader_rebalance_enable,
            imbalance_percentage=args.leader_imbalance_per_broker_percentage,
            check_interval_s=args.leader_imbalance_check_interval_seconds))
        controller = Controller(store=parts.store, lease=lease, balancer=balancer, config=ControllerConfig(
            interval_s=args.controller_interval_ms / 1000, lease_ms=args.controller_lease_ms))
        controller.start()

    kafka = KafkaEndpoint.from_args(args, name=args.name, tls=boot.tls)
    if kafka is not None:
        # Only a bootstrap address: Metadata lists the replica servers as the brokers.
        host, _ = kafka.listener.host, kafka.start()
        kafka.attach(KafkaBroker(apis=all_apis(), services=KafkaServices(
            node=Node(node_id=-1, host=host, port=kafka.port),
            front_door=lambda _metadata: parts.front, authenticate=parts.front.principal_of,
            transaction_version=args.kafka_transaction_version,
            telemetry=client_telemetry(args, name=args.name),
            metadata_responses=MetadataResponses(revision=parts.store.version), auth_required=args.auth_enabled,
            sasl_login=parts.front.authenticator.authenticate if args.auth_enabled else None,
            scram=build_scram_login(parts.store, auth_enabled=args.auth_enabled,
                                    session_lifetime_ms=args.kafka_connections_max_reauth_ms),
            certificates=certificate_login(
                kafka, session_lifetime_ms=args.kafka_connections_max_reauth_ms,
                mint=(lambda principal, ttl_s: mint_session(parts.store, principal=principal, ttl_s=ttl_s))
                if args.auth_enabled else None,
                end=(lambda token: end_session(parts.store, token)) if args.auth_enabled else None,
                verify=parts.front.authenticator.authenticate if args.auth_enabled else None))))

    def on_stop() -> None:
        guard.stop()
        if kafka is not None:
            kafka.stop()
        if controller is not None:
            controller.stop()
        parts.close()

    return boot.serve(service_names=[ADMIN_SERVICE], register=parts.register, on_stop=on_stop)
