"""Fixtures shared by every test: real processes, never mocks."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import uuid
from pathlib import Path

import pytest
import redis as redis_lib

from lowtide.common.procs import PORT_RANGE_ENV, EtcdMember, start_etcd, start_redis
from lowtide.errors import MetadataStoreUnavailable
from lowtide.metadata.etcd import EtcdClient
from lowtide.metadata.store import DEFAULT_ROOT, MetadataStore
from tests import cpu_report, kafka_tools

# Each pytest-xdist worker ("gw0", "gw1", ...) picks ports from its own range, below the kernel's
# ephemeral range: parallel workers never race for a port (lowtide.common.procs.find_free_port).
WORKER_PORT_BASE = 10_000
WORKER_PORT_SPAN = 2_000


def pytest_configure(config: pytest.Config) -> None:
    # A skip must name the missing tool; CI installs every tool so nothing skips there.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        index = int(worker[2:])
        lo = WORKER_PORT_BASE + index * WORKER_PORT_SPAN
        # Set before any fixture runs; inherited by every process the tests start.
        os.environ[PORT_RANGE_ENV] = f"{lo}-{lo + WORKER_PORT_SPAN - 1}"
    # pytest-xdist's --dist loadscope re-sorts the modules by their number of tests unless told not
    # to (--loadscope-reorder is on by default): the longest modules, most with two to four tests,
    # then went last and the suite ended with one worker running them while three sat idle. The
    # order of pytest_collection_modifyitems below is the one wanted; keep it.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    cpu_report.register(config)  # opt-in: LOWTIDE_TEST_CPU_OUT (tests/cpu_report.py)
    use_short_lived_spark_jvms()
    # Local clusters' services are forks of one interpreter that imported them: a cluster start costs
    # 3 CPU-s instead of 13, and the suite starts about eighty (lowtide/localcluster/forkserver.py).
    os.environ.setdefault("LOWTIDE_LOCALCLUSTER_FORK", "1")


# Every Spark JVM the suite starts (pytest's own sessions, spark-jobs/*.py and the demo as child
# processes, plain PySpark in test_spark_kafka_connector) lives for seconds to a minute on tiny data:
# HotSpot's C2 compiler and G1's threads spend CPU that never pays back. C1 only and the serial GC cut
# a session's start and first queries from 16-19 to 10 CPU-s (measured alone); Kafka's tools here
# run the same way (scripts/kafka_tools.sh). Through Spark's own knobs, not lowtide's code: users'
# jobs keep the JVM's defaults. PYSPARK_SUBMIT_ARGS is how PySpark passes spark-submit arguments to
# the JVM it launches; spark.driver.defaultJavaOptions goes before lowtide's extraJavaOptions (log4j);
# SPARK_LAUNCHER_OPTS is for the short launcher JVM that builds the driver's command line.
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_class_archive() -> str:
    """The driver JVM options mapping the class archive ``make kafka-tools`` made for the installed
    PySpark and java (``build_spark_class_archive`` in scripts/kafka_tools.sh; "" when there is
    none): a driver's start-up then costs about a third less CPU (23 to 16 CPU-s for a session and a
    query, measured alone), and the suite starts about fifteen. The JVM ignores an archive that does
    not match its build or class path (a warning, sent to stderr with the JVM's other warnings)."""
    try:
        version = importlib.metadata.version("pyspark")  # not an import of pyspark: seconds saved per worker
    except importlib.metadata.PackageNotFoundError:
        return ""
    archive = kafka_tools.cache_dir() / f"spark-kafka-{version}" / "driver.jsa"
    if not archive.is_file() or " " in str(archive):
        return ""
    return f" -XX:SharedArchiveFile={archive} -Xlog:disable -Xlog:all=warning:stderr"


def use_short_lived_spark_jvms() -> None:
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                          f'--conf "spark.driver.defaultJavaOptions={SHORT_LIVED_JVM}{spark_class_archive()}" '
                          'pyspark-shell')
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", SHORT_LIVED_JVM)


# Seconds each of the longest modules took in make test's parallel suite on the 2-core machine
# (per-module wall from tests/cpu_report.py, 2026-11-28, with forked cluster services). The modules
# are handed to the workers longest first (longest-processing-time scheduling), so no long module
# starts when the others are nearly done; a module not named here counts EXPECTED_INTEGRATION_S
# under tests/integration and tests/chaos, 1 s elsewhere, and modules of equal weight keep their
# collection order. Rough figures are enough: only the order matters.
EXPECTED_S = {
    "tests/chaos/test_nemesis_short.py": 135,
    "tests/integration/spark/test_jobs.py": 135,
    "tests/integration/spark/test_source.py": 110,
    "tests/integration/kafka/test_kafka_scram.py": 105,
    "tests/integration/kafka/test_kafka_cli_tools.py": 95,
    "tests/integration/cli/test_demo_and_retention.py": 90,
    "tests/integration/kafka/test_exactly_once_copier.py": 90,
    "tests/integration/kafka/test_kafka_configs.py": 80,
    # Added since (wall in CI's make test, 2026-12-03): without a figure these counted 20 s and went
    # last, so the suite ended on one worker.
    "tests/integration/kafka/test_newest_kafka_clients.py": 90,
    "tests/integration/kafka/test_consumer_group_protocol.py": 80,
    "tests/integration/kafka/test_kafka_reassign_tool.py": 70,
    "tests/integration/metadata/test_store_away.py": 65,
    "tests/integration/kafka/test_share_groups.py": 110,
    "tests/integration/kafka/test_consumer_group_migration.py": 70,
    "tests/integration/diskless/test_diskless_transactions.py": 60,
    "tests/integration/cli/test_honest_cli.py": 75,
    "tests/integration/kafka/test_kafka_acls.py": 55,
    "tests/chaos/test_kafka_idempotence_short.py": 55,
    "tests/integration/diskless/test_diskless_topics.py": 50,
    "tests/integration/objectstore/test_s3.py": 45,
    "tests/integration/kafka/test_spark_kafka_connector.py": 45,
    "tests/integration/spark/test_auto_register.py": 45,
    "tests/chaos/test_schedules.py": 45,
    "tests/integration/leases/test_kubernetes_lease.py": 40,
    "tests/integration/scanner/test_orphan_scanner.py": 40,
    "tests/integration/scanner/test_scan_race.py": 40,
    "tests/integration/test_local_cluster.py": 35,
    "tests/integration/kafka/test_kafka_transactions_tool.py": 30,
    "tests/integration/replica/test_replication_stream.py": 30,
    "tests/integration/cli/test_produce_fits_topic.py": 30,
    "tests/integration/coordinator/test_snapshot_restore.py": 30,
    "tests/integration/kafka/test_kafka_tls.py": 25,
    "tests/integration/replica/test_consumed_retention.py": 25,
    "tests/integration/diskless/test_diskless_s3.py": 25,
}
EXPECTED_INTEGRATION_S = 20


def expected_s(module: str) -> float:
    if module in EXPECTED_S:
        return EXPECTED_S[module]
    return EXPECTED_INTEGRATION_S if module.startswith(("tests/integration/", "tests/chaos/")) else 1


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--repeat", type=int, default=1, metavar="N",
                     help="run each selected test N times (a rare race, such as the zombie-shard "
                          "scenario, run hundreds of times alongside the suite: docs/testing.md)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    repeat = metafunc.config.getoption("repeat")
    if repeat > 1:
        metafunc.fixturenames.append("repeat_index")
        metafunc.parametrize("repeat_index", range(repeat), indirect=True, ids=lambda i: f"run{i + 1}")


@pytest.fixture
def repeat_index(request: pytest.FixtureRequest) -> int:
    """Which of ``--repeat N`` runs this is (0 without the option)."""
    return getattr(request, "param", 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -expected_s(item.nodeid.split("::", 1)[0]))  # stable: a module stays whole


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A real redis-server on a free loopback port for the whole session."""
    if shutil.which("redis-server") is None and not shutil.which("/usr/bin/redis-server"):
        pytest.skip("redis-server is not installed (apt-get install redis-server; make setup does it)")
    proc = start_redis(tmp_path_factory.mktemp("redis"), appendonly=False)
    yield proc
    proc.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """A clean Redis database for one test."""
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


def require_etcd() -> None:
    """Skip (naming the tool) when etcd is not installed; CI installs it."""
    if shutil.which("etcd") is None and not os.path.exists("/usr/sbin/etcd"):
        pytest.skip("etcd is not installed (apt-get install etcd-server; make setup does it)")


def start_ready_etcd(data_dir: Path, **kwargs) -> list[EtcdMember]:
    """``start_etcd``, then wait until the members serve a linearizable read (they elected a
    leader): start_etcd returns once the ports listen, a second or so before that."""
    require_etcd()
    members = start_etcd(data_dir, **kwargs)
    client = EtcdClient([m.endpoint for m in members], timeout_s=20.0)
    try:
        client.revision()
    finally:
        client.close()
    return members


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory):
    """A real one-member etcd on free loopback ports for the whole session (under pytest-xdist:
    one per worker, each on its worker's ports)."""
    [member] = start_ready_etcd(tmp_path_factory.mktemp("etcd"))
    yield member
    member.stop()


@pytest.fixture
def metadata_store(etcd_server):
    """A ``MetadataStore`` on the session's etcd under a root of its own (``/t<uuid>/``): tests
    never see each other's keys. Its keys are deleted afterwards, so that leases it took (broker
    sessions, deleted-topic records) do not delete keys, and move etcd's revision, during later
    tests."""
    store = MetadataStore(client=EtcdClient([etcd_server.endpoint]), root=f"/t{uuid.uuid4().hex}/")
    yield store
    try:
        store.client.delete_prefix(store.root, timeout_s=2.0)
    except MetadataStoreUnavailable:  # a test that broke the connection on purpose: nothing to tidy
        pass
    store.close()


@pytest.fixture
def metadata_url(etcd_server) -> str:
    """The session's etcd for services built from a URL (they use the default root), emptied of
    the metadata the previous test left there."""
    client = EtcdClient([etcd_server.endpoint])
    try:
        client.delete_prefix(DEFAULT_ROOT)
    finally:
        client.close()
    return f"etcd://{etcd_server.endpoint}"
