"""Local-cluster configuration: --config parsing, ClusterConfig, per-kind argv, the CLI's flags, and
the planning of names/ports/data dirs. Nothing here starts a process."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from lowtide.cli import cluster_cmd
from lowtide.cli.output import CliError
from lowtide.localcluster import KINDS, ClusterConfig, InstanceContext, LocalCluster, parse_config_pairs
from lowtide.localcluster.config import COORDINATOR_MODULE, default_coordinators, is_module_available
from lowtide.localcluster.kinds import REPLICA_MODULE, supported_flags


def kind(name: str):
    return next(k for k in KINDS if k.kind == name)


def test_parse_config_pairs() -> None:
    assert parse_config_pairs(None) == {}
    assert parse_config_pairs(["segment.bytes=65536", " retention.ms = 10 "]) == {
        "segment.bytes": "65536", "retention.ms": "10"}
    assert parse_config_pairs(["a=x=y"]) == {"a": "x=y"}, "values may contain '='"
    assert parse_config_pairs(["a=1", "a=2"]) == {"a": "2"}, "the last one wins"
    assert parse_config_pairs(["a="]) == {"a": ""}


@pytest.mark.parametrize("bad", ["segment.bytes", "=5", " =5", ""])
def test_parse_config_pairs_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="key=value"):
        parse_config_pairs([bad])


def test_cluster_config_defaults_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = ClusterConfig(data_dir=Path("rel"))
    assert config.data_dir == tmp_path / "rel"
    assert (config.replicas, config.frontdoors) == (3, 1)
    assert config.coordinators == default_coordinators() == (2 if is_module_available(COORDINATOR_MODULE) else 0)
    assert config.object_store_url == (tmp_path / "rel" / "objects").as_uri()
    assert config.object_store_url.startswith("file:///")
    config.validate()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("replicas", 0, "replicas must be >= 1"),
    ("frontdoors", 0, "frontdoors must be >= 1"),
    ("coordinators", -1, "coordinators must be >= 0"),
    ("session_timeout_ms", 0, "session_timeout_ms must be > 0"),
    ("tokens_file", Path("/no/such/tokens"), "does not exist"),
])
def test_cluster_config_validate_rejects(tmp_path: Path, field: str, value: object, message: str) -> None:
    config = ClusterConfig(data_dir=tmp_path, **{field: value})
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_cluster_config_json_round_trip(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("t User:alice\n")
    config = ClusterConfig(data_dir=tmp_path, replicas=5, coordinators=2, replica_config={"segment.bytes": "1"},
                           auth_enabled=True, tokens_file=tokens, super_users="User:admin",
                           session_timeout_ms=3000, extra_env={"X": "1"})
    again = ClusterConfig.from_json(tmp_path, config.to_json())
    assert again == config


def test_replica_argv_passes_broker_settings_as_flags_and_the_rest_as_config(tmp_path: Path) -> None:
    config = ClusterConfig(data_dir=tmp_path, session_timeout_ms=2500,
                           replica_config={"segment.bytes": "65536", "replica.lag.time.max.ms": "3000"})
    ctx = InstanceContext(config=config, index=2, data_dir=tmp_path / "replica-2", redis_url="redis://r:1/0")
    argv = kind("replica").build_argv(ctx, grpc_addr="127.0.0.1:1", metrics_addr="127.0.0.1:2")
    assert argv[:5] == [sys.executable, "-m", "lowtide.cli.main", "serve", "replica"]
    pairs = dict(zip(argv[5::2], argv[6::2], strict=False))
    assert pairs["--grpc-addr"] == "127.0.0.1:1" and pairs["--metrics-addr"] == "127.0.0.1:2"
    assert pairs["--redis-url"] == "redis://r:1/0"
    assert pairs["--id"] == "2" and pairs["--data-dir"] == str(tmp_path / "replica-2")
    assert ["--config", "segment.bytes=65536"] == argv[argv.index("segment.bytes=65536") - 1:][:2]
    if is_module_available(REPLICA_MODULE):
        assert "--replica-lag-time-max-ms" in supported_flags(REPLICA_MODULE)
        assert argv[argv.index("--replica-lag-time-max-ms") + 1] == "3000"
        assert argv[argv.index("--session-timeout-ms") + 1] == "2500"


def _auth_tail(name: str, config: ClusterConfig, *, index: int) -> list[str]:
    ctx = InstanceContext(config=config, index=index, data_dir=config.data_dir / f"{name}-{index}", redis_url="r")
    argv = kind(name).build_argv(ctx, grpc_addr="127.0.0.1:1", metrics_addr="127.0.0.1:2")
    return argv[argv.index("--auth-enabled"):] if "--auth-enabled" in argv else []


@pytest.mark.parametrize("name", ["replica", "frontdoor"])
def test_replica_and_frontdoor_argv_carry_auth_flags_and_their_own_token_file_only_when_asked(
        tmp_path: Path, name: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("")
    assert _auth_tail(name, ClusterConfig(data_dir=tmp_path), index=1) == []
    secured = ClusterConfig(data_dir=tmp_path, auth_enabled=True, tokens_file=tokens, super_users="User:ops")
    assert _auth_tail(name, secured, index=1) == [
        "--auth-enabled", "--tokens-file", str(tokens), "--super-users", "User:ops",
        "--token-file", str(tmp_path / "secrets" / f"{name}-1.token")]


def test_without_a_tokens_file_the_generated_admin_is_added_to_the_super_users(tmp_path: Path) -> None:
    config = ClusterConfig(data_dir=tmp_path, auth_enabled=True, super_users="User:ops")
    assert config.generates_admin and config.effective_super_users == "User:ops,User:admin"
    assert _auth_tail("replica", config, index=0) == [
        "--auth-enabled", "--super-users", "User:ops,User:admin",
        "--token-file", str(tmp_path / "secrets" / "replica-0.token")]
    assert not ClusterConfig(data_dir=tmp_path).generates_admin


def test_coordinator_argv_names_its_shard(tmp_path: Path) -> None:
    ctx = InstanceContext(config=ClusterConfig(data_dir=tmp_path), index=1, data_dir=tmp_path / "coordinator-1",
                          redis_url="")
    assert kind("coordinator").build_flags(ctx) == ["--shard", "1", "--data-dir", str(tmp_path / "coordinator-1"),
                                                    "--shards", str(ctx.config.coordinators)]


def parse_up(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cluster_cmd.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["cluster", "up", *argv])


def test_cli_up_flags_build_the_config(tmp_path: Path) -> None:
    args = parse_up("--data-dir", str(tmp_path), "--replicas", "5", "--coordinators", "2", "--detach",
                    "--config", "segment.bytes=1024", "--config", "retention.ms=5", "--output", "json")
    config = cluster_cmd.build_config(args)
    assert (config.replicas, config.coordinators, config.frontdoors) == (5, 2, 1)
    assert config.replica_config == {"segment.bytes": "1024", "retention.ms": "5"}
    assert args.detach and args.output == "json"
    assert cluster_cmd.build_config(parse_up("--data-dir", str(tmp_path))).coordinators == default_coordinators()


@pytest.mark.parametrize("argv", [["--config", "nokey"], ["--replicas", "0"]])
def test_cli_up_rejects_bad_values(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(CliError) as info:
        cluster_cmd.build_config(parse_up("--data-dir", str(tmp_path), *argv))
    assert info.value.code == "INVALID_CONFIG"


def test_plan_names_ports_and_data_dirs(tmp_path: Path) -> None:
    config = ClusterConfig(data_dir=tmp_path, replicas=3, coordinators=0, orphan_scanners=0)
    skipped: list[str] = []
    plan = LocalCluster(config).plan(progress=skipped.append)
    names = [s.name for s in plan.services]
    assert names[0] == "redis", "redis starts first"
    built = [k.kind for k in KINDS if k.is_available()]
    expected = ["redis", "etcd-0"] + [f"replica-{i}" for i in range(3) if "replica" in built] + (
        ["frontdoor-0"] if "frontdoor" in built else [])
    assert names == expected
    # etcd serves /metrics on its client port: its one address counts once.
    ports = [s.grpc for s in plan.services] + [s.metrics_addr for s in plan.services
                                               if s.metrics_addr and not s.is_etcd]
    assert len(ports) == len(set(ports)), "every address is distinct"
    assert plan.redis == f"redis://{plan.services[0].grpc}/0"
    assert plan.metadata == f"etcd://{plan.find('etcd-0').grpc}"
    for service in plan.services[1:]:
        assert service.log == str(tmp_path / "logs" / f"{service.name}.log")
        assert service.metrics_url == f"http://{service.metrics_addr}/metrics"
        if not service.is_etcd:
            assert plan.redis in service.argv and plan.metadata in service.argv
    if "frontdoor" in built:
        assert plan.bootstrap == plan.find("frontdoor-0").grpc
    if "replica" in built:
        assert plan.find("replica-1").data_dir == str(tmp_path / "replica-1")

    # A later plan over the same directory keeps every (still free) port and argv.
    again = LocalCluster(config).plan(previous=plan)
    assert [s.argv for s in again.services] == [s.argv for s in plan.services]
    assert [s.grpc for s in again.services] == [s.grpc for s in plan.services]


def test_plan_skips_kinds_not_built_yet(tmp_path: Path) -> None:
    from lowtide.localcluster import ServiceKind

    future = ServiceKind(kind="future", module="lowtide.no_such_module.server", count=lambda _c: 2,
                         build_flags=lambda _ctx: [])
    said: list[str] = []
    plan = LocalCluster(ClusterConfig(data_dir=tmp_path, replicas=1), kinds=[future]).plan(progress=said.append)
    assert [s.name for s in plan.services] == ["redis", "etcd-0"]
    assert said == ["skipping future: lowtide.no_such_module.server is not built yet"]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("members", [1, 3])
def test_a_tls_plan_runs_every_etcd_member_on_mutual_tls_with_its_own_certificate(tmp_path: Path,
                                                                                   members: int) -> None:
    config = ClusterConfig(data_dir=tmp_path, replicas=1, coordinators=0, orphan_scanners=0, tls=True,
                           metadata_members=members)
    plan = LocalCluster(config).plan()
    etcd = [s for s in plan.services if s.is_etcd]
    assert [m.name for m in etcd] == [f"etcd-{i}" for i in range(members)]
    assert plan.metadata == "etcds://" + ",".join(m.grpc for m in etcd)
    tls_dir, ca = tmp_path / "tls", str(tmp_path / "tls" / "ca.crt")
    for member in etcd:
        argv, own = member.argv, tls_dir / member.name
        for flag in ("--listen-client-urls", "--advertise-client-urls"):
            assert _flag(argv, flag) == f"https://{member.grpc}", flag
        peer = _flag(argv, "--listen-peer-urls")
        assert peer.startswith("https://127.0.0.1:") and _flag(argv, "--initial-advertise-peer-urls") == peer
        assert _flag(argv, "--initial-cluster") == ",".join(
            f"{m.name}={_flag(m.argv, '--listen-peer-urls')}" for m in etcd)
        assert (_flag(argv, "--cert-file"), _flag(argv, "--key-file"), _flag(argv, "--trusted-ca-file")) == (
            str(own / "tls.crt"), str(own / "tls.key"), ca)
        assert (_flag(argv, "--peer-cert-file"), _flag(argv, "--peer-key-file"),
                _flag(argv, "--peer-trusted-ca-file")) == (str(own / "tls.crt"), str(own / "tls.key"), ca)
        assert "--client-cert-auth" in argv and "--peer-client-cert-auth" in argv
        assert not [a for a in argv if "http://" in a], argv
        # its /metrics (on the client port) is HTTPS too, as cluster.json says
        assert member.metrics_url == f"https://{member.grpc}/metrics"
    services = [s for s in plan.services if not s.is_store]
    assert services, "no lowtide service planned"
    for entry in services:
        # the etcds:// URL, and the service's own certificate as --tls-*: what its EtcdClient presents
        # (ServerBootstrap makes it the process's default client TLS, which etcds:// dials with)
        assert _flag(entry.argv, "--metadata-url") == plan.metadata, entry.name
        assert (_flag(entry.argv, "--tls-cert"), _flag(entry.argv, "--tls-key"), _flag(entry.argv, "--tls-ca")) == (
            str(tls_dir / entry.name / "tls.crt"), str(tls_dir / entry.name / "tls.key"), ca), entry.name


def test_a_plan_without_tls_runs_etcd_in_plaintext(tmp_path: Path) -> None:
    plan = LocalCluster(ClusterConfig(data_dir=tmp_path, replicas=1, coordinators=0, orphan_scanners=0)).plan()
    [member] = [s for s in plan.services if s.is_etcd]
    assert plan.metadata == f"etcd://{member.grpc}"
    assert _flag(member.argv, "--listen-client-urls") == f"http://{member.grpc}"
    assert "--cert-file" not in member.argv and "--client-cert-auth" not in member.argv
    assert member.metrics_url == f"http://{member.grpc}/metrics"
