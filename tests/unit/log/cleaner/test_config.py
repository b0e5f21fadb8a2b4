"""The topic and broker keys the cleaner reads, with Kafka's names and defaults."""

from __future__ import annotations

import math

import pytest

from lowtide.errors import InvalidConfig
from lowtide.log.cleaner.config import LONG_MAX, CleanerSettings, CompactionConfig


def test_topic_keys_default_like_kafka_and_parse_from_strings():
    assert CompactionConfig.from_topic_config({}) == CompactionConfig(0.5, 0, LONG_MAX)
    config = CompactionConfig.from_topic_config({"min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": "5",
                                                 "max.compaction.lag.ms": "60000", "segment.bytes": "100"})
    assert config == CompactionConfig(0.01, 5, 60000)


@pytest.mark.parametrize("key, value", [("min.cleanable.dirty.ratio", "1.5"), ("min.cleanable.dirty.ratio", "x"),
                                        ("min.compaction.lag.ms", "-1"), ("max.compaction.lag.ms", "0")])
def test_a_bad_topic_value_is_invalid_config_naming_the_key(key, value):
    with pytest.raises(InvalidConfig) as raised:
        CompactionConfig.from_topic_config({key: value})
    assert key in raised.value.message


def test_broker_keys_are_kafkas_log_cleaner_settings():
    assert CleanerSettings.from_broker_config({"segment.bytes": "1"}) == CleanerSettings()
    assert math.isinf(CleanerSettings().io_max_bytes_per_second)
    settings = CleanerSettings.from_broker_config({"log.cleaner.enable": "false",
                                                   "log.cleaner.io.max.bytes.per.second": "1048576",
                                                   "log.cleaner.backoff.ms": "200"})
    assert (settings.enabled, settings.io_max_bytes_per_second, settings.backoff_ms) == (False, 1048576.0, 200)
