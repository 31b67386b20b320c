"""Delay levels delivered: RocketMQ's ``ScheduleMessageService``.

The rules it relies on (``messageDelayLevel``, the put-time rewrite into
``SCHEDULE_TOPIC_XXXX``, due times in the consume queue) are pure and live in
:mod:`trioha.broker._delaylevels`.

On a master, one Trio task per level walks that level's queue from its delivered offset
(``delayOffset.json``): a unit not due yet is waited for; a due one is read and put again as a
new message of its real topic (``messageTimeup``: body, flags, born fields and reconsume times
kept; the properties as stored, ``DELAY`` included, as RocketMQ does), without waiting for
flush or replicas; the offset then moves on. A put that fails is retried after 100 ms, for
ever, as RocketMQ does. Consumers' send-backs use levels 3 + reconsume times, so a failing
consumer backs off from 10 s to 2 h.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from trioha._status import PutStatus
from trioha.broker._delaylevels import SCHEDULE_TOPIC
from trioha.broker._metadata import DelayOffsets
from trioha.broker._types import BrokerLike
from trioha.store import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    DecodedMessage,
    NewMessage,
    decode_record,
)

if TYPE_CHECKING:
    from trioha.broker._reput import ReputService

log = logging.getLogger("trioha.broker.schedule")

#: ``TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC``: never delivered from a delay level.
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: ``FIRST_DELAY_TIME`` and ``DELAY_FOR_A_WHILE``/``DELAY_FOR_A_PERIOD`` (seconds).
FIRST_DELAY = 1.0
RETRY_DELAY = 0.1
ERROR_DELAY = 10.0


def wall_ms() -> int:
    return int(time.time() * 1000)


class ScheduleMessageService:
    """``ScheduleMessageService``: a delivery task per level; see the module docstring."""

    def __init__(
        self,
        broker: BrokerLike,
        reput: ReputService,
        offsets: DelayOffsets,
        delays: list[int],
        *,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.broker = broker
        self.reput = reput
        self.offsets = offsets
        self.delays = delays
        self.now_ms = now_ms
        #: Messages delivered to their real topic since start.
        self.delivered = 0

    async def run(self) -> NoReturn:
        """Deliver every level until cancelled (``ScheduleMessageService.start``)."""
        async with trio.open_nursery() as nursery:
            for level in range(1, len(self.delays) + 1):
                nursery.start_soon(self._run_level, level)
            await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _run_level(self, level: int) -> NoReturn:
        await trio.sleep(FIRST_DELAY)
        while True:
            try:
                await self._deliver_available(level)
            except Exception:
                log.exception("delay level %d: delivery failed; retry in %gs", level, ERROR_DELAY)
                await trio.sleep(ERROR_DELAY)

    async def _deliver_available(self, level: int) -> None:
        """``DeliverDelayedMessageTimerTask.executeOnTimeup``, until the queue's end."""
        queue_id = level - 1
        queue = self.reput.queues.get(SCHEDULE_TOPIC, queue_id)
        offset = self.offsets.offset(level)
        if queue is None or offset >= queue.max_offset:
            await self.reput.wait_arrival(SCHEDULE_TOPIC, queue_id, offset)
            return
        commitlog = self.broker.store.commitlog
        unit = queue.get(offset)
        if unit is None or unit.is_blank or unit.commitlog_offset < commitlog.min_offset:
            # Gone with old commit log segments (or a pre-blank): skip it.
            self.offsets.set_offset(level, offset + 1)
            return
        now = self.now_ms()
        delay = self.delays[level - 1]
        due = unit.tags_code
        if due > now + delay:  # correctDeliverTimestamp: a clock that went back
            due = now
        if due > now:
            await trio.sleep((due - now) / 1000)
            return
        message = self._read(unit.commitlog_offset, unit.size)
        if message is None:
            log.warning(
                "delay level %d: no message at commit log offset %d; skipped",
                level,
                unit.commitlog_offset,
            )
            self.offsets.set_offset(level, offset + 1)
            return
        real = self._time_up(message)
        if real is None:
            self.offsets.set_offset(level, offset + 1)
            return
        result = await self.broker.put_batch([real], delivery=True)
        if result.status is not PutStatus.PUT_OK:
            log.warning(
                "delay level %d: delivering offset %d to %s failed (%s); retrying",
                level,
                offset,
                real.topic,
                result.status.value,
            )
            await trio.sleep(RETRY_DELAY)
            return
        self.delivered += 1
        self.offsets.set_offset(level, offset + 1)

    def _read(self, offset: int, size: int) -> Any:
        try:
            data = self.broker.store.commitlog.read(offset, size)
        except Exception:
            return None
        if len(data) != size:
            return None
        decoded = decode_record(bytes(data), 0, check_crc=False, base_offset=offset)
        return decoded.message if isinstance(decoded, DecodedMessage) else None

    def _time_up(self, message: Any) -> NewMessage | None:
        """``messageTimeup``: the message as put to its real topic (None: discard it).

        The properties are stored as they were, ``DELAY`` included: RocketMQ copies the
        string before clearing the level (the put is marked a delivery instead).
        """
        props = message.properties_dict()
        topic = props.get(PROPERTY_REAL_TOPIC)
        if not topic or topic == TRANS_HALF_TOPIC:
            log.warning(
                "scheduled message at %d has no deliverable REAL_TOPIC (%r); discarded",
                message.physical_offset,
                topic,
            )
            return None
        try:
            queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0"))
        except ValueError:
            queue_id = 0
        return NewMessage(
            topic=topic,
            queue_id=queue_id,
            body=message.body,
            flag=message.flag,
            sysflag=message.sysflag,
            born_timestamp=message.born_timestamp or None,  # 0: now, as a producer's would be
            born_host=message.born_host,
            reconsume_times=message.reconsume_times,
            properties=props,
        )
