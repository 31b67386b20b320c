"""Delay levels delivered: due times in the consume queue, delivery per level."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from tests.broker.fakes import open_fake_broker
from tests.broker.test_delaylevels import DEFAULT_MS
from trioha._config import BrokerConfig
from trioha.broker import producer_properties
from trioha.broker._delaylevels import SCHEDULE_TOPIC
from trioha.broker._metadata import Metadata
from trioha.broker._reput import CHECKPOINT_FILE, ReputService
from trioha.broker._schedule import ScheduleMessageService
from trioha.store import ConsumeQueueStore, NewMessage, tags_code


async def test_delivery_per_level(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    config = BrokerConfig(store_path_root_dir=str(tmp_path), mapped_file_size_commit_log=1 << 20)
    wall0, trio0 = int(time.time() * 1000), trio.current_time()

    def now_ms() -> int:  # wall time that follows the mock clock
        return wall0 + int((trio.current_time() - trio0) * 1000)

    async with open_fake_broker(tmp_path, config) as broker, trio.open_nursery() as nursery:
        meta = Metadata.load(tmp_path, config)
        queues = ConsumeQueueStore(tmp_path)
        reput = ReputService(
            broker.store.commitlog,
            queues,
            checkpoint=tmp_path / "config" / CHECKPOINT_FILE,
            delay_levels=DEFAULT_MS,
        )
        reput.recover()
        await nursery.start(reput.run, broker.wait_log_grew)
        schedule = ScheduleMessageService(broker, reput, meta.delay, DEFAULT_MS, now_ms=now_ms)
        nursery.start_soon(schedule.run)

        await broker.put(
            NewMessage(
                "A", b"one-second", properties=producer_properties({"DELAY": "1"}, tags="T1")
            )
        )
        await broker.put(
            NewMessage(
                "B",
                b"ten-seconds",
                queue_id=3,
                properties=producer_properties({"DELAY": "3"}, keys="k"),
            )
        )
        await broker.put(NewMessage("C", b"now", properties={"DELAY": "0"}))
        await reput.wait_dispatched(broker.store.commitlog.max_offset)
        stored = list(broker.store.commitlog.iter_messages())
        assert [(m.topic, m.queue_id) for m in stored] == [
            (SCHEDULE_TOPIC, 0),
            (SCHEDULE_TOPIC, 2),
            ("C", 0),
        ]
        unit = queues.get(SCHEDULE_TOPIC, 2).get(0)  # type: ignore[union-attr]
        assert unit is not None
        assert unit.tags_code == stored[1].store_timestamp + 10_000  # due time, not a tag hash

        await trio.sleep(0.5)
        assert queues.get("A", 0) is None
        await trio.sleep(1.0)
        await reput.wait_dispatched(broker.store.commitlog.max_offset)
        delivered = queues.get("A", 0)
        assert delivered is not None and delivered.max_offset == 1
        assert delivered.get(0).tags_code == tags_code("T1")  # type: ignore[union-attr]
        assert meta.delay.table == {1: 1}
        assert queues.get("B", 3) is None

        await trio.sleep(9.0)
        await reput.wait_dispatched(broker.store.commitlog.max_offset)
        later = list(broker.store.commitlog.iter_messages())[3:]
        assert [(m.topic, m.queue_id, m.body) for m in later] == [
            ("A", 0, b"one-second"),
            ("B", 3, b"ten-seconds"),
        ]
        # As RocketMQ: the delivered record keeps the scheduled copy's properties, in order.
        assert later[1].properties == stored[1].properties
        assert later[1].get_property("REAL_TOPIC") == "B"
        assert later[1].get_property("DELAY") == "3"
        assert later[1].get_property("KEYS") == "k"
        assert schedule.delivered == 2
        assert meta.delay.encode() == '{"offsetTable":{1:1,3:1}}'
        assert meta.delay.dirty
        nursery.cancel_scope.cancel()
