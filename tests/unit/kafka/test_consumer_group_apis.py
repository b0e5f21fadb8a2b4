"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69) on the Kafka listener's dispatcher,
frame by frame as Kafka's consumer and admin encode them, through both ways a listener reaches the
coordinator: in process (a front door's listener) and over gRPC through the front door's servicer
and its remote twin (a replica's listener). The coordinator is the real one over a real
``__consumer_offsets`` on the real replicas of ``replica_set``."""

from __future__ import annotations

import datetime
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_heartbeat.v0.request import ConsumerGroupHeartbeatRequest as HeartbeatV0
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest as HeartbeatV1
from kio.schema.consumer_group_heartbeat.v1.request import TopicPartitions
from kio.schema.offset_fetch.v9.request import OffsetFetchRequest, OffsetFetchRequestGroup

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import Authenticator
from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.client.replica import ReplicaClient
from lowtide.frontdoor.admin.admin import TopicAdmin
from lowtide.frontdoor.groups.consumer_membership import ConsumerGroupConfig, ConsumerGroups
from lowtide.frontdoor.groups.groups import GroupCoordinator, GroupStore
from lowtide.frontdoor.groups.offsets_topic import OffsetsTopic, OffsetsTopicConfig
from lowtide.frontdoor.servicer import AdminServicer
from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.server import all_apis
from lowtide.metadata.store import MetadataStore
from lowtide_pb import admin_pb2_grpc
from tests.unit.frontdoor.harness import start_grpc_server
from tests.unit.kafka.test_client_telemetry_apis import send

HEARTBEAT, DESCRIBE, OFFSET_FETCH = 68, 69, 9
UNKNOWN_MEMBER_ID, STALE_MEMBER_EPOCH = 25, 113
UNSUPPORTED_ASSIGNOR, FENCED_MEMBER_EPOCH, GROUP_ID_NOT_FOUND, INVALID_REQUEST = 112, 110, 69, 42
REBALANCE_TIMEOUT = datetime.timedelta(minutes=5)
NOT_SENT = datetime.timedelta(milliseconds=-1)


@pytest.fixture(params=["in-process", "over-grpc"])
def broker(request, replica_set):
    replica_set.clean()
    store = MetadataStore.from_url(replica_set.metadata_url)
    store.create_topic(name="orders", partitions=3, replication_factor=1, config={}, assignment=[[0]] * 3)
    pool, client = ThreadPoolExecutor(max_workers=4), ReplicaClient()
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
    topic = OffsetsTopic(store=store, replicas=client, config=OffsetsTopicConfig(partitions=2, tail_interval_s=0.05),
                         topics=TopicAdmin(store=store, authorizer=authorizer, replicas=client, pool=pool))
    topic.start()
    groups = ConsumerGroups(log_=topic, topics=store, authorizer=authorizer,
                            config=ConsumerGroupConfig(heartbeat_interval_ms=1500))
    offsets = GroupCoordinator(store=GroupStore(topic=topic), metadata=store, authorizer=authorizer, consumer=groups)
    authenticator = Authenticator(required=False)
    server = remote = None
    if request.param == "in-process":
        def front_door(metadata):
            return SimpleNamespace(consumer_groups=groups, groups=offsets)
    else:
        front = SimpleNamespace(consumer_groups=groups, groups=offsets, authenticator=authenticator,
                                authorizer=authorizer)
        server, address = start_grpc_server(lambda s: admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(front), s))  # type: ignore[arg-type]
        remote = RemoteFrontDoor(address=address)
        front_door = remote.bound
    yield KafkaBroker(apis=all_apis(), services=KafkaServices(
        node=Node(1, "127.0.0.1", 9092), authenticate=authenticator.authenticate, front_door=front_door)), store
    if server is not None:
        server.stop(0)
        remote.close()
    topic.stop()
    pool.shutdown()


def test_join_heartbeat_and_describe_as_kafka_encodes_them(broker):
    broker, store = broker
    topic_id = uuid.UUID(hex=store.topics()["orders"].topic_id)
    member = str(uuid.uuid4())
    joined = send(broker, HEARTBEAT, 1, HeartbeatV1(
        group_id="g", member_id=member, member_epoch=0, instance_id=None, rack_id=None,
        rebalance_timeout=REBALANCE_TIMEOUT, subscribed_topic_names=("orders",), subscribed_topic_regex=None,
        server_assignor="uniform", topic_partitions=()), client_id="consumer-g-1")
    assert (int(joined.error_code), joined.member_id, joined.member_epoch) == (0, member, 1)
    assert joined.heartbeat_interval.total_seconds() == 1.5
    assert [(t.topic_id, t.partitions) for t in joined.assignment.topic_partitions] == [(topic_id, (0, 1, 2))]
    # Nothing changed: no assignment in the answer.
    again = send(broker, HEARTBEAT, 1, HeartbeatV1(
        group_id="g", member_id=member, member_epoch=1, instance_id=None, rack_id=None, rebalance_timeout=NOT_SENT,
        subscribed_topic_names=None, subscribed_topic_regex=None, server_assignor=None, topic_partitions=None),
        client_id="consumer-g-1")
    assert (int(again.error_code), again.member_epoch, again.assignment) == (0, 1, None)
    # v0: the coordinator names a joining member.
    v0 = send(broker, HEARTBEAT, 0, HeartbeatV0(
        group_id="g", member_id="", member_epoch=0, instance_id=None, rack_id=None,
        rebalance_timeout=REBALANCE_TIMEOUT, subscribed_topic_names=("orders",), server_assignor=None,
        topic_partitions=()))
    assert int(v0.error_code) == 0 and v0.member_id and v0.member_epoch == 2
    # The first member owns everything until it revokes: the second gets nothing yet.
    assert v0.assignment.topic_partitions == ()
    revoke = send(broker, HEARTBEAT, 1, HeartbeatV1(
        group_id="g", member_id=member, member_epoch=1, instance_id=None, rack_id=None, rebalance_timeout=NOT_SENT,
        subscribed_topic_names=None, subscribed_topic_regex=None, server_assignor=None,
        topic_partitions=(TopicPartitions(topic_id=topic_id, partitions=(0, 1, 2)),)), client_id="consumer-g-1")
    assert revoke.member_epoch == 1 and len(revoke.assignment.topic_partitions[0].partitions) == 2

    described = send(broker, DESCRIBE, 1, ConsumerGroupDescribeRequest(group_ids=("g", "none"),
                                                                       include_authorized_operations=True))
    g, missing = described.groups
    assert (int(g.error_code), g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name) == (
        0, "Reconciling", 2, 2, "uniform")
    first = next(m for m in g.members if m.member_id == member)
    assert (first.client_id, first.member_epoch, first.subscribed_topic_names, first.member_type) == (
        "consumer-g-1", 1, ("orders",), 1)
    assert [(t.topic_name, t.partitions) for t in first.assignment.topic_partitions] == [("orders", (0, 1))]
    assert g.authorized_operations & (1 << 3)  # READ
    assert int(missing.error_code) == GROUP_ID_NOT_FOUND


def test_refusals_are_the_answers_error_codes(broker):
    broker, _ = broker
    base = dict(group_id="g", instance_id=None, rack_id=None, rebalance_timeout=REBALANCE_TIMEOUT,
                subscribed_topic_names=("orders",), subscribed_topic_regex=None, topic_partitions=())
    bad = send(broker, HEARTBEAT, 1, HeartbeatV1(member_id="m", member_epoch=0, server_assignor="cooperative",
                                                 **base))
    assert int(bad.error_code) == UNSUPPORTED_ASSIGNOR and "uniform" in bad.error_message
    assert int(send(broker, HEARTBEAT, 1, HeartbeatV1(member_id="", member_epoch=0, server_assignor=None,
                                                      **base)).error_code) == INVALID_REQUEST
    send(broker, HEARTBEAT, 1, HeartbeatV1(member_id="m", member_epoch=0, server_assignor=None, **base))
    fenced = send(broker, HEARTBEAT, 1, HeartbeatV1(member_id="m", member_epoch=9, server_assignor=None, **base))
    assert int(fenced.error_code) == FENCED_MEMBER_EPOCH


def test_offset_fetch_v9_checks_the_member_id_and_epoch_against_the_consumer_group(broker):
    broker, _ = broker
    member = str(uuid.uuid4())
    joined = send(broker, HEARTBEAT, 1, HeartbeatV1(
        group_id="g", member_id=member, member_epoch=0, instance_id=None, rack_id=None,
        rebalance_timeout=REBALANCE_TIMEOUT, subscribed_topic_names=("orders",), subscribed_topic_regex=None,
        server_assignor=None, topic_partitions=()))
    assert (int(joined.error_code), joined.member_epoch) == (0, 1)

    def fetch_error(member_id: str | None, epoch: int) -> int:
        answer = send(broker, OFFSET_FETCH, 9, OffsetFetchRequest(groups=(OffsetFetchRequestGroup(
            group_id="g", member_id=member_id, member_epoch=epoch, topics=None),), require_stable=False))
        return int(answer.groups[0].error_code)

    assert fetch_error(member, 1) == 0
    assert fetch_error(member, 0) == STALE_MEMBER_EPOCH
    assert fetch_error("someone-else", 1) == UNKNOWN_MEMBER_ID
    assert fetch_error(None, -1) == 0  # the admin client's fetch: no member to check
