"""Bad input on a replica's Kafka listener (hypothesis-generated frames): garbage, truncated frames,
bodies that lie about their array counts, frames over socket.request.max.bytes. Each is answered
with Kafka's error or its connection closed; nothing is written; the listener keeps serving."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowtide.client import Admin
from lowtide.client.admin import OffsetSpec
from lowtide.localcluster import ClusterConfig
from tests.integration import support as s
from tests.integration.conftest import DEFAULT_REPLICA_CONFIG, running_cluster

TOPIC = "victim"


@pytest.fixture(scope="module")
def kcluster(request, tmp_path_factory):
    yield from running_cluster(request, ClusterConfig(data_dir=tmp_path_factory.mktemp("frames"), replicas=1,
                                                      replica_config=dict(DEFAULT_REPLICA_CONFIG)))


@pytest.fixture(scope="module")
def target(kcluster):
    s.create_topic(kcluster, TOPIC, partitions=1, rf=1)
    s.produce(kcluster, TOPIC, [b"x"] * 5)
    host, port = kcluster.services("replica")[0].kafka.rsplit(":", 1)
    return kcluster, (host, int(port))


def _send(address: tuple[str, int], data: bytes) -> bytes:
    """Send raw bytes, half-close, and return whatever comes back before the server closes."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def _api_versions_answered(address: tuple[str, int]) -> bool:
    payload = struct.pack(">hhih", 18, 0, 77, 4) + b"test"
    answer = _send(address, struct.pack(">i", len(payload)) + payload)
    return len(answer) > 10 and struct.unpack_from(">ii", answer)[1] == 77


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _headers(api_key: int, version: int) -> bytes:
    header = struct.pack(">hhih", api_key, version, 1, 3) + b"bad"
    return header + (b"\0" if version >= 9 and api_key == 0 else b"")


garbage = st.binary(min_size=0, max_size=2048).map(_framed)
# A known API and version with a body of random bytes (Produce v3/v9, Fetch v4, DeleteRecords v1).
lying_bodies = st.tuples(st.sampled_from([(0, 3), (0, 9), (1, 4), (21, 1), (3, 1)]),
                         st.binary(max_size=512)).map(lambda t: _framed(_headers(*t[0]) + t[1]))
# Array counts near 2^31 with nothing behind them: must not allocate per claimed element.
huge_counts = st.tuples(st.sampled_from([(0, 3), (21, 1), (3, 1)]), st.integers(2**20, 2**31 - 1)).map(
    lambda t: _framed(_headers(*t[0]) + (struct.pack(">hii", 1, 1000, t[1]) if t[0][0] == 0
                                         else struct.pack(">i", t[1]))))
# A size prefix promising more than is sent (the client then half-closes).
truncated = st.tuples(st.integers(8, 1 << 20), st.binary(max_size=64)).map(
    lambda t: struct.pack(">i", t[0]) + t[1][: max(0, t[0] - 1)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frame=st.one_of(garbage, lying_bodies, huge_counts, truncated))
def test_a_malformed_frame_writes_nothing_and_the_listener_keeps_serving(target, frame):
    _, address = target
    _send(address, frame)  # answered or closed within the socket timeout, never hung
    assert _api_versions_answered(address)


def test_after_the_malformed_frames_the_log_is_untouched_and_requests_are_served(target):
    cluster, address = target
    # (runs after the hypothesis test in file order; with -k alone it still checks a clean start)
    with Admin(cluster.bootstrap) as admin:
        latest = admin.list_offsets({(TOPIC, 0): OffsetSpec.LATEST})[(TOPIC, 0)]
    assert latest.offset == 5
    assert _api_versions_answered(address)


def test_a_frame_over_the_request_size_limit_is_refused_before_it_is_read(target):
    _, address = target
    # 1 GiB announced (limit 100 MiB): closed at once, without waiting for the bytes
    assert _send(address, struct.pack(">i", 1 << 30) + b"\0" * 1024) == b""
    assert _api_versions_answered(address)
