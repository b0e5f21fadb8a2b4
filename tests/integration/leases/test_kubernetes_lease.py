"""Leader leases on coordination.k8s.io Leases, against a real kube-apiserver + etcd: one holder
at a time, takeover after the holder stops renewing (a front door process killed with SIGKILL),
a foreign writer wins, release hands over at once."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lowtide.common.procs import find_free_port
from lowtide.leases.kubernetes import KubernetesLease, load_api
from tests import waiting
from tests.k8s_apiserver import KubeApiServer, missing_binaries


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    missing = missing_binaries()
    if missing:
        pytest.skip("a real kube-apiserver needs: " + ", ".join(missing))
    with KubeApiServer.start(tmp_path_factory.mktemp("kube")) as server:
        yield server


def lease(apiserver: KubeApiServer, owner: str, *, name: str, lease_ms: int = 1000) -> KubernetesLease:
    return KubernetesLease(api=load_api(kubeconfig=str(apiserver.kubeconfig)), namespace="default", name=name,
                           owner=owner, lease_ms=lease_ms, margin_ms=200)


def read(apiserver: KubeApiServer, name: str):
    return load_api(kubeconfig=str(apiserver.kubeconfig)).read_namespaced_lease(name, "default")


def test_only_one_of_two_contenders_holds_the_lease(apiserver: KubeApiServer) -> None:
    a, b = lease(apiserver, "a", name="one"), lease(apiserver, "b", name="one")
    assert a.acquire_or_renew() and a.valid()
    assert not b.acquire_or_renew() and not b.valid()
    assert a.acquire_or_renew()  # renewing
    spec = read(apiserver, "one").spec
    assert (spec.holder_identity, spec.lease_transitions, spec.lease_duration_seconds) == ("a", 0, 1)


def test_another_takes_over_once_the_holder_stops_renewing(apiserver: KubeApiServer) -> None:
    a, b = lease(apiserver, "a", name="two"), lease(apiserver, "b", name="two")
    assert a.acquire_or_renew()
    assert not b.acquire_or_renew()
    started = time.monotonic()
    waiting.wait_until(b.acquire_or_renew, timeout_s=10, interval_s=0.1, what="b takes over")
    # not before a whole lease duration (1 s) since b last saw a renew
    assert time.monotonic() - started >= 0.9
    spec = read(apiserver, "two").spec
    assert (spec.holder_identity, spec.lease_transitions) == ("b", 1)
    assert not a.acquire_or_renew()  # the old holder learns it lost


def test_a_holder_that_another_writer_displaced_is_no_longer_leader(apiserver: KubeApiServer) -> None:
    a = lease(apiserver, "a", name="three", lease_ms=5000)
    assert a.acquire_or_renew()
    api = load_api(kubeconfig=str(apiserver.kubeconfig))
    obj = api.read_namespaced_lease("three", "default")
    obj.spec.holder_identity = "intruder"
    api.replace_namespaced_lease("three", "default", obj)
    assert not a.acquire_or_renew()
    assert not a.valid()


def test_release_lets_the_other_take_over_at_once(apiserver: KubeApiServer) -> None:
    a, b = lease(apiserver, "a", name="four", lease_ms=30_000), lease(apiserver, "b", name="four", lease_ms=30_000)
    assert a.acquire_or_renew()
    assert not b.acquire_or_renew()
    a.release()
    assert not a.valid()
    assert b.acquire_or_renew()


def start_front_door(apiserver: KubeApiServer, redis_url: str, name: str, metadata_url: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "lowtide.cli.main", "serve", "frontdoor", "--name", name,
         "--grpc-addr", f"127.0.0.1:{find_free_port()}", "--redis-url", redis_url, "--metadata-url", metadata_url,
         "--lease-backend", "kubernetes", "--kubeconfig", str(apiserver.kubeconfig),
         "--lease-namespace", "default", "--lease-name-prefix", "fdtest", "--controller-lease-ms", "2000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_killed_controller_front_door_is_replaced_by_another_through_the_lease(
        apiserver: KubeApiServer, redis_url: str, metadata_url: str, tmp_path: Path) -> None:
    procs = {name: start_front_door(apiserver, redis_url, name, metadata_url) for name in ("fd-a", "fd-b")}
    try:
        def holder() -> str:
            try:
                return read(apiserver, "fdtest-controller").spec.holder_identity or ""
            except Exception:  # noqa: BLE001 - not created yet
                return ""

        waiting.wait_until(lambda: holder().startswith(("fd-a-", "fd-b-")), timeout_s=60, what="a controller")
        first = holder()
        first_name = first.rsplit("-", 1)[0]
        procs[first_name].kill()
        procs[first_name].wait()
        other = "fd-b" if first_name == "fd-a" else "fd-a"
        waiting.wait_until(lambda: holder().startswith(other + "-"), timeout_s=30, what=f"{other} takes over")
        assert read(apiserver, "fdtest-controller").spec.lease_transitions == 1
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
