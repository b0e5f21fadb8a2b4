"""Produce on a replica, for both doors (issue 47): the gRPC ``Replica.Produce`` servicer and the
Kafka listener's Produce call this one handler with ``lowtide.messages`` types; neither holds any
of the policy below, and the Kafka door builds no protobuf on its way to the log.

The policy, in the order it applies (as Kafka's ``KafkaApis.handleProduceRequest`` and
``ReplicaManager.appendRecords`` apply theirs):

1. **Authorization**: WRITE on each partition's topic; a request naming internal topics only is
   also allowed with CLUSTER_ACTION (the coordinators write them acting for callers they checked).
2. **Internal topics** are written by their coordinators only: a partition of ``__consumer_offsets``,
   ``__transaction_state`` or ``__diskless_metadata-*`` is refused with INVALID_TOPIC_EXCEPTION,
   Kafka's own message, unless the request says ``coordinator_append`` *and* its principal holds
   CLUSTER_ACTION (with auth off anyone holds everything, so the flag is needed as well; the Kafka
   listener never sets it).
3. **Classic or diskless**: a classic partition is appended here (``ReplicaRequests.produce_steps``:
   acks 0/1/all, a leader epoch to fence on, a conditional append on the log end); a diskless one
   goes to the diskless broker (KIP-1164), which refuses a conditional append.
4. Answers come back one per request item, in request order.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

from lowtide.auth.acl import CLUSTER_RESOURCE_NAME, AclOperation, ResourceType
from lowtide.common import ordering
from lowtide.errors import InvalidRequest, InvalidTopic, LowtideError
from lowtide.messages.replica import ProducedPartition, ProduceItem
from lowtide.metadata.model import COORDINATOR_TOPICS
from lowtide.replica.handler_parts import RequestHandler, interleave, internal_only, topic_of
from lowtide.replica.metrics import count_produced_bytes
from lowtide.rpc.steps import Blocking, Steps

DEFAULT_TIMEOUT_MS = 30000



def _client_write_to_coordinator_topic(item: ProduceItem) -> LowtideError | None:
    if item.topic in COORDINATOR_TOPICS:
        return InvalidTopic(f"Cannot append to internal topic {item.topic}")  # Kafka's own message
    return None


def _refused(item: ProduceItem, error: LowtideError) -> ProducedPartition:
    return ProducedPartition(topic=item.topic, partition=item.partition, error=error)


class ProduceHandler(RequestHandler):
    """Produce for an authenticated principal (module doc has the policy).

    Thread-safety: stateless; the manager and the diskless broker it calls are thread-safe.
    ``produce_steps`` runs as steps (rpc/steps.py): the appends in the first step, the acks=all
    wait yielded, a diskless commit as a ``Blocking`` step.
    """

    def produce_steps(self, principal: str, items: Sequence[ProduceItem], *, acks: int, timeout_ms: int,
                      coordinator_append: bool = False) -> Steps[list[ProducedPartition]]:
        """One answer per item, in order."""
        timeout_ms = timeout_ms or DEFAULT_TIMEOUT_MS
        screened = self.access.screen(principal, items, operation=AclOperation.WRITE, topic=topic_of,
                                      or_cluster_action=internal_only(items))
        if not (coordinator_append and self.access.allows(
                principal, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME)):
            screened = screened.refusing(_client_write_to_coordinator_topic)
        kinds = self.diskless_kinds(screened.allowed)
        classic = [p for p, k in zip(screened.allowed, kinds, strict=True) if k is None]
        epochs = {(p.topic, p.partition): p.current_leader_epoch for p in classic
                  if p.current_leader_epoch is not None}
        expected = {(p.topic, p.partition): p.expected_log_end_offset for p in classic
                    if p.expected_log_end_offset is not None}
        # With diskless partitions too, the request's appends are not done when the classic ones
        # are: the next request of a Kafka connection starts only after the diskless ones too.
        with ordering.held() if len(classic) != len(kinds) else nullcontext():
            results = (yield from self.requests.produce_steps(
                [(p.topic, p.partition, p.records) for p in classic], acks=acks, timeout_ms=timeout_ms,
                leader_epochs=epochs, expected_end_offsets=expected)) if classic else []
        out: list[ProducedPartition] = []
        for item, (topic, partition, info) in zip(classic, results, strict=True):
            if isinstance(info, LowtideError):
                out.append(ProducedPartition(topic=topic, partition=partition, error=info))
                continue
            count_produced_bytes(topic, len(item.records))
            out.append(ProducedPartition(
                topic=topic, partition=partition, base_offset=info.base_offset,
                log_start_offset=self.manager.get_partition(topic, partition).log.log_start_offset))
        if len(classic) != len(kinds):
            diskless = [(k, p) for p, k in zip(screened.allowed, kinds, strict=True) if k is not None]
            answered = yield Blocking(lambda: self._produce_diskless(diskless, timeout_ms=timeout_ms))
            out = interleave(kinds, out, answered)
        return screened.merge(out, _refused)

    def in_transaction(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> bool:
        """Whether this replica leads the partition and its log holds an ongoing transaction of
        ``producer_id`` in ``producer_epoch``: then the partition is in that transaction at its
        coordinator already (its first batch was added before it was appended), and a Kafka
        Produce v12 need not ask the coordinator again (KIP-890; Kafka's leader skips the same
        call). A marker that ends it meanwhile moves the producer's epoch: the append is fenced."""
        try:
            p = self.manager.get_partition(topic, partition)
            p.check_leader()
        except LowtideError:
            return False
        return p.log.in_transaction(producer_id, producer_epoch)

    def _produce_diskless(self, parts: list[tuple[object, ProduceItem]], *, timeout_ms: int) -> list[ProducedPartition]:
        # A condition on the log end is refused, not ignored: a diskless partition has no local log
        # to compare with, and its offsets are assigned by the coordinator at commit time.
        assert self.diskless is not None
        todo = [(info, p.partition, p.records) for info, p in parts if p.expected_log_end_offset is None]
        produced = iter(self.diskless.produce(todo, timeout_ms=timeout_ms) if todo else [])
        out = []
        for _, p in parts:
            if p.expected_log_end_offset is not None:
                out.append(_refused(p, InvalidRequest(
                    f"{p.topic} is a diskless topic: a conditional append (expected_log_end_offset) is only "
                    "for classic topics")))
                continue
            res = next(produced)
            if isinstance(res, LowtideError):
                out.append(_refused(p, res))
                continue
            count_produced_bytes(p.topic, len(p.records))
            out.append(ProducedPartition(topic=p.topic, partition=p.partition, base_offset=res.base_offset,
                                         log_start_offset=res.log_start_offset,
                                         log_append_time_ms=res.log_append_time))
        return out
