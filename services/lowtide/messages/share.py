"""Messages of KIP-932 share fetching at a partition leader: ShareFetch and ShareAcknowledge as the
replica's share handler takes and answers them (``replica/share_handler.py``), from the Kafka
listener (``kafka/apis_share.py``). Topic ids are the metadata's 32-hex-digit ids."""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.errors import LowtideError

# Kafka's AcknowledgeType codes (0: a gap, an offset with no record; 4: renew the lock), the same
# numbers as ``lowtide.share.state``'s, for clients that may not import the state machine.
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
ACKNOWLEDGE_TYPE_NAMES = {"gap": GAP, "accept": ACCEPT, "release": RELEASE, "reject": REJECT, "renew": RENEW}

# A share session's epochs (Kafka's ShareRequestMetadata): 0 opens one, -1 closes it, and each
# answered request moves it on by one, from the largest int32 back to 1 (0 would reopen it).
MAX_SESSION_EPOCH = 2**31 - 1


def next_session_epoch(epoch: int) -> int:
    """The epoch of the request after one at ``epoch`` was answered: the member and the leader
    both count this way, so they must agree on where it wraps."""
    return 1 if epoch == MAX_SESSION_EPOCH else epoch + 1


@dataclass(frozen=True, slots=True)
class ShareAckBatch:
    """One AcknowledgementBatch: ``types`` is one type for all of ``first``..``last``, or one per
    offset (0 gap, 1 accept, 2 release, 3 reject, 4 renew)."""

    first: int
    last: int
    types: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SharePartitionAsk:
    topic_id: str
    partition: int
    acknowledgements: tuple[ShareAckBatch, ...] = ()


@dataclass(frozen=True, slots=True)
class ShareFetchAsk:
    """One ShareFetch (``fetch=False``: a ShareAcknowledge, which acquires nothing)."""

    group_id: str
    member_id: str
    session_epoch: int
    partitions: tuple[SharePartitionAsk, ...]
    forgotten: tuple[tuple[str, int], ...] = ()
    max_wait_ms: int = 0
    min_bytes: int = 1
    max_bytes: int = 50 << 20
    max_records: int = 500
    fetch: bool = True


@dataclass(frozen=True, slots=True)
class AcquiredRange:
    first: int
    last: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class SharePartitionAnswer:
    topic_id: str
    partition: int
    error: LowtideError | None = None
    acknowledge_error: LowtideError | None = None
    records: bytes = b""
    acquired: tuple[AcquiredRange, ...] = ()
    leader_id: int = -1
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ShareFetchAnswer:
    """``error``: the whole request's (a session error); else one answer per partition."""

    error: LowtideError | None = None
    partitions: tuple[SharePartitionAnswer, ...] = ()
    lock_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class ShareStartOffset:
    """One share-partition in DescribeShareGroupOffsets: its durable start offset (-1: no state),
    and the records from there to the high watermark not yet done (-1: unknown here)."""

    topic: str
    topic_id: str
    partition: int
    start_offset: int = -1
    leader_epoch: int = -1
    lag: int = -1
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class ShareGroupOffsets:
    group_id: str
    partitions: tuple[ShareStartOffset, ...] = ()
    error: LowtideError | None = None
