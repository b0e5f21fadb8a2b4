"""lowtide.leases: the --lease-backend flag's names."""

from __future__ import annotations

import argparse

import pytest

from lowtide.leases import add_lease_flags, check_backend


def test_the_default_lease_backend_is_etcd() -> None:
    parser = argparse.ArgumentParser()
    add_lease_flags(parser)
    assert check_backend("frontdoor-0", parser.parse_args([]).lease_backend) == "etcd"


def test_redis_the_name_before_etcd_still_means_the_etcd_leases() -> None:
    assert check_backend("frontdoor-0", "redis") == "etcd"
    assert check_backend("frontdoor-0", "kubernetes") == "kubernetes"


def test_an_unknown_lease_backend_stops_the_server_with_its_name() -> None:
    with pytest.raises(SystemExit, match="coordinator-1: --lease-backend must be etcd or kubernetes, got 'zookeeper'"):
        check_backend("coordinator-1", "zookeeper")
