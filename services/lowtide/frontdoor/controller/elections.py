"""Leader elections on request (Kafka's ElectLeaders, KIP-460) and leader balance (Kafka's
``auto.leader.rebalance.enable``).

A partition's **preferred** leader is the first replica of its assignment. Leaders drift from it:
a broker that restarts comes back as a follower of partitions it used to lead, so after a rolling
restart one broker can lead everything. A preferred election moves leadership back:

* leader already preferred -> ELECTION_NOT_NEEDED;
* preferred replica not live, or not in the ISR -> PREFERRED_LEADER_NOT_AVAILABLE (a replica out
  of the ISR may miss acknowledged records: it never leads);
* else leader = preferred, leader epoch + 1, ISR unchanged: the old leader becomes a follower when
  it sees the new epoch, exactly as after a failover, so the rules of the log (truncation to the
  new leader's epoch boundary, the high watermark, the low watermark never lowered) are the ones
  failovers already keep (docs/design/invariants.md).

An **unclean** election is Kafka's "elect anyone live"; lowtide keeps ``unclean.leader.election``
off (it loses acknowledged records), so it elects cleanly (a live ISR member) when the leader is
gone and otherwise answers ELIGIBLE_LEADERS_NOT_AVAILABLE.

Every write is a compare-and-set on the partition epoch (the controller and leaders' ISR changes
may race it: the loser reads again and decides again).

**Balance** (``LeaderBalancer``, run by the controller): per broker, the share of the partitions
it is preferred for that it does not lead; above ``leader.imbalance.per.broker.percentage`` (10)
its partitions get preferred elections, every ``leader.imbalance.check.interval.seconds`` (300),
Kafka's defaults and rule.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from lowtide.auth.acl import AclOperation, Authorizer
from lowtide.errors import (
    ClusterAuthorizationFailed,
    ElectionNotNeeded,
    EligibleLeadersNotAvailable,
    LowtideError,
    PreferredLeaderNotAvailable,
    RequestTimedOut,
    UnknownTopicOrPartition,
)
from lowtide.frontdoor.controller.controller import elect_leader
from lowtide.messages import TopicPartition
from lowtide.messages.admin import ElectionOutcome, ElectionType
from lowtide.metadata.model import PartitionState
from lowtide.metadata.store import MetadataStore

log = logging.getLogger(__name__)
ATTEMPTS = 10


def preferred_election(state: PartitionState, live: set[int]) -> PartitionState:
    """The state with the preferred replica leading, or the error saying why not (raised)."""
    preferred = state.replicas[0] if state.replicas else -1
    if state.leader == preferred:
        raise ElectionNotNeeded(f"{state.topic}-{state.partition}: the preferred replica {preferred} already leads")
    if preferred not in live or preferred not in state.isr:
        why = "is not live" if preferred not in live else "is not in the ISR"
        raise PreferredLeaderNotAvailable(f"{state.topic}-{state.partition}: the preferred replica {preferred} {why}")
    return replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)


def unclean_election(state: PartitionState, live: set[int]) -> PartitionState:
    """A clean election where one is due; lowtide never elects outside the ISR."""
    if state.leader >= 0 and state.leader in live:
        raise ElectionNotNeeded(f"{state.topic}-{state.partition}: leader {state.leader} is live")
    new = elect_leader(state, live)
    if new is None or new.leader < 0:
        raise EligibleLeadersNotAvailable(
            f"{state.topic}-{state.partition}: no live replica in the ISR {list(state.isr)}; unclean election "
            "(a replica outside the ISR) is disabled because it would lose acknowledged records")
    return new


class LeaderElections:
    """ElectLeaders for the Admin service and the Kafka listener. Needs ALTER on the CLUSTER.

    ``elect(partitions=None)`` means every partition of every classic topic, and then answers only
    the partitions where an election was due (Kafka's tool prints "no election needed" otherwise).
    Thread-safe (store and authorizer are).
    """

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer) -> None:
        self._store = store
        self._authorizer = authorizer

    def elect(self, *, principal: str, election_type: ElectionType,
              partitions: Sequence[TopicPartition] | None) -> list[ElectionOutcome]:
        if not self._authorizer.authorize_cluster(principal=principal, operation=AclOperation.ALTER):
            raise ClusterAuthorizationFailed(f"{principal} may not elect leaders (needs ALTER on CLUSTER)")
        states = self._store.all_partition_states()
        everything = partitions is None
        asked = [TopicPartition(*tp) for tp in (sorted(states) if partitions is None else partitions)]
        live = self._store.live_broker_ids({r for s in states.values() for r in s.replicas})
        outcomes = []
        for tp in asked:
            state = states.get((tp.topic, tp.partition))
            try:
                if state is None or not state.replicas:
                    raise UnknownTopicOrPartition(f"{tp.topic}-{tp.partition} does not exist or has no replicas")
                self._elect_one(state, election_type, live)
                outcomes.append(ElectionOutcome(tp))
            except ElectionNotNeeded as err:
                if not everything:
                    outcomes.append(ElectionOutcome(tp, err))
            except LowtideError as err:
                outcomes.append(ElectionOutcome(tp, err))
        return outcomes

    def _elect_one(self, state: PartitionState, election_type: ElectionType, live: set[int]) -> PartitionState:
        elect = preferred_election if election_type == ElectionType.PREFERRED else unclean_election
        for _ in range(ATTEMPTS):
            new = elect(state, live)
            if self._store.compare_and_set_partition(state, new):
                log.info("elected leader on request", extra={"fields": {
                    "topic": new.topic, "partition": new.partition, "type": election_type.name.lower(),
                    "old_leader": state.leader, "leader": new.leader, "leader_epoch": new.leader_epoch}})
                return new
            state = self._store.partition_state(state.topic, state.partition)
        raise RequestTimedOut(f"{state.topic}-{state.partition} changed under too many concurrent writers; retry")


@dataclass(frozen=True)
class BalanceConfig:
    """Kafka's auto.leader.rebalance.enable / leader.imbalance.per.broker.percentage /
    leader.imbalance.check.interval.seconds."""

    enabled: bool = True
    imbalance_percentage: int = 10
    check_interval_s: float = 300.0


def imbalanced_brokers(states: Iterable[PartitionState], *, percentage: int) -> dict[int, list[PartitionState]]:
    """Broker -> the partitions it is preferred for but does not lead, for every broker whose share
    of such partitions is above ``percentage`` (Kafka's ratio: not-led / preferred-for)."""
    preferred_for: dict[int, int] = {}
    not_led: dict[int, list[PartitionState]] = {}
    for state in states:
        if not state.replicas:
            continue
        preferred = state.replicas[0]
        preferred_for[preferred] = preferred_for.get(preferred, 0) + 1
        if state.leader != preferred:
            not_led.setdefault(preferred, []).append(state)
    return {b: ps for b, ps in not_led.items() if len(ps) * 100 > percentage * preferred_for[b]}


class LeaderBalancer:
    """One balance pass (``run_once``) for the controller: preferred elections for the partitions
    of imbalanced brokers, where the preferred replica is live and in the ISR. Returns the states
    written. Called only by the controller holding the lease."""

    def __init__(self, *, store: MetadataStore, config: BalanceConfig) -> None:
        self._store = store
        self.config = config

    def run_once(self, states: dict[tuple[str, int], PartitionState], live: set[int]) -> list[PartitionState]:
        written = []
        for broker, partitions in sorted(imbalanced_brokers(states.values(),
                                                            percentage=self.config.imbalance_percentage).items()):
            for state in partitions:
                try:
                    new = preferred_election(state, live)
                except LowtideError:
                    continue  # not available now: the next pass tries again
                if self._store.compare_and_set_partition(state, new):
                    log.info("rebalanced leader to the preferred replica", extra={"fields": {
                        "topic": new.topic, "partition": new.partition, "old_leader": state.leader,
                        "leader": new.leader, "leader_epoch": new.leader_epoch, "broker": broker}})
                    written.append(new)
        return written
