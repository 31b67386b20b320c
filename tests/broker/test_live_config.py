"""``Broker.update_config``: the settings UPDATE_BROKER_CONFIG changes take effect at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha._status import PutStatus
from trioha.broker import Broker, open_broker
from trioha.broker._liveconfig import LIVE_KEYS, updated_config
from trioha.store import FlushDiskType, NewMessage


@asynccontextmanager
async def running(root: Path, **settings: Any) -> AsyncIterator[Broker]:
    config = BrokerConfig(
        store_path_root_dir=str(root),
        listen_port=0,
        ha_listen_port=0,
        mapped_file_size_commit_log=1 << 20,
        clean_resource_interval=3_600_000,  # the disk is measured once, at start
        **settings,
    )
    async with open_broker(config) as broker:
        yield broker


async def test_disk_limits_apply_to_the_last_measurement_at_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running(tmp_path) as broker:
            broker.disk.ratios["CL"] = 0.5  # as measured
            broker.update_config(broker.config.evolve(disk_space_warning_level_ratio=40))
            assert broker.disk.statistics().writable is False
            refused = await broker.put(NewMessage(topic="T", body=b"x"))
            assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
            broker.update_config(broker.config.evolve(disk_space_warning_level_ratio=90))
            assert broker.disk.statistics().writable is True
            assert (await broker.put(NewMessage(topic="T", body=b"x"))).status is PutStatus.PUT_OK


async def test_max_message_size_and_the_flush_timeout(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running(tmp_path, flush_disk_type=FlushDiskType.SYNC_FLUSH) as broker:
            broker.update_config(
                updated_config(broker.config, {"maxMessageSize": "100", "syncFlushTimeout": "250"})
            )
            too_big = await broker.put(NewMessage(topic="T", body=b"x" * 101))
            assert too_big.status is PutStatus.MESSAGE_ILLEGAL
            assert (
                await broker.put(NewMessage(topic="T", body=b"x" * 100))
            ).status is PutStatus.PUT_OK
            assert broker._flusher.waiters.timeout == 0.25


async def test_the_flush_interval_is_read_every_round(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with running(tmp_path) as broker:
        broker.update_config(broker.config.evolve(flush_interval_commit_log=60_000))
        await trio.sleep(1)  # the round begun under the old 500 ms interval ends
        await broker.put(NewMessage(topic="T", body=b"x"))
        await trio.sleep(30)
        commitlog = broker.store.commitlog
        assert commitlog.flushed_offset < commitlog.max_offset
        await trio.sleep(31)
        assert commitlog.flushed_offset == commitlog.max_offset


async def test_the_fall_behind_limit_reaches_the_ha_service(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running(tmp_path) as broker:
            broker.update_config(broker.config.evolve(ha_slave_fallbehind_max=1024))
            assert broker.ha_service is not None
            assert broker.ha_service.config.ha_slave_fallbehind_max == 1024


def test_every_live_key_is_a_broker_setting() -> None:
    assert set(LIVE_KEYS) <= {field.name for field in attrs.fields(BrokerConfig)}


async def test_retention_settings_are_read_at_its_next_run(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with running(tmp_path) as broker:
            retention = broker.retention
            assert retention is not None
            settings = {
                "fileReservedTime": "48",
                "deleteWhen": "02;14",
                "cleanFileForciblyEnable": "false",
            }
            broker.update_config(updated_config(broker.config, settings))
            assert retention.config.file_reserved_time == 48
            assert retention.config.delete_hours == (2, 14)
            assert retention.config.clean_file_forcibly_enable is False


def test_a_delete_when_that_is_not_hours_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"deleteWhen='04;25': '25' is not an hour of the day"):
        updated_config(BrokerConfig(), {"deleteWhen": "04;25"})
