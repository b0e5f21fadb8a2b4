"""Fakes of what the internal topics' runtime is handed: a store, a router, a transport."""

from __future__ import annotations

from lowtide.errors import LowtideError, TopicAlreadyExists, UnknownTopicOrPartition
from lowtide.messages.replica import ProducedPartition
from lowtide.metadata.model import TopicInfo
from lowtide.rpc.steps import Blocking


class FakeStore:
    """``topic`` from a dict; ``created_by_other`` makes the next create lose a race."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicInfo] = {}

    def topic(self, name: str) -> TopicInfo:
        if name not in self.topics:
            raise UnknownTopicOrPartition(f"topic '{name}' does not exist")
        return self.topics[name]


class FakeRouter:
    """Leaders from a list of answers (an address, or an error to raise), the last one repeated."""

    def __init__(self, *answers: str | LowtideError, cached: str | None = None) -> None:
        self.answers = list(answers)
        self.cached = cached
        self.lookups: list[bool] = []
        self.forgotten = 0

    def cached_leader(self, partition: int) -> str | None:
        return self.cached

    def find_leader(self, partition: int, *, refresh: bool) -> str:
        self.lookups.append(refresh)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, LowtideError):
            raise answer
        return answer

    def forget_leader(self, partition: int) -> None:
        self.forgotten += 1
        self.cached = None


class FakeProduce:
    """A transport answering from a list: a base offset, an error answer, or an error to raise."""

    def __init__(self, *answers: int | LowtideError | tuple[str, LowtideError], blocking: bool = True) -> None:
        self.answers = list(answers)
        self.blocking = blocking
        self.calls: list[dict] = []

    def __call__(self, address, partition, batches, *, timeout_ms, expected_end_offset, loop):
        self.calls.append(dict(address=address, partition=partition, timeout_ms=timeout_ms,
                               expected_end_offset=expected_end_offset, loop=loop))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if self.blocking:
            yield Blocking(lambda: None)
        if isinstance(answer, tuple):
            raise answer[1]
        if isinstance(answer, LowtideError):
            return ProducedPartition(topic="t", partition=partition, error=answer)
        return ProducedPartition(topic="t", partition=partition, base_offset=answer)


def topic_info(name: str, partitions: int) -> TopicInfo:
    return TopicInfo(name=name, topic_id="id-" + name, partitions=partitions, replication_factor=3)


__all__ = ["FakeProduce", "FakeRouter", "FakeStore", "TopicAlreadyExists", "topic_info"]
