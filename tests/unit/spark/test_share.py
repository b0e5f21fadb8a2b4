"""Share group reads of the data source (spark/share.py, spark/options.py): which options make a
share read and how its tasks are planned and bounded."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidConfig
from lowtide.spark.options import parse_read_options
from lowtide.spark.share import ShareTask, plan_share_tasks

BASE = {"bootstrap.servers": "fd:9090", "subscribe": "jobs"}


def test_a_share_group_option_makes_a_share_read_starting_earliest_in_batch_and_at_the_default_in_streaming():
    batch = parse_read_options({**BASE, "lowtide.share.group": "etl"}, streaming=False).share
    stream = parse_read_options({**BASE, "lowtide.share.group": "etl"}, streaming=True).share
    assert (batch.group, batch.start, batch.max_records) == ("etl", "earliest", None)
    assert (stream.start, stream.max_records) == (None, None)
    assert parse_read_options(BASE, streaming=False).share is None


def test_streaming_bounds_a_micro_batch_by_the_smaller_of_max_records_and_max_offsets_per_trigger():
    opts = {**BASE, "lowtide.share.group": "etl", "lowtide.share.max.records": "500", "maxOffsetsPerTrigger": "200"}
    assert parse_read_options(opts, streaming=True).share.max_records == 200
    assert parse_read_options(opts, streaming=False).share.max_records == 500


@pytest.mark.parametrize("extra", [
    {"endingOffsets": "latest"}, {"lowtide.group.id": "g"},
    {"startingOffsets": '{"jobs":{"0":5}}'}, {"startingOffsets": "latest", "lowtide.share.max.records": "0"},
])
def test_options_a_share_read_cannot_honour_are_refused(extra):
    with pytest.raises(InvalidConfig):
        parse_read_options({**BASE, "lowtide.share.group": "etl", **extra}, streaming=False)


def test_max_records_without_a_share_group_is_refused():
    with pytest.raises(InvalidConfig, match="needs lowtide.share.group"):
        parse_read_options({**BASE, "lowtide.share.max.records": "10"}, streaming=False)


def test_one_task_per_partition_with_pending_records_each_bounded_by_the_high_watermark_of_planning():
    tasks = plan_share_tasks({("t", 0): 10, ("t", 1): 0, ("t", 2): 5}, {("t", 0): 40, ("t", 1): 7, ("t", 2): 9})
    assert tasks == [ShareTask("t", 0, 40), ShareTask("t", 2, 9)]
    assert plan_share_tasks({("t", 0): 0}, {("t", 0): 3}) == []


def test_max_records_is_shared_by_what_each_partition_has_and_min_partitions_splits_the_big_ones():
    pending = {("t", 0): 300, ("t", 1): 100}
    ends = {("t", 0): 300, ("t", 1): 100}
    tasks = plan_share_tasks(pending, ends, max_records=200)
    assert [(t.partition, t.max_records) for t in tasks] == [(0, 150), (1, 50)]
    split = plan_share_tasks(pending, ends, min_partitions=4, max_records=200)
    assert [(t.partition, t.max_records) for t in split] == [(0, 50), (0, 50), (0, 50), (1, 50)]
    # Fewer records than tasks: every task may still take one, so none stalls.
    assert {t.max_records for t in plan_share_tasks(pending, ends, min_partitions=4, max_records=2)} == {1}
