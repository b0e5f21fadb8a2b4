"""KIP-107 DeleteRecords, front-door side: validate, authorize, fan out to the leaders, retry.

Per partition (docs/design/kip-107-delete-records.md#request-and-answers):

* the same partition twice in one request -> the whole request fails with INVALID_REQUEST;
* principal lacks DELETE on the topic -> TOPIC_AUTHORIZATION_FAILED, low watermark -1, while the
  authorized partitions of the same request proceed;
* unknown topic or partition -> UNKNOWN_TOPIC_OR_PARTITION;
* otherwise one Replica.DeleteRecords per leader, all leaders in parallel, each given the time left;
  NOT_LEADER_OR_FOLLOWER, an unreachable leader or no leader -> refresh metadata and retry those
  partitions after a short backoff while time remains, else report the last error. POLICY_VIOLATION,
  OFFSET_OUT_OF_RANGE and REQUEST_TIMED_OUT come from the leader as they are.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from prometheus_client import Counter, Histogram

from lowtide.auth.acl import AclOperation, Authorizer, ResourceType
from lowtide.client.replica import ReplicaClient
from lowtide.errors import (
    InvalidRequest,
    LowtideError,
    NotLeaderOrFollower,
    RequestTimedOut,
    TopicAuthorizationFailed,
)
from lowtide.frontdoor.admin.diskless import DisklessTopicAdmin
from lowtide.frontdoor.routing import route_partitions
from lowtide.messages import TopicPartition
from lowtide.messages.admin import DeleteRequestItem
from lowtide.messages.replica import DeleteRecordsResult
from lowtide.metadata.cache import MetadataCache
from lowtide.metadata.store import MetadataStore

DEFAULT_TIMEOUT_MS = 30_000
# Slack added to the gRPC deadline over the timeout the leader itself honours, so the leader's own
# REQUEST_TIMED_OUT answer (with per-partition detail) arrives before our deadline cuts it off.
DEADLINE_SLACK_S = 1.0
RETRY_BACKOFF_S = (0.005, 0.01, 0.02, 0.05, 0.1)


# Module-level, so registered once per process however many front doors it builds (tests build
# several): no lookup in the registry's private tables is needed.
DELETE_RECORDS_DURATION = Histogram(
    "lowtide_delete_records_duration_seconds",
    "Front-door DeleteRecords call duration, from request to the last partition's result",
    buckets=(0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
             2.5, 5.0, 10.0, 30.0, 60.0))
DELETE_RECORDS_TOTAL = Counter(
    "lowtide_delete_records", "DeleteRecords partition results by result (error name or NONE)", ["result"])


class RecordsDeleter:
    """Runs DeleteRecords requests (module doc has the per-partition contract).

    Results come back in request order. Thread-safe: per-call state lives on the stack; the
    metadata store, authorizer, gateway and the fan-out pool are shared and thread-safe.
    """

    def __init__(self, *, store: MetadataStore, authorizer: Authorizer, replicas: ReplicaClient,
                 pool: ThreadPoolExecutor, default_timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 diskless: DisklessTopicAdmin | None = None, cache: MetadataCache | None = None) -> None:
        self._store = store
        self._cache = cache  # first attempts route from it; retries read Redis
        self._diskless = diskless  # diskless partitions go to their coordinator shard (KIP-1164)
        self._authorizer = authorizer
        self._replicas = replicas
        self._pool = pool
        self._default_timeout_ms = default_timeout_ms

    def delete_records(self, *, principal: str, items: Sequence[DeleteRequestItem],
                       timeout_ms: int = 0) -> list[DeleteRecordsResult]:
        started = time.monotonic()
        validate_unique_partitions(items)
        timeout_ms = timeout_ms if timeout_ms > 0 else self._default_timeout_ms
        deadline = started + timeout_ms / 1000
        answers: dict[TopicPartition, DeleteRecordsResult] = {}
        offsets: dict[TopicPartition, int] = {}
        allowed_topics: dict[str, bool] = {}
        for item in items:
            key = (item.topic, item.partition)
            allowed = allowed_topics.get(item.topic)
            if allowed is None:
                allowed = allowed_topics[item.topic] = self._authorizer.authorize(
                    principal=principal, operation=AclOperation.DELETE, resource_type=ResourceType.TOPIC,
                    resource_name=item.topic)
            if allowed:
                offsets[key] = item.offset
            else:
                answers[key] = _failed(item.topic, item.partition, TopicAuthorizationFailed(
                    f"{principal} is not authorized to DELETE on TOPIC {item.topic!r}"))
        diskless = self._diskless.split(offsets) if self._diskless is not None else {}
        if diskless:
            answers.update(self._diskless.delete_records({k: offsets.pop(k) for k in diskless}, diskless,
                                                         timeout_ms=timeout_ms))
        answers.update(self._delete_with_retries(offsets, deadline))
        results = [answers[(i.topic, i.partition)] for i in items]
        DELETE_RECORDS_DURATION.observe(time.monotonic() - started)
        for r in results:
            DELETE_RECORDS_TOTAL.labels(result=r.error.name if r.error is not None else "NONE").inc()
        return results

    def _delete_with_retries(self, offsets: dict[TopicPartition, int],
                             deadline: float) -> dict[TopicPartition, DeleteRecordsResult]:
        answers: dict[TopicPartition, DeleteRecordsResult] = {}
        pending = dict(offsets)
        # The last retriable error per partition survives the attempts: when time runs out before
        # another call could be made, the caller learns why (NOT_LEADER_OR_FOLLOWER...), not a
        # bare timeout.
        last_errors: dict[TopicPartition, LowtideError] = {}
        attempt = 0
        while pending:
            routes = route_partitions(self._store, pending, cache=self._cache if attempt == 0 else None)
            for key, error in routes.unknown.items():
                answers[key] = _failed(*key, error)
                pending.pop(key)
            retry: dict[TopicPartition, LowtideError] = dict(routes.unroutable)
            last_errors.update(routes.unroutable)
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if routes.by_address and remaining_ms > 0:
                for key, answer in self._call_leaders(routes.by_address, pending, remaining_ms).items():
                    # The leader moved, has not been elected yet or could not be reached: retry
                    # against freshly read metadata.
                    if answer.error is not None and answer.error.invalid_metadata:
                        retry[key] = last_errors[key] = answer.error
                    else:
                        answers[key] = answer
                        pending.pop(key)
            backoff = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
            if not retry or time.monotonic() + backoff >= deadline:
                for key in list(pending):
                    error = retry.get(key) or last_errors.get(key) or RequestTimedOut(
                        f"{key[0]}-{key[1]}: no leader answered in time")
                    answers[key] = _failed(*key, error)
                return answers
            for key in list(pending):
                if key not in retry:
                    pending.pop(key)  # defensive: a leader that left a partition out of its answer
                    answers[key] = _failed(*key, NotLeaderOrFollower(
                        f"{key[0]}-{key[1]}: the leader did not answer for this partition"))
            time.sleep(backoff)
            attempt += 1
        return answers

    def _call_leaders(self, by_address: dict[str, list[TopicPartition]], offsets: dict[TopicPartition, int],
                      remaining_ms: int) -> dict[TopicPartition, DeleteRecordsResult]:
        def call(address: str, keys: list[TopicPartition]) -> dict[TopicPartition, DeleteRecordsResult]:
            items = [(t, p, offsets[(t, p)]) for t, p in keys]
            try:
                got = self._replicas.delete_records(address, items, timeout_ms=remaining_ms,
                                                    deadline_s=remaining_ms / 1000 + DEADLINE_SLACK_S)
            except LowtideError as err:
                return {k: _failed(*k, err) for k in keys}
            by_key = {(a.topic, a.partition): a for a in got}
            return {k: by_key.get(k) or _failed(*k, NotLeaderOrFollower(
                f"leader at {address} did not answer for {k[0]}-{k[1]}")) for k in keys}

        groups = list(by_address.items())
        if len(groups) == 1:  # the common case: no thread hop on the latency path
            return call(*groups[0])
        futures: list[Future] = [self._pool.submit(call, address, keys) for address, keys in groups]
        out: dict[TopicPartition, DeleteRecordsResult] = {}
        for future in futures:
            out.update(future.result())
        return out


def validate_unique_partitions(items: Sequence[DeleteRequestItem]) -> None:
    """Reject the whole request when a partition appears twice (kafka-delete-records.sh does)."""
    seen: set[TopicPartition] = set()
    for item in items:
        key = (item.topic, item.partition)
        if key in seen:
            raise InvalidRequest(f"partition {item.topic}-{item.partition} appears more than once in the request")
        seen.add(key)


def _failed(topic: str, partition: int, error: LowtideError) -> DeleteRecordsResult:
    return DeleteRecordsResult(topic=topic, partition=partition, low_watermark=-1, error=error)
