"""find_free_port: ports come from a range the kernel never hands out on its own."""

from __future__ import annotations

import socket

import pytest

from lowtide.common import procs


def _ephemeral_range() -> tuple[int, int]:
    with open(procs.EPHEMERAL_RANGE_FILE, encoding="ascii") as f:
        lo, hi = (int(x) for x in f.read().split()[:2])
    return lo, hi


def test_without_a_range_ports_come_from_below_the_kernels_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(procs.PORT_RANGE_ENV, raising=False)
    ephemeral_lo, _ = _ephemeral_range()
    if ephemeral_lo - procs.DEFAULT_PORT_FLOOR < 1000:
        pytest.skip(f"this kernel's ephemeral range starts at {ephemeral_lo}: no room below it")
    ports = [procs.find_free_port() for _ in range(20)]
    assert all(procs.DEFAULT_PORT_FLOOR <= p < ephemeral_lo for p in ports), ports
    assert len(set(ports)) == len(ports), "one process picked the same port twice"


def test_a_port_bound_by_someone_else_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        monkeypatch.setenv(procs.PORT_RANGE_ENV, f"{taken}-{taken + 50}")
        picks = {procs.find_free_port() for _ in range(3)}
    assert taken not in picks


def test_a_malformed_range_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(procs.PORT_RANGE_ENV, "20000")
    with pytest.raises(ValueError, match="expected LO-HI"):
        procs.find_free_port()
