"""ACLs on a cluster with authorization on: bearer tokens, DELETE on TOPIC for DeleteRecords.

The two tests with authorization on share one such cluster (a cluster start is seconds of CPU), each
with topics and principals of its own; the third uses the worker's shared cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from lowtide.auth.tokens import add_token
from lowtide.localcluster import ClusterConfig, LocalCluster
from lowtide_pb import admin_pb2
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

ADMIN_TOKEN = "admin-secret"


@pytest.fixture(scope="module")
def auth_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Authorization on, no coordinators; tokens from a file: User:admin (a super user) and User:alice."""
    directory = tmp_path_factory.mktemp("authz")
    tokens = directory / "tokens"
    tokens.write_text(f"{ADMIN_TOKEN} User:admin\nalice-secret User:alice\n")
    yield from running_cluster(request, ClusterConfig(
        data_dir=directory / "cluster", replicas=3, coordinators=0, replica_config=dict(DEFAULT_REPLICA_CONFIG),
        auth_enabled=True, tokens_file=tokens, super_users="User:admin"))


def test_delete_records_needs_delete_on_the_topic_and_splits_authorised_from_unauthorised_partitions(
        auth_cluster, tmp_path):
    cluster = auth_cluster
    admin_cfg = tmp_path / "admin.properties"
    admin_cfg.write_text("lowtide.auth.token=admin-secret\n")
    alice_cfg = tmp_path / "alice.properties"
    alice_cfg.write_text("# alice may delete from 'granted' only\nlowtide.auth.token=alice-secret\n")
    admin_md = [("authorization", "Bearer admin-secret")]

    for topic in ("granted", "denied"):
        s.cli_json("topics", "create", "--bootstrap-server", cluster.bootstrap, "--topic", topic,
                   "--partitions", "1", "--replication-factor", "3", "--command-config", str(admin_cfg))
        s.wait_until(lambda t=topic: s.produce(cluster, t, [b"x"] * 10, metadata=admin_md).error_code == 0,
                     what=f"{topic} writable")
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", str(admin_cfg),
               "--principal", "User:alice", "--operation", "delete", "--topic", "granted")
    s.wait_acls_in_force()

    spec = tmp_path / "delete.json"
    spec.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "granted", "partition": 0, "offset": 5}, {"topic": "denied", "partition": 0, "offset": 5}]}))
    proc = s.lowtide_cli("delete-records", "--bootstrap-server", cluster.bootstrap, "--offset-json-file", str(spec),
                         "--command-config", str(alice_cfg), "--output", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one partition failed
    out = {p["topic"]: p for p in json.loads(proc.stdout)["partitions"]}
    assert out["granted"]["low_watermark"] == 5
    assert out["denied"]["error"] == "TOPIC_AUTHORIZATION_FAILED"
    for r in (0, 1, 2):
        assert s.describe(cluster, r, "denied", metadata=admin_md).log_start_offset == 0

    # no token at all: unauthenticated callers are denied per partition, nothing moves
    # (docs/design/kip-107-delete-records.md#request-and-answers)
    [anon] = s.delete_records(cluster, [("granted", 0, 8)])
    assert anon.error_code == 29 and anon.low_watermark == -1
    # a token nobody issued is refused outright
    try:
        s.delete_records(cluster, [("granted", 0, 8)], metadata=[("authorization", "Bearer forged")])
        raise AssertionError("a forged token must be refused")
    except s.grpc.RpcError as err:
        assert err.code() == s.grpc.StatusCode.UNAUTHENTICATED
        assert "SASL_AUTHENTICATION_FAILED" in err.details()
    assert s.describe(cluster, s.leader_of(cluster, "granted"), "granted", metadata=admin_md).log_start_offset == 5
    # the super user may delete anything
    [ok] = s.delete_records(cluster, [("denied", 0, 8)], metadata=admin_md)
    assert (ok.error_code, ok.low_watermark) == (0, 8)


def test_delete_records_tool_prints_low_watermarks_and_exits_nonzero_on_any_failure(shared_cluster, tmp_path):
    cluster = shared_cluster  # faults nothing; its topic is its own
    s.create_topic(cluster, "authz-cli", partitions=2, rf=3)
    for p in (0, 1):
        assert s.produce(cluster, "authz-cli", [b"x"] * 10, partition=p).error_code == 0
    spec = tmp_path / "d.json"
    spec.write_text('{"partitions":[{"topic":"authz-cli","partition":0,"offset":4},'
                    '{"topic":"authz-cli","partition":1,"offset":-1}],"version":1}')
    proc = s.lowtide_cli("delete-records", "--bootstrap-server", cluster.bootstrap, "--offset-json-file", str(spec))
    assert proc.returncode == 0, proc.stderr
    assert "partition: authz-cli-0\tlow_watermark: 4" in proc.stdout
    assert "partition: authz-cli-1\tlow_watermark: 10" in proc.stdout

    bad = tmp_path / "bad.json"
    bad.write_text('{"partitions":[{"topic":"authz-cli","partition":0,"offset":99}],"version":1}')
    out = s.cli_json("delete-records", "--bootstrap-server", cluster.bootstrap, "--offset-json-file", str(bad),
                     ok=False)
    assert out["partitions"][0]["error"] == "OFFSET_OUT_OF_RANGE"

    broken = tmp_path / "broken.json"
    broken.write_text('{"partitions": [')
    proc = s.lowtide_cli("delete-records", "--bootstrap-server", cluster.bootstrap, "--offset-json-file",
                         str(broken), "--output", "json")
    assert proc.returncode != 0
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "INVALID_REQUEST" and str(broken) in err["message"]
    assert s.describe(cluster, s.leader_of(cluster, "authz-cli"), "authz-cli").log_start_offset == 4


def test_with_auth_on_anonymous_callers_see_no_topic_and_users_only_topics_they_may_describe(
        auth_cluster, tmp_path):
    cluster = auth_cluster
    admin_cfg = str(tmp_path / "admin.properties")
    (tmp_path / "admin.properties").write_text(f"lowtide.auth.token={ADMIN_TOKEN}\n")
    for topic in ("visible", "listed-by-prefix", "hidden"):
        s.cli_json("topics", "create", "--bootstrap-server", cluster.bootstrap, "--topic", topic,
                   "--partitions", "1", "--replication-factor", "1", "--command-config", admin_cfg)
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", admin_cfg,
               "--principal", "User:carol", "--operation", "read", "--topic", "visible")
    s.cli_json("acls", "add", "--bootstrap-server", cluster.bootstrap, "--command-config", admin_cfg,
               "--principal", "User:carol", "--operation", "describe", "--topic", "listed-",
               "--resource-pattern-type", "prefixed")
    s.wait_acls_in_force()
    add_token(s.store(cluster), token="carol-token", principal="User:carol")
    carol = [("authorization", "Bearer carol-token")]
    stub = s.admin(cluster)

    # no token: User:ANONYMOUS, who may DESCRIBE nothing, sees no topic (as Kafka filters Metadata)
    assert list(stub.ListTopics(admin_pb2.ListTopicsRequest()).names) == []
    assert list(stub.Metadata(admin_pb2.MetadataRequest()).topics) == []
    assert [t.error_code for t in stub.Metadata(admin_pb2.MetadataRequest(topics=["visible"])).topics] == [29]
    # a token nobody issued is refused outright
    for call in (lambda md: stub.ListTopics(admin_pb2.ListTopicsRequest(), metadata=md),
                 lambda md: stub.Metadata(admin_pb2.MetadataRequest(), metadata=md)):
        try:
            call([("authorization", "Bearer forged")])
            raise AssertionError("a forged token must be refused")
        except s.grpc.RpcError as err:
            assert err.code() == s.grpc.StatusCode.UNAUTHENTICATED, err.details()

    assert list(stub.ListTopics(admin_pb2.ListTopicsRequest(), metadata=carol).names) == [
        "listed-by-prefix", "visible"]
    assert [t.name for t in stub.Metadata(admin_pb2.MetadataRequest(), metadata=carol).topics] == [
        "listed-by-prefix", "visible"]
    named = stub.Metadata(admin_pb2.MetadataRequest(topics=["hidden", "no-such-topic", "visible"]),
                          metadata=carol).topics
    assert [(t.name, t.error_code, len(t.partitions)) for t in named] == [
        ("hidden", 29, 0), ("no-such-topic", 29, 0), ("visible", 0, 1)]
    carol_cfg = tmp_path / "carol.properties"
    carol_cfg.write_text("lowtide.auth.token=carol-token\n")
    assert s.cli_json("topics", "list", "--bootstrap-server", cluster.bootstrap,
                      "--command-config", str(carol_cfg))["topics"] == ["listed-by-prefix", "visible"]
    # the admin (super user) still sees everything, the other test's topics too
    everything = s.cli_json("topics", "list", "--bootstrap-server", cluster.bootstrap,
                            "--command-config", admin_cfg)["topics"]
    assert {"hidden", "listed-by-prefix", "visible"} <= set(everything), everything
