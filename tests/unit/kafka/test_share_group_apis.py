"""KIP-932's APIs on the Kafka listener's dispatcher, frame by frame as Kafka's share consumer and
admin encode them: ShareGroupHeartbeat (76) and ShareGroupDescribe (77) through both ways a
listener reaches the front door's share group coordinator (in process, and over gRPC through the
servicer and its remote twin, as from a replica); ShareFetch (78), ShareAcknowledge (79) and
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91) and DeleteShareGroupOffsets (92) on a
listener with no replica, answered in every version served; the offsets answers' grouping by
topic with a stand-in replica handler, and a front door without the coordinator."""

from __future__ import annotations

import datetime
import uuid
from types import SimpleNamespace

import pytest
from kio.schema.alter_share_group_offsets.v0.request import (
    AlterShareGroupOffsetsRequest,
    AlterShareGroupOffsetsRequestPartition,
    AlterShareGroupOffsetsRequestTopic,
)
from kio.schema.delete_share_group_offsets.v0.request import (
    DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequestTopic,
)
from kio.schema.describe_share_group_offsets.v1.request import (
    DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequestGroup,
)
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest

from lowtide.auth.acl import Authorizer
from lowtide.auth.store import AclStore
from lowtide.auth.tokens import Authenticator
from lowtide.client.frontdoor import RemoteFrontDoor
from lowtide.errors import GroupIdNotFound, UnknownTopicOrPartition
from lowtide.frontdoor.servicer import AdminServicer
from lowtide.kafka.broker import KafkaBroker, KafkaServices, Node
from lowtide.kafka.protocol import request_type
from lowtide.kafka.server import all_apis
from lowtide.messages.consumer_groups import ConsumerGroupDescription
from lowtide.messages.share import ShareGroupOffsets, ShareStartOffset
from lowtide.metadata.store import MetadataStore
from lowtide.share.groups import ShareGroupConfig, ShareGroups
from lowtide_pb import admin_pb2_grpc
from tests.unit.frontdoor.harness import start_grpc_server
from tests.unit.kafka.test_client_telemetry_apis import send

HEARTBEAT, DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE, DESCRIBE_OFFSETS, ALTER_OFFSETS = 76, 77, 78, 79, 90, 91
DELETE_OFFSETS = 92
FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, INVALID_REQUEST, GROUP_ID_NOT_FOUND = 110, 25, 42, 69
NOT_LEADER_OR_FOLLOWER, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 6, 15, 16


@pytest.fixture(params=["in-process", "over-grpc"])
def broker(request, replica_set):
    replica_set.clean()
    store = MetadataStore.from_url(replica_set.metadata_url)
    store.create_topic(name="orders", partitions=3, replication_factor=1, config={}, assignment=[[0]] * 3)
    authorizer = Authorizer(store=AclStore(metadata=store), enabled=False)
    groups = ShareGroups(topics=store, authorizer=authorizer, config=ShareGroupConfig(heartbeat_interval_ms=1500))
    authenticator = Authenticator(required=False)
    server = remote = None
    if request.param == "in-process":
        def front_door(metadata):
            return SimpleNamespace(share_groups=groups)
    else:
        front = SimpleNamespace(share_groups=groups, authenticator=authenticator, authorizer=authorizer)
        server, address = start_grpc_server(lambda s: admin_pb2_grpc.add_AdminServicer_to_server(
            AdminServicer(front), s))  # type: ignore[arg-type]
        remote = RemoteFrontDoor(address=address)
        front_door = remote.bound
    yield KafkaBroker(apis=all_apis(), services=KafkaServices(
        node=Node(1, "127.0.0.1", 9092), authenticate=authenticator.authenticate, front_door=front_door)), store
    if server is not None:
        server.stop(0)
        remote.close()


def heartbeat(broker, member: str, epoch: int, topics=("orders",)):
    return send(broker, HEARTBEAT, 1, ShareGroupHeartbeatRequest(
        group_id="g", member_id=member, member_epoch=epoch, rack_id=None,
        subscribed_topic_names=None if topics is None else tuple(topics)))


def test_a_share_member_joins_and_is_described_as_kafka_encodes_them(broker):
    broker, store = broker
    topic_id = uuid.UUID(hex=store.topics()["orders"].topic_id)
    member = uuid.uuid4().hex
    joined = heartbeat(broker, member, 0)
    assert joined.error_code == 0 and joined.member_id == member and joined.member_epoch == 1
    assert joined.heartbeat_interval == datetime.timedelta(milliseconds=1500)
    assert [(t.topic_id, sorted(t.partitions)) for t in joined.assignment.topic_partitions] == [(topic_id, [0, 1, 2])]
    again = heartbeat(broker, member, 1, topics=None)
    assert again.error_code == 0 and again.assignment is None  # unchanged: not sent again
    described = send(broker, DESCRIBE, 1, ShareGroupDescribeRequest(group_ids=("g", "nope"),
                                                                    include_authorized_operations=False))
    g, nope = described.groups
    assert g.error_code == 0 and g.group_state == "Stable" and g.assignor_name == "simple"
    assert [m.member_id for m in g.members] == [member]
    assert g.members[0].assignment.topic_partitions[0].topic_name == "orders"
    assert nope.error_code == GROUP_ID_NOT_FOUND


def test_heartbeat_errors_are_the_answers_error_code(broker):
    broker, _ = broker
    member = uuid.uuid4().hex
    heartbeat(broker, member, 0)
    assert heartbeat(broker, member, 7, topics=None).error_code == FENCED_MEMBER_EPOCH
    assert heartbeat(broker, uuid.uuid4().hex, 3, topics=None).error_code == UNKNOWN_MEMBER_ID
    assert heartbeat(broker, "", 0).error_code == INVALID_REQUEST
    left = heartbeat(broker, member, -1, topics=None)
    assert left.error_code == 0 and left.member_epoch == -1


@pytest.mark.parametrize("version", [1, 2])
def test_share_fetch_and_acknowledge_on_a_listener_without_replicas_answer_not_leader(broker, version):
    broker, store = broker
    topic_id = uuid.UUID(hex=store.topics()["orders"].topic_id)
    fetch = request_type(SHARE_FETCH, version)
    module = __import__(fetch.__module__, fromlist=["FetchTopic"])
    answer = send(broker, SHARE_FETCH, version, fetch(
        group_id="g", member_id=uuid.uuid4().hex, share_session_epoch=0, max_wait=datetime.timedelta(0),
        min_bytes=1, max_bytes=1 << 20, max_records=10, batch_size=10, forgotten_topics_data=(),
        topics=(module.FetchTopic(topic_id=topic_id, partitions=(
            module.FetchPartition(partition_index=0, acknowledgement_batches=()),)),)))
    assert answer.error_code == 0
    [part] = answer.responses[0].partitions
    assert part.error_code == NOT_LEADER_OR_FOLLOWER and part.acquired_records == ()
    ack = request_type(SHARE_ACKNOWLEDGE, version)
    module = __import__(ack.__module__, fromlist=["AcknowledgeTopic"])
    answer = send(broker, SHARE_ACKNOWLEDGE, version, ack(
        group_id="g", member_id=uuid.uuid4().hex, share_session_epoch=1, topics=(module.AcknowledgeTopic(
            topic_id=topic_id, partitions=(module.AcknowledgePartition(partition_index=0, acknowledgement_batches=(
                module.AcknowledgementBatch(first_offset=0, last_offset=4, acknowledge_types=(1,)),)),)),)))
    assert answer.responses[0].partitions[0].error_code == NOT_LEADER_OR_FOLLOWER


def test_share_group_offsets_are_read_at_a_replica(broker):
    broker, _ = broker
    answer = send(broker, DESCRIBE_OFFSETS, 1, DescribeShareGroupOffsetsRequest(groups=(
        DescribeShareGroupOffsetsRequestGroup(group_id="g", topics=None),)))
    assert answer.groups[0].error_code == COORDINATOR_NOT_AVAILABLE


def test_share_group_offsets_are_reset_at_a_replica(broker):
    broker, _ = broker
    answer = send(broker, ALTER_OFFSETS, 0, AlterShareGroupOffsetsRequest(group_id="g", topics=(
        AlterShareGroupOffsetsRequestTopic(topic_name="orders", partitions=(
            AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=0),)),)))
    assert answer.error_code == COORDINATOR_NOT_AVAILABLE


def test_share_group_offsets_are_deleted_at_a_replica(broker):
    broker, _ = broker
    answer = send(broker, DELETE_OFFSETS, 0, DeleteShareGroupOffsetsRequest(group_id="g", topics=(
        DeleteShareGroupOffsetsRequestTopic(topic_name="orders"),)))
    assert answer.error_code == COORDINATOR_NOT_AVAILABLE and answer.responses == ()


def test_a_front_door_without_the_coordinator_answers_not_coordinator():
    # The whole call refused: the heartbeat's error with the member id and epoch it sent, and
    # every described group's error.
    broker = KafkaBroker(apis=all_apis(), services=KafkaServices(
        node=Node(1, "127.0.0.1", 9092), authenticate=Authenticator(required=False).authenticate,
        front_door=lambda metadata: SimpleNamespace(share_groups=None)))
    member = uuid.uuid4().hex
    answer = heartbeat(broker, member, 3, topics=None)
    assert (answer.error_code, answer.member_id, answer.member_epoch) == (NOT_COORDINATOR, member, 3)
    described = send(broker, DESCRIBE, 1, ShareGroupDescribeRequest(group_ids=("g", "h"),
                                                                    include_authorized_operations=False))
    assert [(g.group_id, g.error_code) for g in described.groups] == [("g", NOT_COORDINATOR), ("h", NOT_COORDINATOR)]


def test_share_group_offsets_answers_group_partitions_under_their_topics():
    # At a replica: each partition's answer under its topic, topics in the order they first come;
    # a topic the handler names without an id has the zero id.
    topic_id = uuid.uuid4().hex
    partitions = (ShareStartOffset(topic="orders", topic_id=topic_id, partition=2, start_offset=5, leader_epoch=1,
                                   lag=3),
                  ShareStartOffset(topic="gone", topic_id="", partition=0, error=UnknownTopicOrPartition("no")),
                  ShareStartOffset(topic="orders", topic_id=topic_id, partition=0, start_offset=7))
    handler = SimpleNamespace(
        describe_offsets=lambda principal, group_id, topics: ShareGroupOffsets(group_id=group_id,
                                                                               partitions=partitions),
        alter_offsets=lambda principal, group_id, targets: ShareGroupOffsets(group_id=group_id,
                                                                             partitions=partitions))
    share_groups = SimpleNamespace(describe=lambda principal, group_ids: [
        ConsumerGroupDescription(group_id=g, error=GroupIdNotFound("none")) for g in group_ids])
    broker = KafkaBroker(apis=all_apis(), services=KafkaServices(
        node=Node(1, "127.0.0.1", 9092), authenticate=Authenticator(required=False).authenticate, share=handler,
        front_door=lambda metadata: SimpleNamespace(share_groups=share_groups)))
    # (the zero id reads back as None)
    expected = [("orders", uuid.UUID(hex=topic_id), [(2, 0), (0, 0)]), ("gone", None, [(0, 3)])]
    described = send(broker, DESCRIBE_OFFSETS, 1, DescribeShareGroupOffsetsRequest(groups=(
        DescribeShareGroupOffsetsRequestGroup(group_id="g", topics=None),)))
    [group] = described.groups
    assert [(t.topic_name, t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in group.topics] == expected
    assert [(p.start_offset, p.leader_epoch, p.lag) for p in group.topics[0].partitions] == [(5, 1, 3), (7, -1, -1)]
    altered = send(broker, ALTER_OFFSETS, 0, AlterShareGroupOffsetsRequest(group_id="g", topics=(
        AlterShareGroupOffsetsRequestTopic(topic_name="orders", partitions=(
            AlterShareGroupOffsetsRequestPartition(partition_index=0, start_offset=0),)),)))
    assert altered.error_code == 0
    assert [(t.topic_name, t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions])
            for t in altered.responses] == expected
