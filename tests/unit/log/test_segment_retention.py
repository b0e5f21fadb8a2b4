"""segment_retention: which leading segments retention.ms and retention.bytes delete."""

from dataclasses import dataclass

from lowtide.log.log_config import LogConfig
from lowtide.log.segment_retention import count_segments_past_retention


@dataclass
class Seg:
    next_offset: int
    size_bytes: int
    max_timestamp: int


# Four segments of 100 bytes, offsets [0,10) [10,20) [20,30) [30,40); the last one is active.
SEGMENTS = [Seg(10, 100, 1_000), Seg(20, 100, 2_000), Seg(30, 100, 3_000), Seg(40, 100, 4_000)]


def count(*, hw=40, retention_ms=-1, retention_bytes=-1, now_ms=10_000, segments=SEGMENTS):
    config = LogConfig(retention_ms=retention_ms, retention_bytes=retention_bytes)
    return count_segments_past_retention(segments, high_watermark=hw, config=config, now_ms=now_ms)


def test_time_retention_deletes_the_segments_whose_newest_record_is_older_than_retention_ms():
    assert count(retention_ms=7_500) == 2  # 10,000 - 2,000 > 7,500; 10,000 - 3,000 is not


def test_time_retention_stops_at_the_first_segment_still_young_enough():
    young_first = [Seg(10, 100, 9_000), Seg(20, 100, 1_000), Seg(30, 100, 1_000), Seg(40, 100, 1_000)]
    assert count(retention_ms=5_000, segments=young_first) == 0


def test_size_retention_deletes_oldest_segments_only_while_retention_bytes_remain():
    assert count(retention_bytes=250) == 1  # 400 - 100 = 300 >= 250; 300 - 100 = 200 is not
    assert count(retention_bytes=200) == 2


def test_a_segment_holding_offsets_at_or_past_the_high_watermark_is_never_deleted():
    assert count(retention_ms=0, hw=25) == 2  # [20,30) holds offset 25, past the HW
    assert count(retention_bytes=0, hw=25) == 2


def test_the_whole_log_may_go_when_every_offset_is_below_the_high_watermark():
    assert count(retention_ms=0) == 4


def test_an_empty_active_segment_is_never_counted():
    with_empty_active = SEGMENTS[:3] + [Seg(30, 0, -1)]
    assert count(retention_ms=0, hw=30, segments=with_empty_active) == 3


def test_the_larger_of_time_and_size_retention_wins():
    assert count(retention_ms=8_500, retention_bytes=150) == 2  # time says 1, size says 2
    assert count(retention_ms=6_500, retention_bytes=350) == 3  # time says 3, size says 0


def test_no_retention_configured_deletes_nothing():
    assert count() == 0
