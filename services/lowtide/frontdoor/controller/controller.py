"""The controller: elects a new leader when a partition's leader stops being live.

Exactly one front door acts at a time: each loop iteration first takes or renews the controller lease
``controller`` in etcd (``MetadataStore.try_acquire_controller``); the others keep trying, so when
the acting front door dies its lease expires and another takes over within ``lease_ms``.

Election rules (Kafka's clean election; unclean election is never done, so no acknowledged record
is lost to it):

* leader not live -> new leader = first replica (in assignment order) that is in the ISR and live,
  other than the old leader; new ISR = old ISR minus the old leader; leader epoch + 1;
* no such replica -> leader = -1, ISR unchanged (it names who may lead again), leader epoch + 1;
* leader = -1 and an ISR member is live again -> elect it (epoch + 1);
* leader restarted (its broker's session came back under a new incarnation before the old one
  expired) -> as if it had stopped being live: Kafka's controller fences a broker that registers
  again. A restarted process lost its in-memory state (the HW it had told clients, its producer
  and transaction states), so it must not go on leading under the same epoch: a new epoch makes
  clients and followers start afresh with the new leader (ListOffsets answers OFFSET_NOT_AVAILABLE
  until its HW reaches the new epoch's start). It leads again only through a later election.

Every write is a compare-and-set on the partition epoch, which publishes on the metadata channel so
the replicas react; losing a race to a leader's own ISR change simply re-evaluates next round.

Each round also finishes partition reassignments whose adding replicas have joined the ISR
(``frontdoor/controller/reassignments.py:complete_reassignments``, KIP-455).

With a ``LeaderBalancer`` (frontdoor/controller/elections.py) the controller also moves leadership back to
preferred replicas every ``check_interval_s`` (Kafka's auto.leader.rebalance.enable).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from lowtide.frontdoor.controller.reassignments import complete_reassignments
from lowtide.leases import Lease
from lowtide.metadata.model import PartitionState
from lowtide.metadata.store import MetadataStore

if TYPE_CHECKING:
    from lowtide.frontdoor.controller.elections import LeaderBalancer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerConfig:
    interval_s: float = 0.3
    lease_ms: int = 2000


def elect_leader(state: PartitionState, live: set[int]) -> PartitionState | None:
    """The state after a clean election, or None when the current leader is fine (or nothing changes)."""
    if state.leader >= 0 and state.leader in live:
        return None
    candidates = [r for r in state.replicas if r in state.isr and r in live and r != state.leader]
    if state.leader < 0:
        if not candidates:
            return None  # still nobody to elect; keep waiting without bumping the epoch
        new_leader = candidates[0]
        isr = state.isr if new_leader in state.isr else (*state.isr, new_leader)
        return replace(state, leader=new_leader, leader_epoch=state.leader_epoch + 1, isr=isr)
    if not candidates:
        return replace(state, leader=-1, leader_epoch=state.leader_epoch + 1)
    new_leader = candidates[0]
    isr = tuple(r for r in state.isr if r != state.leader) or (new_leader,)
    return replace(state, leader=new_leader, leader_epoch=state.leader_epoch + 1, isr=isr)


class Controller:
    """Background leader election (see module doc).

    ``run_once`` is the whole job of one round and is what tests call; ``start``/``stop`` run it
    every ``interval_s`` on a daemon thread. Not meant to be driven from several threads at once.
    """

    def __init__(self, *, store: MetadataStore, config: ControllerConfig = ControllerConfig(),
                 owner: str | None = None, lease: Lease | None = None,
                 balancer: LeaderBalancer | None = None, clock=time.monotonic) -> None:
        self._store = store
        self._balancer = balancer
        self._clock = clock
        self._next_balance = clock() + (balancer.config.check_interval_s if balancer else 0.0)
        self._config = config
        # lease: a lowtide.leases.Lease (a Kubernetes Lease); None: the etcd lease of the store
        self._lease = lease
        self.owner = lease.owner if lease is not None else (owner or f"frontdoor-{uuid.uuid4().hex[:12]}")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        # Broker id -> incarnation as last seen live: a different one next round is a restart.
        self._incarnations: dict[int, str] = {}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._lease is not None:
            self._lease.release()

    def wake(self) -> None:
        """Run the next round now (e.g. on a metadata event) instead of at the next tick."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - metadata store hiccups must not kill the controller thread
                log.exception("controller round failed")
            self._wake.wait(self._config.interval_s)
            self._wake.clear()

    def run_once(self) -> list[PartitionState]:
        """If this front door holds the lease, elect where needed; return the states written."""
        if not (self._lease.acquire_or_renew() if self._lease is not None
                else self._store.try_acquire_controller(self.owner, lease_ms=self._config.lease_ms)):
            # Not acting: only follow the incarnations, so that taking over later does not take
            # every broker that started meanwhile for a restarted leader.
            self._incarnations = self._store.live_broker_incarnations()
            return []
        states = self._store.all_partition_states()
        involved = {r for s in states.values() for r in s.replicas}
        live = self._store.live_broker_ids(involved)
        incarnations = self._store.live_broker_incarnations()
        restarted = {b for b, inc in incarnations.items() if self._incarnations.get(b, inc) != inc}
        written = []
        not_moved: set[int] = set()
        elections = []
        for state in states.values():
            # A restarted leader is moved off as a dead one would be (module doc).
            new = elect_leader(state, live - restarted if state.leader in restarted else live)
            if new is not None:
                elections.append((state, new))
        # All in a few etcd writes (a broker's death moves every partition it led at once).
        for (state, new), ok in zip(elections, self._store.compare_and_set_partitions(elections), strict=True):
            if ok:
                log.info("elected leader", extra={"fields": {
                    "topic": new.topic, "partition": new.partition, "old_leader": state.leader,
                    "leader": new.leader, "leader_epoch": new.leader_epoch, "isr": list(new.isr)}})
                written.append(replace(new, partition_epoch=state.partition_epoch + 1))
            elif state.leader in restarted:
                not_moved.add(state.leader)  # lost a race to another write: again next round
        # A restart counts as handled once every partition it led has moved; until then the old
        # incarnation is kept, so the next round sees the restart again.
        self._incarnations = {b: self._incarnations[b] if b in not_moved else inc for b, inc in incarnations.items()}
        moving = [s for s in states.values() if s.reassigning]
        if moving:
            # Re-read: an election above may have moved one (its CAS would fail on the stale record).
            fresh = self._store.all_partition_states() if written else states
            written += complete_reassignments(self._store, (fresh[k] for k in fresh if fresh[k].reassigning), live)
        if self._balancer is not None and self._balancer.config.enabled and self._clock() >= self._next_balance:
            self._next_balance = self._clock() + self._balancer.config.check_interval_s
            written += self._balancer.run_once(self._store.all_partition_states(), live)
        return written
