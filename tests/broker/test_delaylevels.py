"""Delay levels' pure rules: ``messageDelayLevel`` parsed and the put-time rewrite."""

from __future__ import annotations

import pytest

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.broker._delaylevels import SCHEDULE_TOPIC, parse_delay_levels, schedule_rewrite

DEFAULT_MS = [
    1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000,
    360000, 420000, 480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000,
]  # fmt: skip


def test_levels_parse_like_rocketmq() -> None:
    assert parse_delay_levels(BrokerConfig().message_delay_level) == DEFAULT_MS
    assert parse_delay_levels("2d 1h") == [172_800_000, 3_600_000]
    for bad in ("1s  5s", "1x", "s", "1.5s", ""):
        with pytest.raises(ConfigError, match="message_delay_level"):
            parse_delay_levels(bad)


def test_put_time_rewrite() -> None:
    props = {"DELAY": "3", "KEYS": "k1", "TAGS": "TagA"}
    assert schedule_rewrite("TopicA", 1, 0, props, max_level=18) == (SCHEDULE_TOPIC, 2)
    assert props == {
        "DELAY": "3",
        "KEYS": "k1",
        "TAGS": "TagA",
        "REAL_TOPIC": "TopicA",
        "REAL_QID": "1",
    }
    capped = {"DELAY": "40"}
    assert schedule_rewrite("T", 0, 0, capped, max_level=18) == (SCHEDULE_TOPIC, 17)
    assert capped["DELAY"] == "18"
    for sysflag in (0x4, 0xC):  # prepared and rolled-back transaction messages stay put
        assert schedule_rewrite("T", 0, sysflag, {"DELAY": "1"}, max_level=18) == ("T", 0)
    assert schedule_rewrite("T", 5, 0, {"DELAY": "0"}, max_level=18) == ("T", 5)
    for bad in ("soon", "9999999999999"):
        with pytest.raises(ValueError, match="DELAY"):
            schedule_rewrite("T", 0, 0, {"DELAY": bad}, max_level=18)
