"""Bounds on long-polled fetches, so that Fetch cannot be used to wedge a leader.

Why: the replica serves gRPC from a fixed pool of handler threads and a parked fetch holds its
thread for the whole wait. Before these bounds a caller could send a few hundred fetches with a
huge ``max_wait_ms`` (and cancel them: the thread stayed parked) and take every thread; follower
fetches then queued behind them, followers fell out of the ISR and, since the leader still
heartbeated, no failover followed (issue 9, finding 5).

The bounds, all configurable (replica flags ``--fetch-max-wait-ms``, ``--fetch-max-bytes``,
``--max-parked-fetches``, ``--max-parked-fetches-per-connection``):

* a consumer's wait is capped at ``max_wait_ms`` and its byte budget at ``max_bytes``;
* at most ``max_parked`` consumer fetches park at once, at most ``max_parked_per_connection`` of
  them from one connection (gRPC peer); a fetch that finds no free slot is answered at once with
  what is available, as if it had asked for ``min_bytes`` 0 — it is never refused;
* follower fetches (``replica_id`` >= 0, authenticated brokers) do not count against these
  limits: replication never queues behind clients;
* a parked fetch whose caller cancels or disconnects is woken and returns at once (the servicer
  hooks the RPC's termination callback), giving its thread back.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class FetchLimits:
    """Server-side caps on consumer fetches (see module doc)."""

    max_wait_ms: int = 30_000
    max_bytes: int = 50 * 1024 * 1024
    max_parked: int = 32
    max_parked_per_connection: int = 8


class ParkingLot:
    """Counts parked consumer fetches, in total and per connection.

    Contract: ``try_park(peer)`` takes a slot and returns True, or returns False when a bound is
    reached; every True is matched by one ``leave(peer)``. Thread-safety: thread-safe.
    """

    def __init__(self, limits: FetchLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._by_peer: Counter[str] = Counter()
        self._total = 0

    @property
    def parked(self) -> int:
        return self._total

    def try_park(self, peer: str) -> bool:
        with self._lock:
            if self._total >= self.limits.max_parked or self._by_peer[peer] >= self.limits.max_parked_per_connection:
                return False
            self._total += 1
            self._by_peer[peer] += 1
            return True

    def leave(self, peer: str) -> None:
        with self._lock:
            self._total -= 1
            self._by_peer[peer] -= 1
            if self._by_peer[peer] <= 0:
                del self._by_peer[peer]
