"""A partition the metadata no longer names is set aside and kept, never served; a topic deleted
through the API is still removed at once (issue 51, docs/design/metadata.md#stray-partitions)."""

from __future__ import annotations

import json
import os

from lowtide_pb import admin_pb2
from tests.integration.support import admin, create_topic, etcd_client, lowtide_cli, produce, store
from tests.waiting import wait_until

TOPIC = "goner"


def _dirs(data_dir: str) -> set[str]:
    return {e.name for e in os.scandir(data_dir) if e.is_dir() and e.name.startswith(TOPIC)}


def test_a_topic_deleted_while_a_replica_was_down_with_no_record_left_is_set_aside_there_not_deleted(
        cluster_factory) -> None:
    cluster = cluster_factory()
    create_topic(cluster, TOPIC, partitions=1, rf=3)
    assert produce(cluster, TOPIC, [b"kept-%d" % i for i in range(100)], acks=-1).error_code == 0
    victim = cluster.service("replica-2")
    cluster.kill("replica-2")

    resp = admin(cluster).DeleteTopics(admin_pb2.DeleteTopicsRequest(names=[TOPIC]))
    assert all(r.error_code == 0 for r in resp.topics), resp
    # The replicas that were up delete their copies at once (the deletion is on record).
    for name in ("replica-0", "replica-1"):
        wait_until(lambda name=name: _dirs(cluster.service(name).data_dir) == set(), timeout_s=15,
                   what=f"{name} deleted {TOPIC}-0")

    # The record of the deletion is gone (kept for a week; here removed by hand), so when the
    # crashed replica comes back nothing vouches for deleting what it holds.
    metadata = store(cluster)
    client = etcd_client(cluster, metadata.client.endpoints)
    try:
        assert client.delete_prefix(metadata.root + "deleted_topics/") == 1
    finally:
        client.close()
    cluster.start_service("replica-2")
    wait_until(lambda: any(n.endswith("-stray") for n in _dirs(victim.data_dir)), timeout_s=30,
               what="replica-2 set its copy aside")
    [stray] = _dirs(victim.data_dir)
    assert stray.startswith(f"{TOPIC}-0.")
    assert any(f.endswith(".log") and os.path.getsize(os.path.join(victim.data_dir, stray, f)) > 0
               for f in os.listdir(os.path.join(victim.data_dir, stray)))

    # The operator sees it, and removes it.
    listed = json.loads(lowtide_cli("strays", "list", "--data-dir", victim.data_dir, "--output", "json").stdout)
    assert [(s["topic"], s["partition"]) for s in listed["strays"]] == [(TOPIC, 0)]
    removed = lowtide_cli("strays", "remove", "--data-dir", victim.data_dir, "--all", "--output", "json")
    assert removed.returncode == 0, removed.stderr
    assert _dirs(victim.data_dir) == set()
