"""Import rules of the ``lowtide`` package (docs/architecture.md#import-rules), checked by walking the imports.

Each package may import only the packages its row names; generated protobuf code (``lowtide_pb``)
only ``lowtide.rpc``, ``lowtide.client`` and the servicer/server modules that register services.
And ``import lowtide.client`` loads exactly the client's own modules: no storage engine, no server
scaffolding, no metrics or health/reflection servers.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[2] / "services"

BASE = {"errors", "clock", "messages"}
# package -> the lowtide packages it may import (besides itself). "errors" and "clock" are modules.
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "clock": set(),
    # The services' messages (one module per service) and the one TopicPartition: plain data that
    # a service's handlers and its clients share, below everything else.
    "messages": {"errors", "clock"},
    "record": BASE,
    # Transport security: certificates, TLS settings, principals from certificates.
    "tls": BASE,
    # ACLs, token digests and SCRAM credentials are sections of the cluster metadata.
    "auth": BASE | {"tls", "metadata"},
    # rpc.wire re-encodes protobuf lengths with record's unsigned varint.
    "rpc": BASE | {"auth", "record", "tls"},
    "client": BASE | {"record", "rpc", "auth", "tls"},
    "log": BASE | {"record"},
    # The metadata store's client dials etcd with the process's own TLS settings (etcds://).
    "metadata": BASE | {"tls"},
    "purgatory": BASE,
    # Diskless topics (KIP-1164): WAL file storage, and the coordinator's domain core over it.
    "objectstore": BASE,
    # One runtime for the internal topics (issue 47): create, route, append (as rpc steps, over the
    # replica client or a transport handed in), fold to the high watermark; below all its users.
    "internal_topics": BASE | {"record", "metadata", "rpc", "client"},
    # The service around it: its metadata log on the replicas (client, record, metadata,
    # internal_topics), the server scaffolding (common, rpc) and CLUSTER_ACTION checks (auth).
    "coordinator": BASE | {"objectstore", "record", "metadata", "rpc", "client", "common", "auth", "leases",
                           "internal_topics"},
    # Diskless topics on the brokers: WAL files in the object store, commits and FindBatches to the
    # shards through the client, the shard registry (coordinator.leadership), topics from metadata.
    "diskless": BASE | {"objectstore", "record", "metadata", "rpc", "client", "coordinator"},
    # The orphan scanner: the object store, coordinator shards through the client, the shard
    # registry and its own registration in the cluster metadata.
    "scanner": BASE | {"objectstore", "rpc", "client", "common", "auth", "metadata"},
    # Kafka's __consumer_offsets records and their fold, shared by the front door and the replicas.
    # Its reading loop is the internal topics' runtime's.
    "groups": BASE | {"record", "internal_topics"},
    # KIP-932 share groups: the share-partition state machine and its __share_group_state records
    # (written through internal_topics, the topic created in the metadata store), the coordinator's
    # ACL checks (auth) and timer (common); groups for Java's String.hashCode.
    "share": BASE | {"record", "internal_topics", "metadata", "rpc", "client", "groups", "auth", "common"},
    # Server scaffolding and the one server bootstrap (access control and own-token metadata
    # from the auth flags every server takes).
    "common": BASE | {"rpc", "auth", "tls", "metadata", "purgatory"},
    "replica": BASE | {"record", "log", "metadata", "purgatory", "rpc", "client", "common", "auth",
                        "groups", "diskless", "kafka", "internal_topics", "share"},
    "frontdoor": BASE | {"metadata", "purgatory", "auth", "rpc", "client", "common", "groups", "record", "diskless",
                         "leases", "kafka", "tls", "internal_topics", "share"},
    # The Kafka protocol listener: it translates Kafka messages to lowtide.messages types and calls
    # the replica's handlers and the front door's objects (Call.front); never the log itself.
    # record: record.varint, the Produce codec's unsigned varints (batches stay bytes), and
    # record.compression, which inflates KIP-714 telemetry pushes. observability: the process's
    # client telemetry store, which the telemetry handlers fill and /metrics exports.
    "kafka": BASE | {"rpc", "common", "metadata", "tls", "record", "observability"},
    # Leader leases (Redis keys or Kubernetes Leases): their flags come from the server scaffolding.
    "leases": BASE | {"common"},
    "localcluster": BASE | {"rpc", "client", "common", "metadata", "auth", "observability", "tls", "purgatory"},
    # Dashboards, rules and the local Prometheus: plain data and a process, nothing of the servers.
    "observability": BASE | {"common"},
    # The Spark data source is a client: it may not reach into servers or the storage engine.
    "spark": BASE | {"record", "rpc", "client", "auth", "tls"},
    "cli": BASE | {"record", "rpc", "client", "common", "auth", "localcluster", "replica", "frontdoor",
                   "metadata", "spark", "tls", "log"},
}
# The metadata port (docs/design/metadata.md): one module talks to etcd, and outside lowtide.metadata
# nobody reaches past the store to its client or image.
ETCD_CLIENT_MODULE = "metadata/etcd.py"
METADATA_PORT_INTERNALS = {"etcd", "image"}
# Modules (besides lowtide.rpc.* and lowtide.client.*) allowed to import generated code: the gRPC
# servicers and servers (and lowtide/replica/registration.py, which registers the Replica servicer
# with its own Produce deserializer). The Kafka protocol listener imports none at all, its server
# module included: its handlers call domain objects with lowtide.messages types (issue 47).
PROTOBUF_MODULE_NAMES = {"servicer", "server", "registration"}
PROTOBUF_FREE_PACKAGES = {"kafka"}
# What ``import lowtide.client`` may load, and what it must not.
CLIENT_MODULES = {
    "lowtide", "lowtide.errors", "lowtide.clock", "lowtide.messages", "lowtide.messages.admin",
    "lowtide.messages.group_configs",
    "lowtide.record", "lowtide.record.batch", "lowtide.record.compression", "lowtide.record.validate",
    "lowtide.record.varint", "lowtide.record.walk", "lowtide.record._validate", "lowtide.record.columns",
    "lowtide.record._columns",
    "lowtide.rpc", "lowtide.rpc.channels", "lowtide.rpc.messages", "lowtide.rpc.status",
    "lowtide.rpc.wire",
    "lowtide.rpc.convert", "lowtide.rpc.convert.acls", "lowtide.rpc.convert.scram", "lowtide.messages.acls",
    "lowtide.auth", "lowtide.auth.acl",
    "lowtide.client", "lowtide.client.admin", "lowtide.client.consumer", "lowtide.client.metadata",
    "lowtide.client.partitioner", "lowtide.client.producer", "lowtide.client.replica", "lowtide.messages.replica",
    "lowtide.client.transactions", "lowtide.tls", "lowtide.tls.config",
}
# grpcio's own __init__ imports the bare grpc_health / grpc_reflection packages for backwards
# compatibility; the servers inside them are what a client must not load.
FORBIDDEN_FOR_CLIENT = {"prometheus_client", "grpc_health.v1.health", "grpc_reflection.v1alpha.reflection",
                        "redis", "lowtide.log", "lowtide.common.server", "lowtide.replica", "lowtide.frontdoor"}


def imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import statement in a file, at any depth."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return names


def find_violations(root: Path) -> list[str]:
    """Every import under ``root/lowtide`` that breaks a rule, as ``path:line: message``."""
    violations = []
    for path in sorted((root / "lowtide").rglob("*.py")):
        rel = path.relative_to(root / "lowtide")
        package = rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 or rel.stem != "__init__" else ""
        if not package:
            continue
        for line, name in imported_names(path):
            parts = name.split(".")
            where = f"{path.relative_to(root)}:{line}"
            if parts[0] == "lowtide_pb" and len(parts) > 1 and parts[1].startswith("etcd_rpc"):
                if rel.as_posix() != ETCD_CLIENT_MODULE:
                    violations.append(f"{where}: only lowtide/{ETCD_CLIENT_MODULE} talks to etcd ({name})")
            elif parts[0] == "lowtide_pb":
                if package in PROTOBUF_FREE_PACKAGES:
                    violations.append(f"{where}: lowtide.{package} imports no generated code ({name})")
                elif package not in ("rpc", "client") and path.stem not in PROTOBUF_MODULE_NAMES:
                    violations.append(f"{where}: only rpc/, client/ and servicers import generated code ({name})")
            elif parts[0] == "lowtide" and len(parts) > 2 and parts[1] == "metadata" and \
                    parts[2] in METADATA_PORT_INTERNALS and package != "metadata":
                violations.append(f"{where}: only lowtide.metadata uses its etcd client and image ({name}); "
                                  "go through lowtide.metadata.store")
            elif parts[0] == "lowtide" and len(parts) > 1:
                target = parts[1]
                if target == package or (root / "lowtide" / target).exists() is False and \
                        not (root / "lowtide" / f"{target}.py").exists():
                    continue  # an own module, or a name imported from the lowtide package itself
                if target not in MAY_IMPORT.get(package, set()):
                    violations.append(f"{where}: lowtide.{package} may not import lowtide.{target}")
    return violations


# The packages that run servers (or their domain code): they call other services through
# lowtide.client's callers (gRPC) or lowtide.rpc.framed's (the framed transport), but take every
# message type from lowtide.messages.
SERVER_PACKAGES = {"replica", "frontdoor", "coordinator", "diskless", "scanner", "kafka", "groups", "common",
                   "log", "metadata", "purgatory", "objectstore", "leases", "observability", "internal_topics", "share"}


def _message_types(path: Path) -> set[str]:
    """Top-level dataclasses and NamedTuples of a module: message types, not callers."""
    names = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.ClassDef):
            decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
            bases = {ast.unparse(b) for b in node.bases}
            if "dataclass" in decorators or "NamedTuple" in bases:
                names.add(node.name)
    return names


def _defined_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def find_client_type_imports(root: Path) -> list[str]:
    """Server-side imports of a message type from ``lowtide.client`` (or of a name the client
    module only re-exports), as ``path:line: message``."""
    violations = []
    for path in sorted((root / "lowtide").rglob("*.py")):
        rel = path.relative_to(root / "lowtide")
        if len(rel.parts) < 2 or rel.parts[0] not in SERVER_PACKAGES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.startswith("lowtide.client.")):
                continue
            source = root / (node.module.replace(".", "/") + ".py")
            if not source.exists():  # a package (lowtide.client.frontdoor): its __init__
                source = root / node.module.replace(".", "/") / "__init__.py"
            defined, messages = _defined_names(source), _message_types(source)
            for alias in node.names:
                where = f"{path.relative_to(root)}:{node.lineno}"
                if alias.name in messages or alias.name not in defined:
                    violations.append(f"{where}: {alias.name} is a message type: import it from lowtide.messages")
    return violations


# The framed transport (issue 47): the servers that talk to each other's framed listeners take
# its callers and connections from lowtide.rpc.framed, never through the public client.
FRAMED_TRANSPORT = "rpc/framed"
FRAMED_CALLERS_PACKAGES = {"replica", "coordinator"}


def _public_classes_and_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text(), filename=str(path)).body
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and not node.name.startswith("_")}


def find_framed_calls_through_the_client(root: Path) -> list[str]:
    """Imports in ``FRAMED_CALLERS_PACKAGES`` of a ``lowtide.client.framed`` module, or of a class
    or function the framed transport defines from any ``lowtide.client`` module (a re-export), as
    ``path:line: message``."""
    framed = set().union(set(), *(_public_classes_and_functions(path)
                                  for path in (root / "lowtide" / FRAMED_TRANSPORT).glob("*.py")))
    violations = []
    for package in sorted(FRAMED_CALLERS_PACKAGES):
        for path in sorted((root / "lowtide" / package).rglob("*.py")):
            for line, name in imported_names(path):
                parts = name.split(".")
                if parts[:2] != ["lowtide", "client"]:
                    continue
                where = f"{path.relative_to(root)}:{line}"
                if len(parts) > 2 and parts[2] == "framed":
                    violations.append(f"{where}: lowtide.{package} takes the framed transport from "
                                      f"lowtide.rpc.framed, not the client ({name})")
                elif parts[-1] in framed:
                    violations.append(f"{where}: {parts[-1]} is the framed transport's: import it from "
                                      "lowtide.rpc.framed")
    return violations


def test_the_replicas_and_coordinators_take_the_framed_transport_from_rpc_framed_not_the_client(tmp_path):
    assert find_framed_calls_through_the_client(SERVICES) == []
    # The checker's own negative case: a client module of the old layout, and a framed caller
    # re-exported by a client module, are caught; the framed package and a gRPC client are not.
    for name in ("rpc/framed", "client", "coordinator", "replica"):
        (tmp_path / "lowtide" / name).mkdir(parents=True)
    (tmp_path / "lowtide" / "rpc" / "framed" / "callers.py").write_text(
        "class ListenerProducer:\n    pass\n\n\nclass ListenerCaller:\n    pass\n")
    (tmp_path / "lowtide" / "coordinator" / "metadata_log.py").write_text(
        "from lowtide.client.framed import ListenerProducer\nfrom lowtide.client.diskless import ListenerCaller\n"
        "from lowtide.client.replica import ReplicaClient\n")
    (tmp_path / "lowtide" / "replica" / "fetcher.py").write_text(
        "import lowtide.client.framed\nfrom lowtide.rpc.framed.callers import ListenerProducer\n")
    assert find_framed_calls_through_the_client(tmp_path) == [
        "lowtide/coordinator/metadata_log.py:1: lowtide.coordinator takes the framed transport from "
        "lowtide.rpc.framed, not the client (lowtide.client.framed.ListenerProducer)",
        "lowtide/coordinator/metadata_log.py:2: ListenerCaller is the framed transport's: import it from "
        "lowtide.rpc.framed",
        "lowtide/replica/fetcher.py:1: lowtide.replica takes the framed transport from lowtide.rpc.framed, not "
        "the client (lowtide.client.framed)",
    ]


def _upward_edges() -> list[str]:
    """Pairs of packages that may import each other, directly or through others (a cycle)."""
    cycles = []
    for start in MAY_IMPORT:
        seen, todo = set(), list(MAY_IMPORT[start])
        while todo:
            package = todo.pop()
            if package == start:
                cycles.append(start)
                break
            if package not in seen:
                seen.add(package)
                todo.extend(MAY_IMPORT.get(package, ()))
    return cycles


def test_the_packages_form_layers_with_no_import_upward():
    # Every package's allowed imports reach only packages below it: no package may import one that
    # (directly or not) may import it back.
    assert _upward_edges() == []
    assert set(MAY_IMPORT) >= {t for targets in MAY_IMPORT.values() for t in targets}
    assert MAY_IMPORT["messages"] <= {"errors", "clock"}


def test_no_server_package_imports_a_message_type_from_the_client():
    assert find_client_type_imports(SERVICES) == []


def test_every_package_imports_only_what_its_rule_allows():
    assert find_violations(SERVICES) == []


def find_core_log_imports_of_the_cleaner(root: Path) -> list[str]:
    """The core log (``lowtide/log/*.py``) importing its cleaner (``lowtide/log/cleaner/``), which
    imports the log: what both need lives in the core (swap_recovery, compacted_keys)."""
    return [f"{path.relative_to(root)}:{line}: the core log may not import its cleaner ({name})"
            for path in sorted((root / "lowtide" / "log").glob("*.py"))
            for line, name in imported_names(path) if name.startswith("lowtide.log.cleaner")]


def test_only_the_cleaner_imports_the_log_not_the_other_way_round(tmp_path):
    assert find_core_log_imports_of_the_cleaner(SERVICES) == []
    (tmp_path / "lowtide" / "log").mkdir(parents=True)
    (tmp_path / "lowtide" / "log" / "segment_set.py").write_text("from lowtide.log.cleaner.swap import x\n")
    assert find_core_log_imports_of_the_cleaner(tmp_path) == [
        "lowtide/log/segment_set.py:1: the core log may not import its cleaner (lowtide.log.cleaner.swap.x)"]


def test_a_forbidden_import_is_reported(tmp_path):
    # The checker's own negative case: a client module reaching into the storage engine, and a
    # domain module importing generated code, are both caught.
    for name in ("client", "log", "replica"):
        (tmp_path / "lowtide" / name).mkdir(parents=True)
        (tmp_path / "lowtide" / name / "__init__.py").write_text("")
    (tmp_path / "lowtide" / "__init__.py").write_text("")
    (tmp_path / "lowtide" / "client" / "bad.py").write_text("from lowtide.log.partition_log import PartitionLog\n")
    (tmp_path / "lowtide" / "replica" / "manager.py").write_text("def f():\n    from lowtide_pb import replica_pb2\n")
    assert find_violations(tmp_path) == [
        "lowtide/client/bad.py:1: lowtide.client may not import lowtide.log",
        "lowtide/replica/manager.py:2: only rpc/, client/ and servicers import generated code "
        "(lowtide_pb.replica_pb2)",
    ]


def test_a_message_type_imported_from_the_client_is_reported(tmp_path):
    # The checker's own negative case: a server module taking a dataclass from a client module, or
    # a name the client module only imports itself, is caught; the client's callers are not.
    for name in ("client", "frontdoor"):
        (tmp_path / "lowtide" / name).mkdir(parents=True)
    (tmp_path / "lowtide" / "client" / "replica.py").write_text(
        "from dataclasses import dataclass\nfrom lowtide.messages.replica import FetchPosition\n\n\n"
        "@dataclass\nclass Answer:\n    x: int\n\n\nclass ReplicaClient:\n    pass\n")
    (tmp_path / "lowtide" / "frontdoor" / "fanout.py").write_text(
        "from lowtide.client.replica import Answer, FetchPosition, ReplicaClient\n")
    assert find_client_type_imports(tmp_path) == [
        "lowtide/frontdoor/fanout.py:1: Answer is a message type: import it from lowtide.messages",
        "lowtide/frontdoor/fanout.py:1: FetchPosition is a message type: import it from lowtide.messages",
    ]


def test_importing_the_client_loads_only_the_client_side_modules():
    code = ("import json, sys, lowtide.client; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('lowtide', 'prometheus_client', 'grpc_health', 'grpc_reflection', 'redis'))))")
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                           text=True).stdout))
    lowtide_modules = {m for m in loaded if m.split(".")[0] == "lowtide"}
    assert lowtide_modules == CLIENT_MODULES
    assert not {m for m in loaded for f in FORBIDDEN_FOR_CLIENT if m == f or m.startswith(f + ".")}


def test_only_the_metadata_port_talks_to_etcd_and_a_bypass_is_reported(tmp_path):
    for name in ("metadata", "replica"):
        (tmp_path / "lowtide" / name).mkdir(parents=True)
        (tmp_path / "lowtide" / name / "__init__.py").write_text("")
    (tmp_path / "lowtide" / "__init__.py").write_text("")
    (tmp_path / "lowtide" / "metadata" / "etcd.py").write_text("from lowtide_pb import etcd_rpc_pb2\n")
    (tmp_path / "lowtide" / "metadata" / "store.py").write_text("from lowtide_pb import etcd_rpc_pb2_grpc\n")
    (tmp_path / "lowtide" / "replica" / "reconcile.py").write_text("from lowtide.metadata.etcd import EtcdClient\n")
    assert find_violations(tmp_path) == [
        "lowtide/metadata/store.py:1: only lowtide/metadata/etcd.py talks to etcd (lowtide_pb.etcd_rpc_pb2_grpc)",
        "lowtide/replica/reconcile.py:1: only lowtide.metadata uses its etcd client and image "
        "(lowtide.metadata.etcd.EtcdClient); go through lowtide.metadata.store"]


# The only modules that import a Redis client (issue 51 moved the cluster's state to the metadata
# store): the purgatory, whose timers and low-watermark events are Redis's job by design, and the
# readers of the layouts of releases before etcd, for migrations (they never write cluster state).
REDIS_ALLOWED = {"purgatory/purgatory.py", "purgatory/events.py", "purgatory/connection.py",
                 # `lowtide metadata migrate --from-redis`
                 "metadata/legacy_redis.py",
                 # the group offsets kept in Redis before __consumer_offsets, moved once by a front door
                 "frontdoor/groups/offsets_migration.py"}


def modules_importing_redis(root: Path) -> set[str]:
    return {path.relative_to(root / "lowtide").as_posix() for path in (root / "lowtide").rglob("*.py")
            if any(name == "redis" or name.startswith("redis.") for _, name in imported_names(path))}


def test_no_module_outside_the_allowed_ones_imports_a_redis_client(tmp_path):
    found = modules_importing_redis(SERVICES)
    assert found - REDIS_ALLOWED == set()
    assert REDIS_ALLOWED - found == set(), "no longer imports Redis: take it off REDIS_ALLOWED"
    assert "metadata/store.py" not in found and "metadata/cache.py" not in found
    (tmp_path / "lowtide" / "replica").mkdir(parents=True)
    (tmp_path / "lowtide" / "replica" / "reconcile.py").write_text("import redis as redis_lib\n")
    assert modules_importing_redis(tmp_path) == {"replica/reconcile.py"}
