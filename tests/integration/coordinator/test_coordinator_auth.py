"""With auth on, every coordinator call needs CLUSTER_ACTION (KIP-1164: the API is for brokers), and
the coordinator writes its metadata log on the replicas with its own identity (User:coordinator)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lowtide.auth.identity import bearer_metadata
from lowtide.auth.tokens import add_token
from lowtide.coordinator.leadership import read_shards
from lowtide.errors import LowtideError
from lowtide.localcluster import ClusterConfig
from lowtide.rpc.framed.callers import ListenerCaller
from lowtide_pb import coordinator_pb2 as pb
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster
from tests.integration.coordinator.dc import call_retrying, commit_request, kafka_name, new_topic_id, shard_stub


@pytest.fixture(scope="module")
def auth_cluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("dc-auth"), replicas=3,
                                                      coordinators=1, replica_config=dict(DEFAULT_REPLICA_CONFIG),
                                                      auth_enabled=True))


def token(cluster, path: str) -> list[tuple[str, str]]:
    return bearer_metadata(Path(path).read_text().strip())


def test_a_call_without_cluster_action_is_refused_and_a_broker_identity_commits(auth_cluster):
    dc = shard_stub(auth_cluster, 0)
    tid = new_topic_id()
    create = pb.DisklessCreatePartitionsRequest(topics=[pb.DisklessCreatablePartitions(
        topic_id=tid, name="authd", num_partitions=1)])
    with pytest.raises(grpc.RpcError) as caught:
        dc.CreatePartitions(create, timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as caught:
        dc.CreatePartitions(create, timeout=10, metadata=bearer_metadata("forged"))
    assert kafka_name(caught.value) == "SASL_AUTHENTICATION_FAILED"

    broker = token(auth_cluster, auth_cluster.state.auth["services"]["replica-1"]["token_file"])
    reply = call_retrying(dc.CreatePartitions, create, metadata=broker)  # the shard may still be loading
    assert reply.topics[0].error_code == 0
    committed = dc.CommitFile(commit_request("wal/auth-1", tid, batches=2), timeout=30, metadata=broker)
    assert [b.assigned_base_offset for b in committed.batches] == [0, 10]


def test_a_framed_commit_needs_cluster_action_too(auth_cluster):
    tid = new_topic_id()
    broker = token(auth_cluster, auth_cluster.state.auth["services"]["replica-2"]["token_file"])
    call_retrying(shard_stub(auth_cluster, 0).CreatePartitions, pb.DisklessCreatePartitionsRequest(topics=[
        pb.DisklessCreatablePartitions(topic_id=tid, name="framed-authd", num_partitions=1)]), metadata=broker)
    store = auth_cluster.metadata_store()
    store.sync()
    address = read_shards(store)[0].framed  # registered by the leader, which has answered
    assert address, "the shard registers its framed listener"
    add_token(store, token="framed-nobody-token", principal="User:nobody")
    body = commit_request("wal/framed-auth-1", tid, batches=2).SerializeToString()

    for metadata, refused in (((), "SASL_AUTHENTICATION_FAILED"),
                              (bearer_metadata("framed-nobody-token"), "CLUSTER_AUTHORIZATION_FAILED")):
        caller = ListenerCaller(tls=None, metadata=metadata)
        try:
            with pytest.raises(LowtideError) as caught:
                caller.call(address, "CommitFile", body, timeout_s=10)
            assert caught.value.name == refused, caught.value
        finally:
            caller.close()
    caller = ListenerCaller(tls=None, metadata=broker)
    try:
        reply = pb.DisklessCommitFileResponse.FromString(caller.call(address, "CommitFile", body, timeout_s=30))
    finally:
        caller.close()
    assert [b.assigned_base_offset for b in reply.batches] == [0, 10]
