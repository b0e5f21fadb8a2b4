"""The internal topic's creation on first need (lowtide/internal_topics/topic.py)."""

from __future__ import annotations

import pytest

from lowtide.errors import CoordinatorNotAvailable, TopicAlreadyExists
from lowtide.internal_topics import InternalTopic, InternalTopicSpec, ensure_topic
from tests.unit.internal_topics.fakes import FakeStore, topic_info

SPEC = InternalTopicSpec(name="__internal", partitions=4, config={"cleanup.policy": "compact"})


def test_an_existing_topic_is_read_not_created():
    store = FakeStore()
    store.topics["__internal"] = topic_info("__internal", 3)
    assert ensure_topic(store, SPEC, lambda spec: pytest.fail("created")) == (store.topics["__internal"], False)


def test_a_missing_topic_is_created_from_its_spec_or_not_at_all_without_a_creator():
    store = FakeStore()
    assert ensure_topic(store, SPEC, None) == (None, False)
    made = []

    def create(spec):
        made.append(spec)
        return topic_info(spec.name, spec.partitions)

    info, created = ensure_topic(store, SPEC, create)
    assert created and info.partitions == 4 and made == [SPEC]


def test_a_lost_creation_race_reads_the_winners_topic():
    store = FakeStore()

    def create(spec):
        store.topics[spec.name] = topic_info(spec.name, 7)  # another server, meanwhile
        raise TopicAlreadyExists(spec.name)

    assert ensure_topic(store, SPEC, create) == (store.topics["__internal"], False)


def test_other_creation_errors_are_raised_as_they_are():
    def create(spec):
        raise CoordinatorNotAvailable("no")

    with pytest.raises(CoordinatorNotAvailable):
        ensure_topic(FakeStore(), SPEC, create)


def test_the_partition_count_is_cached_and_on_created_runs_once_after_it_is():
    store = FakeStore()
    seen = []
    topic = None

    def create(spec):
        store.topics[spec.name] = info = topic_info(spec.name, spec.partitions)
        return info

    def on_created(info):
        seen.append((info.partitions, topic.partition_count(create=False)))  # cached already

    topic = InternalTopic(spec=SPEC, store=store, create=create, on_created=on_created)
    assert topic.partition_count(create=False) is None
    assert topic.partition_count() == 4
    del store.topics["__internal"]  # read once: not looked up again
    assert topic.partition_count() == 4
    assert seen == [(4, 4)]


def test_a_reader_notes_the_partition_count_it_found():
    topic = InternalTopic(spec=SPEC, store=FakeStore(), create=lambda spec: pytest.fail("created"))
    topic.note_partitions(9)
    assert topic.partition_count() == 9
