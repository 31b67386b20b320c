"""``failoverUnsafe``, the test-only switch that turns the known-bad twins on in a real broker
(docs/failover.md, "Settings" and "Nemesis runs")."""

from __future__ import annotations

from pathlib import Path

import pytest

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.broker._broker import unsafe_twins
from trioha.failover import Unsafe


def test_twins_are_switched_on_by_name() -> None:
    assert unsafe_twins("no_self_fence") == Unsafe(no_self_fence=True)
    assert unsafe_twins(" no_self_fence , sss_without_token,") == Unsafe(
        no_self_fence=True, sss_without_token=True
    )
    assert not unsafe_twins("").any


def test_an_unknown_twin_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown twin\(s\) \['no_fence'\]; known: .*"):
        unsafe_twins("no_fence")


def test_the_key_is_read_from_broker_conf(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("failoverUnsafe=no_self_fence\n")
    assert BrokerConfig.from_properties(conf).failover_unsafe == "no_self_fence"
    assert BrokerConfig().failover_unsafe == ""
