"""The broker-side consumed retention rule (KIP-68): segments + commits + config + now -> the new
log start offset, or the reason there is none."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidConfig
from lowtide.groups import TopicCommit
from lowtide.replica.consumed_retention import ConsumedRetentionConfig, SegmentInfo, decide_log_start_offset

NOW = 1_000_000
OLD = NOW - 10_000
# Three sealed segments [0,100) [100,200) [200,300) and an active one [300,350), all old.
SEGMENTS = [SegmentInfo(0, 100, OLD, 1000), SegmentInfo(100, 200, OLD, 1000), SegmentInfo(200, 300, OLD, 1000),
            SegmentInfo(300, 350, OLD, 500)]


def decide(commits, *, segments=SEGMENTS, lso=0, hw=350, now=NOW, **config):
    cfg = ConsumedRetentionConfig(**{"retention_ms": 1000, **config})
    return decide_log_start_offset(topic="t", partition=0, segments=segments, log_start_offset=lso,
                                   high_watermark=hw, commits=commits, config=cfg, now_ms=now)


def at(offset, ts=NOW):
    return {0: TopicCommit(offset=offset, commit_timestamp=ts)}


def test_only_segments_below_the_slowest_group_go():
    decision = decide({"fast": at(340), "slow": at(250)})
    assert (decision.log_start_offset, decision.target) == (200, 250)


def test_with_mode_any_the_furthest_group_decides():
    assert decide({"fast": at(340), "slow": at(250)}, mode="any").log_start_offset == 300


def test_a_segment_goes_only_when_its_last_offset_is_below_the_commit():
    assert decide({"g": at(199)}).log_start_offset == 100
    assert decide({"g": at(200)}).log_start_offset == 200


def test_segments_modified_within_consumed_retention_ms_stay():
    young = [SEGMENTS[0], SegmentInfo(100, 200, NOW - 500, 1000), *SEGMENTS[2:]]
    decision = decide({"g": at(340)}, segments=young)
    assert decision.log_start_offset == 100


def test_the_whole_log_may_go_when_everything_was_consumed_long_ago():
    assert decide({"g": at(350)}).log_start_offset == 350


def test_nothing_above_the_high_watermark_goes():
    assert decide({"g": at(340)}, hw=250).log_start_offset == 200


def test_no_group_means_nothing_is_deleted():
    decision = decide({})
    assert decision.log_start_offset is None and "no consumer group" in decision.reason


def test_a_group_without_a_commit_on_the_partition_deletes_nothing():
    decision = decide({"fast": at(340), "slow": {1: TopicCommit(300, NOW)}})
    assert decision.log_start_offset is None and "slow has no committed offset for t-0" in decision.reason


def test_a_listed_group_that_never_committed_deletes_nothing():
    decision = decide({"fast": at(340)}, groups=("fast", "ghost"))
    assert decision.log_start_offset is None and "ghost is listed" in decision.reason


def test_only_the_listed_groups_count():
    assert decide({"fast": at(340), "slow": at(50)}, groups=("fast",)).log_start_offset == 300


def test_an_inactive_group_stops_counting_only_when_inactivity_is_configured():
    commits = {"fast": at(340), "dead": at(50, ts=NOW - 100_000)}
    assert decide(commits).log_start_offset is None  # dead pins it: 50 is inside the first segment
    decision = decide(commits, group_inactive_ms=60_000)
    assert (decision.log_start_offset, decision.inactive_groups) == (300, ("dead",))


def test_when_every_group_is_inactive_nothing_is_deleted():
    decision = decide({"dead": at(340, ts=NOW - 100_000)}, group_inactive_ms=60_000)
    assert decision.log_start_offset is None and "every group is inactive" in decision.reason


def test_nothing_new_to_delete_says_so():
    decision = decide({"g": at(150)}, lso=100)
    assert decision.log_start_offset is None and decision.target == 150


def test_config_is_read_from_topic_config_strings():
    cfg = ConsumedRetentionConfig.from_topic_config({
        "consumed.retention.ms": "0", "consumed.retention.groups": "a, b", "consumed.retention.mode": "any",
        "consumed.retention.group.inactive.ms": "5"})
    assert cfg == ConsumedRetentionConfig(retention_ms=0, groups=("a", "b"), mode="any", group_inactive_ms=5)
    assert not ConsumedRetentionConfig.from_topic_config({}).enabled


@pytest.mark.parametrize("config", [{"consumed.retention.mode": "most"}, {"consumed.retention.ms": "x"},
                                    {"consumed.retention.group.inactive.ms": "-5"}])
def test_a_bad_config_is_invalid_config(config):
    with pytest.raises(InvalidConfig):
        ConsumedRetentionConfig.from_topic_config(config)
