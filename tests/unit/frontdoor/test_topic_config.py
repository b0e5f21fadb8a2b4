"""Topic config validation of the KIP-68 keys the broker-side consumed retention reads."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidConfig
from lowtide.frontdoor.topic_config import validate_topic_config


def test_consumed_retention_mode_and_inactivity_are_accepted():
    config = validate_topic_config({"consumed.retention.ms": "0", "consumed.retention.mode": "any",
                                    "consumed.retention.group.inactive.ms": " 60000 "})
    assert config["consumed.retention.mode"] == "any" and config["consumed.retention.group.inactive.ms"] == "60000"


@pytest.mark.parametrize(("key", "value"), [("consumed.retention.mode", "some"),
                                            ("consumed.retention.group.inactive.ms", "-2"),
                                            ("consumed.retention.group.inactive.ms", "soon")])
def test_a_bad_consumed_retention_value_is_invalid_config_naming_the_key(key, value):
    with pytest.raises(InvalidConfig, match=key):
        validate_topic_config({key: value})
