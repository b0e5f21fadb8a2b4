"""Appending to an internal topic: acks=all, conditional or not, with one retry/back-off policy.

Every internal topic's writer sends one Produce with acks=all to the partition's leader and, while
leadership settles (no leader yet, a leader that just moved, too few in-sync replicas), tries
again after a back-off that grows 50 ms per attempt up to 0.5 s, until its deadline. What differs
between the users is which failures they may retry and what they raise when they give up, so that
is the ``AppendPolicy`` each passes; the loop is this one:

- the front door's (``__consumer_offsets``, ``__transaction_state``) retries every retriable
  failure, including a call that failed midway (an offset commit written twice is harmless, and a
  conditional append written once is refused the second time), gives each attempt what is left of
  the deadline, and gives up with COORDINATOR_NOT_AVAILABLE;
- the coordinator's metadata log retries only answers that say nothing was written (a batch
  appended twice would be applied twice), raises a failed call as it is (the caller reloads from
  the log), gives each attempt the whole timeout, and gives up with the last answer's error.

A conditional append (replica.proto ``expected_log_end_offset``) is answered
OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended, unless the log ends at the expected offset: the
compare-and-set of ``__transaction_state`` and the fencing of the metadata log; it is never retried
here (not retriable).

The loop is written as steps (``lowtide.rpc.steps``): the coordinator drives it on its event loop,
where the transport's Produce answers land (its framed listener), and a front door thread drives it
with ``run_blocking``. What may block (a leader lookup, a gRPC Produce) is a ``Blocking``; the leader
cached by the router is used without one, so an append on the loop costs no thread hand-off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from lowtide.client.replica import ReplicaClient
from lowtide.errors import LowtideError
from lowtide.internal_topics.topic import LeaderRouter
from lowtide.messages.replica import ProducedPartition
from lowtide.rpc.steps import Blocking, Sleep, Steps, run_blocking


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The back-off between attempts of a call to an internal topic's leader: ``step_s`` times the
    attempt number, at most ``max_backoff_s``; no attempt starts if its back-off would end past
    the deadline. Immutable: shared by every caller."""

    step_s: float = 0.05
    max_backoff_s: float = 0.5

    def backoff_s(self, attempt: int) -> float:
        """How long to wait before attempt ``attempt`` (1 for the first retry)."""
        return min(self.max_backoff_s, self.step_s * attempt)

    def has_time(self, attempt: int, deadline: float) -> bool:
        """Whether attempt ``attempt`` may still start before ``deadline`` (``time.monotonic()``)."""
        return time.monotonic() + self.step_s * attempt <= deadline

    def sleep(self, attempt: int) -> None:
        """Back off before attempt ``attempt``, on this thread."""
        time.sleep(self.backoff_s(attempt))


def _is_retriable(error: LowtideError) -> bool:
    return error.retriable


@dataclass(frozen=True)
class AppendPolicy:
    """Which failures an ``Appender`` retries and how it gives up (module doc).

    ``retry_on``: the failures (a leader lookup's, a call's, an answer's) tried again.
    ``call_errors_final``: a call that raised (a timeout, a lost connection: the batches may or may
    not be in the log) is raised as it is, never retried. ``whole_timeout_each_attempt``: each
    Produce waits the whole timeout for the in-sync replicas (else what is left of it).
    ``give_up``: what is raised when the deadline passes with a retriable failure, from the topic
    partition's name and that failure (None: the failure itself). Immutable: shared by every caller.
    """

    retry: RetryPolicy = RetryPolicy()
    retry_on: Callable[[LowtideError], bool] = _is_retriable
    call_errors_final: bool = False
    whole_timeout_each_attempt: bool = False
    give_up: Callable[[str, LowtideError], LowtideError] | None = None


class ProduceSteps(Protocol):
    """One acks=all Produce of ``batches`` to partition ``partition`` at the leader ``address``, as
    steps; raises LowtideError when the call fails, returns the leader's answer otherwise. ``loop``:
    the event loop the steps are driven on, if any (a transport may answer on it)."""

    def __call__(self, address: str, partition: int, batches: bytes, *, timeout_ms: int,
                 expected_end_offset: int | None, loop: asyncio.AbstractEventLoop | None
                 ) -> Steps[ProducedPartition]: ...


def grpc_produce(replicas: ReplicaClient, topic: str) -> ProduceSteps:
    """The gRPC transport: a unary Produce (a ``Blocking``: it parks the thread that runs it)."""

    def produce(address: str, partition: int, batches: bytes, *, timeout_ms: int, expected_end_offset: int | None,
                loop: asyncio.AbstractEventLoop | None) -> Steps[ProducedPartition]:
        got = yield Blocking(partial(
            replicas.produce, address, [(topic, partition, batches)], acks=-1, timeout_ms=timeout_ms,
            deadline_s=timeout_ms / 1000 + 5, coordinator_append=True,
            expected_end_offsets=None if expected_end_offset is None else {(topic, partition): expected_end_offset}))
        return got[0]

    return produce


class Appender:
    """Appends batches to the partitions of one internal topic with acks=all (module doc).

    Contract: ``append_steps`` (and ``append``, the same on this thread) returns the base offset the
    leader assigned, only once it acknowledged the batches with acks=all; otherwise it raises what
    the policy says: a non-retried failure as it is, a retried one past the deadline through
    ``policy.give_up``. A conditional append (``expected_end_offset``) refused by the leader raises
    OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended.

    Thread-safety: holds no per-call state; as thread-safe as its router and transport (the
    steps of one call run on one thread at a time).
    """

    def __init__(self, *, topic: str, router: LeaderRouter, produce: ProduceSteps,
                 policy: AppendPolicy = AppendPolicy()) -> None:
        self.topic = topic
        self.router = router
        self.produce = produce
        self.policy = policy

    def append(self, partition: int, batches: bytes, *, timeout_ms: int, expected_end_offset: int | None = None) -> int:
        """``append_steps`` driven on this thread."""
        return run_blocking(self.append_steps(partition, batches, timeout_ms=timeout_ms,
                                              expected_end_offset=expected_end_offset))

    def append_steps(self, partition: int, batches: bytes, *, timeout_ms: int, expected_end_offset: int | None = None,
                     loop: asyncio.AbstractEventLoop | None = None) -> Steps[int]:
        """Append ``batches`` to ``partition`` as steps (class doc); ``loop`` is handed to the transport."""
        policy, router = self.policy, self.router
        deadline = time.monotonic() + timeout_ms / 1000
        attempt = 0
        while True:
            problem: LowtideError | None = None
            address = router.cached_leader(partition) if attempt == 0 else None
            if address is None:
                try:  # a lookup in the metadata store
                    address = yield Blocking(partial(router.find_leader, partition, refresh=attempt > 0))
                except LowtideError as exc:
                    problem = exc
            if problem is None:
                attempt_ms = timeout_ms if policy.whole_timeout_each_attempt else \
                    max(1, int((deadline - time.monotonic()) * 1000))
                try:
                    got = yield from self.produce(address, partition, batches, timeout_ms=attempt_ms,
                                                  expected_end_offset=expected_end_offset, loop=loop)
                except LowtideError as exc:
                    if policy.call_errors_final:
                        router.forget_leader(partition)
                        raise
                    problem = exc
                else:
                    if got.error is None:
                        return got.base_offset
                    problem, got = got.error, None
            router.forget_leader(partition)
            attempt += 1
            if not policy.retry_on(problem):
                break
            if not policy.retry.has_time(attempt, deadline):
                if policy.give_up is not None:
                    problem = policy.give_up(f"{self.topic}-{partition}", problem)
                break
            yield Sleep(policy.retry.backoff_s(attempt))
        try:
            raise problem
        finally:
            # The error's traceback holds this frame; were the frame to hold the error, the two
            # would be a cycle only the cyclic GC frees, with the caller's frames and the group of
            # requests they hold (a refused conditional append is routine with two in flight).
            problem = None  # noqa: F841
