"""ShareFetch and ShareAcknowledge (KIP-932) at a partition's leader, for the Kafka listener
(``kafka/apis_share.py``). The share-partition state machine and its persistence are
``lowtide.share``; this handler holds the request's policy, in order:

1. **ACLs** (Kafka's): READ on the GROUP for the whole request (GROUP_AUTHORIZATION_FAILED), READ
   on each partition's topic (TOPIC_AUTHORIZATION_FAILED for that partition).
2. **The share session** (``SharePartitions.open_session``): epoch 0 opens it, -1 closes it (what
   the member holds here is released), others must be its next epoch.
3. **Acknowledgements first** (piggy-backed on ShareFetch, or ShareAcknowledge's): each
   partition's are applied and written to ``__share_group_state`` (acks=all) before the answer;
   a refused or failed one is that partition's ``acknowledge_error`` and changes nothing.
4. **Acquisition** (ShareFetch): for every partition of the session this replica leads, records
   from the log as bytes, acquired by offset range. With nothing to acquire anywhere, the fetch
   parks up to its MaxWaitMs (at most ``MAX_WAIT_MS``) and tries again when woken: by an HW move
   of one of its partitions (new records: the wake-up consumer fetches wait on,
   ``requests.hw_moved_key``), by records of one of them going back to available (an
   acknowledgement that releases, a member's session closing: ``released_key``), or by a change of
   leadership. An acquisition lock timing out wakes nobody: the member's next fetch, at most
   ``MAX_WAIT_MS`` later, finds the record available.

A partition this replica does not lead is NOT_LEADER_OR_FOLLOWER (the client refreshes its
metadata); an unknown topic id UNKNOWN_TOPIC_ID.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from lowtide.auth.acl import AclOperation, ResourceType
from lowtide.errors import (
    GroupAuthorizationFailed,
    InvalidRequest,
    InvalidShareSessionEpoch,
    LowtideError,
    TopicAuthorizationFailed,
    UnknownTopicId,
    UnknownTopicOrPartition,
)
from lowtide.messages.share import (
    AcquiredRange,
    ShareFetchAnswer,
    ShareFetchAsk,
    ShareGroupOffsets,
    SharePartitionAnswer,
    SharePartitionAsk,
    ShareStartOffset,
)
from lowtide.replica.handler_parts import RequestHandler
from lowtide.replica.requests import hw_moved_key
from lowtide.share.codec import ShareSnapshot, ShareStateKey
from lowtide.share.partitions import LeaderLog, SharePartitions
from lowtide.share.state import ACKNOWLEDGED, ARCHIVED

MAX_WAIT_MS = 500
# Per partition, what one read may return (Kafka's default max.partition.fetch.bytes).
PARTITION_MAX_BYTES = 1 << 20


def released_key(topic: str, partition: int) -> tuple[str, int, str]:
    """The wake-up key of records of ``topic``-``partition`` made available again (parked share
    fetches wait on it)."""
    return (topic, partition, "share-released")


class ShareHandler(RequestHandler):
    """ShareFetch/ShareAcknowledge for an authenticated principal (module doc).

    Thread-safety: thread-safe (stateless; ``shares`` is thread-safe); runs on a listener worker
    thread, where its bounded wait sleeps.
    """

    def __init__(self, *, shares: SharePartitions, **parts) -> None:
        super().__init__(**parts)
        self.shares = shares

    def lock_duration_ms(self, group_id: str) -> int:
        """The acquisition lock of ``group_id``'s records (its group config, else the flag)."""
        return self.shares.partition_config(group_id).lock_duration_ms

    def share_fetch(self, principal: str, ask: ShareFetchAsk) -> ShareFetchAnswer:
        if not self.access.allows(principal, AclOperation.READ, ResourceType.GROUP, ask.group_id):
            return ShareFetchAnswer(error=GroupAuthorizationFailed(
                f"{principal} is not authorized to READ on GROUP {ask.group_id!r}"))
        closing = ask.session_epoch == -1
        try:
            if closing:
                session = self.shares.close_session(group_id=ask.group_id, member_id=ask.member_id)
            elif not ask.fetch and ask.session_epoch == 0:
                raise InvalidShareSessionEpoch("a ShareAcknowledge cannot open a share session (epoch 0)")
            else:
                session = self.shares.open_session(
                    group_id=ask.group_id, member_id=ask.member_id, epoch=ask.session_epoch,
                    add=[(p.topic_id, p.partition) for p in ask.partitions] if ask.fetch else (),
                    forget=ask.forgotten)
        except LowtideError as err:
            return ShareFetchAnswer(error=err)
        topics = {i.topic_id: i for i in self.manager.store.topics().values()}
        answers: dict[tuple[str, int], SharePartitionAnswer] = {}
        readable: dict[tuple[str, int], tuple[ShareStateKey, Callable[[], LeaderLog]]] = {}
        committed = self.shares.read_committed(ask.group_id)
        names = {key: topics[key[0]].name for key in session | {(p.topic_id, p.partition) for p in ask.partitions}
                 if key[0] in topics}
        for key in sorted(session | {(p.topic_id, p.partition) for p in ask.partitions}):
            error, leader = self._find_leader(principal, topics, *key, read_committed=committed)
            if error is not None:
                answers[key] = SharePartitionAnswer(topic_id=key[0], partition=key[1], error=error)
                continue
            readable[key] = (ShareStateKey(group_id=ask.group_id, topic_id=key[0], partition=key[1]), leader)
        acknowledged = []
        for p in ask.partitions:
            k = (p.topic_id, p.partition)
            if k in readable and p.acknowledgements:
                answers[k] = self._acknowledge(ask, p, *readable[k])
                acknowledged.append(k)
        if closing:
            for key, leader in readable.values():
                try:
                    self.shares.release(key=key, member_id=ask.member_id, leader=leader())
                except LowtideError:
                    pass  # its locks time out instead
            acknowledged = list(readable)
        if acknowledged:
            # What was released (or rejected, accepted: not worth telling apart) may be what a
            # parked fetch of another member waits for.
            self.manager.registry.notify([released_key(names[k], k[1]) for k in acknowledged])
        if ask.fetch and not closing:
            self._acquire(ask, {k: v for k, v in readable.items() if k in session}, answers,
                          wake_keys=[w for k in readable if k in session
                                     for w in ((names[k], k[1]), hw_moved_key((names[k], k[1])),
                                               released_key(names[k], k[1]))])
        for p in ask.partitions:
            answers.setdefault((p.topic_id, p.partition), SharePartitionAnswer(topic_id=p.topic_id,
                                                                                partition=p.partition))
        return ShareFetchAnswer(partitions=tuple(answers.values()),
                                lock_timeout_ms=self.lock_duration_ms(ask.group_id))

    def describe_offsets(self, principal: str, group_id: str,
                         topics: dict[str, tuple[int, ...]] | None) -> ShareGroupOffsets:
        """DescribeShareGroupOffsets: the group's durable start offsets (``topics`` None: every
        share-partition the group has state for), from ``__share_group_state``."""
        if not self.access.allows(principal, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            return ShareGroupOffsets(group_id=group_id, error=GroupAuthorizationFailed(
                f"{principal} is not authorized to DESCRIBE on GROUP {group_id!r}"))
        try:
            snapshots = self.shares.read_start_offsets(group_id)
        except LowtideError as err:
            return ShareGroupOffsets(group_id=group_id, error=err)
        infos = self.manager.store.topics()
        names = {i.topic_id: n for n, i in infos.items()}
        if topics is None:
            wanted = sorted((names[t], p) for t, p in snapshots if t in names)
        else:
            wanted = [(t, p) for t, parts in topics.items() for p in parts]
        out = []
        for topic, partition in wanted:
            info = infos.get(topic)
            if info is None:
                out.append(ShareStartOffset(topic=topic, topic_id="", partition=partition,
                                            error=UnknownTopicId(f"topic {topic!r} does not exist")))
                continue
            if not self.access.allows(principal, AclOperation.DESCRIBE, ResourceType.TOPIC, topic):
                out.append(ShareStartOffset(topic=topic, topic_id=info.topic_id, partition=partition,
                                            error=TopicAuthorizationFailed(
                                                f"{principal} is not authorized to DESCRIBE on TOPIC {topic!r}")))
                continue
            snapshot = snapshots.get((info.topic_id, partition))
            if snapshot is None:
                out.append(ShareStartOffset(topic=topic, topic_id=info.topic_id, partition=partition))
                continue
            hosted = self.manager.registry.find(topic, partition)
            lag = _count_lag(snapshot, hosted.log.high_watermark) if hosted is not None else -1
            out.append(ShareStartOffset(topic=topic, topic_id=info.topic_id, partition=partition,
                                        start_offset=snapshot.start_offset, leader_epoch=snapshot.leader_epoch,
                                        lag=lag))
        return ShareGroupOffsets(group_id=group_id, partitions=tuple(out))

    def alter_offsets(self, principal: str, group_id: str,
                      targets: dict[str, dict[int, int]]) -> ShareGroupOffsets:
        """AlterShareGroupOffsets (an admin's reset; the caller checked the group has no members):
        each share-partition's new start offset, written to ``__share_group_state``."""
        if not self.access.allows(principal, AclOperation.READ, ResourceType.GROUP, group_id):
            return ShareGroupOffsets(group_id=group_id, error=GroupAuthorizationFailed(
                f"{principal} is not authorized to READ on GROUP {group_id!r}"))
        infos = self.manager.store.topics()
        out = []
        for topic, offsets in targets.items():
            info = infos.get(topic)
            for partition, offset in offsets.items():
                error: LowtideError | None = None
                if info is None or not 0 <= partition < info.partitions:
                    error = UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
                elif not self.access.allows(principal, AclOperation.READ, ResourceType.TOPIC, topic):
                    error = TopicAuthorizationFailed(f"{principal} is not authorized to READ on TOPIC {topic!r}")
                elif offset < 0:
                    error = InvalidRequest(f"start offset {offset} of {topic}-{partition} is negative")
                else:
                    try:
                        self.shares.reset(ShareStateKey(group_id=group_id, topic_id=info.topic_id,
                                                        partition=partition), offset)
                    except LowtideError as err:
                        error = err
                out.append(ShareStartOffset(topic=topic, topic_id=info.topic_id if info else "", partition=partition,
                                            start_offset=offset, error=error))
        return ShareGroupOffsets(group_id=group_id, partitions=tuple(out))

    def delete_offsets(self, principal: str, group_id: str,
                       topics: list[str]) -> list[tuple[str, str, LowtideError | None]]:
        """DeleteShareGroupOffsets (the caller checked the group has no members): the group's
        share-partition states of ``topics`` are deleted; (topic, topic id, error) per topic.
        DELETE on the GROUP is needed for the call (GROUP_AUTHORIZATION_FAILED, raised), READ on
        each TOPIC for that topic."""
        if not self.access.allows(principal, AclOperation.DELETE, ResourceType.GROUP, group_id):
            raise GroupAuthorizationFailed(f"{principal} is not authorized to DELETE on GROUP {group_id!r}")
        infos = self.manager.store.topics()
        out: list[tuple[str, str, LowtideError | None]] = []
        wanted: set[str] = set()
        for topic in topics:
            info = infos.get(topic)
            if info is None:
                out.append((topic, "", UnknownTopicOrPartition(f"topic {topic!r} does not exist")))
            elif not self.access.allows(principal, AclOperation.READ, ResourceType.TOPIC, topic):
                out.append((topic, info.topic_id, TopicAuthorizationFailed(
                    f"{principal} is not authorized to READ on TOPIC {topic!r}")))
            else:
                out.append((topic, info.topic_id, None))
                wanted.add(info.topic_id)
        if wanted:
            try:
                self.shares.delete_offsets(group_id, frozenset(wanted))
            except LowtideError as err:
                out = [(t, i, e if e is not None or i not in wanted else err) for t, i, e in out]
        return out

    def _find_leader(self, principal: str, topics: dict, topic_id: str, partition: int, *,
                     read_committed: bool = False) -> tuple[LowtideError | None, Callable[[], LeaderLog] | None]:
        info = topics.get(topic_id)
        if info is None:
            return UnknownTopicId(f"no topic has id {topic_id}"), None
        if not self.access.allows(principal, AclOperation.READ, ResourceType.TOPIC, info.name):
            return TopicAuthorizationFailed(f"{principal} is not authorized to READ on TOPIC {info.name!r}"), None
        try:
            part = self.manager.get_partition(info.name, partition)
            part.check_leader()
        except LowtideError as err:
            return err, None
        plog = part.log

        def leader() -> LeaderLog:
            part.check_leader()
            # A read_committed group's share-partition ends at the last stable offset, and learns
            # which of what it acquires belongs to aborted transactions (share/partitions.py).
            end = plog.last_stable_offset if read_committed else plog.high_watermark
            return LeaderLog(leader_epoch=part.leader_epoch, log_start_offset=plog.log_start_offset,
                             high_watermark=end,
                             read=lambda offset, max_bytes: plog.read(offset, max_bytes=max_bytes, max_offset=end),
                             aborted=(lambda start, stop: [(a.producer_id, a.first_offset, a.last_offset)
                                                           for a in plog.aborted_transactions(start, stop)])
                             if read_committed else None)

        return None, leader

    def _acknowledge(self, ask: ShareFetchAsk, p: SharePartitionAsk, key: ShareStateKey,
                     leader: Callable[[], LeaderLog]) -> SharePartitionAnswer:
        try:
            self.shares.acknowledge(key=key, member_id=ask.member_id, leader=leader(), batches=p.acknowledgements)
        except LowtideError as err:
            return SharePartitionAnswer(topic_id=p.topic_id, partition=p.partition, acknowledge_error=err)
        return SharePartitionAnswer(topic_id=p.topic_id, partition=p.partition)

    def _acquire(self, ask: ShareFetchAsk, readable: dict, answers: dict[tuple[str, int], SharePartitionAnswer],
                 *, wake_keys: list) -> None:
        deadline = time.monotonic() + min(max(ask.max_wait_ms, 0), MAX_WAIT_MS) / 1000
        per_partition = max(1, min(PARTITION_MAX_BYTES, ask.max_bytes))
        registry = self.manager.registry
        woken = threading.Event()
        registry.register_waiter(wake_keys, woken)
        try:
            while True:
                woken.clear()  # before trying: a change while we try makes the wait return at once
                if self._try_acquire(ask, readable, answers, per_partition):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                woken.wait(left)
        finally:
            registry.unregister_waiter(wake_keys, woken)

    def _try_acquire(self, ask: ShareFetchAsk, readable: dict, answers: dict[tuple[str, int], SharePartitionAnswer],
                     per_partition: int) -> bool:
        """One pass over the partitions; whether the answer is ready: records acquired, or an error
        to tell the member (a partition it must look for elsewhere is not waited out)."""
        left = ask.max_records
        got_any = False
        for k, (key, leader) in readable.items():
            if left <= 0:
                break
            try:
                ranges, data = self.shares.acquire(key=key, member_id=ask.member_id, leader=leader(),
                                                   max_records=left, max_bytes=per_partition)
            except LowtideError as err:
                answers[k] = _merge_answer(answers.get(k), k, error=err)
                got_any = True
                continue
            if ranges:
                got_any = True
                left -= sum(r.last - r.first + 1 for r in ranges)
                answers[k] = _merge_answer(answers.get(k), k, records=data, acquired=tuple(ranges))
        return got_any


def _count_lag(snapshot: ShareSnapshot, high_watermark: int) -> int:
    """Records from the start offset to the high watermark not yet acknowledged or archived."""
    done = sum(min(b.last, high_watermark - 1) - max(b.first, snapshot.start_offset) + 1
               for b in snapshot.batches if b.state in (ACKNOWLEDGED, ARCHIVED)
               and b.last >= snapshot.start_offset and b.first < high_watermark)
    return max(0, high_watermark - snapshot.start_offset - done)


def _merge_answer(answer: SharePartitionAnswer | None, k: tuple[str, int], *, error: LowtideError | None = None,
          records: bytes = b"", acquired: tuple[AcquiredRange, ...] = ()) -> SharePartitionAnswer:
    ack_error = None if answer is None else answer.acknowledge_error
    return SharePartitionAnswer(topic_id=k[0], partition=k[1], error=error, acknowledge_error=ack_error,
                                records=records, acquired=acquired)
