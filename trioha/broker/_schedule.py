"""Delay levels: RocketMQ's ``ScheduleMessageService`` and the put-time rewrite it relies on.

A message whose ``DELAY`` property names a level n > 0 is not stored under its topic: the put
rewrites it (``CommitLog.asyncPutMessage``) into queue n - 1 of ``SCHEDULE_TOPIC_XXXX``, with
the real topic and queue kept in ``REAL_TOPIC``/``REAL_QID``. Levels are the durations of
``messageDelayLevel`` (default ``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``);
a level past the last is lowered to it. The consume queue unit of such a message carries its
due time (store time + the level's delay) instead of a tag hash, on master and slave alike.

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
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import trio

from trioha._errors import ConfigError
from trioha._status import PutStatus
from trioha.broker._metadata import SCHEDULE_TOPIC as SCHEDULE_TOPIC  # noqa: PLC0414 - kept importable from here
from trioha.broker._metadata import DelayOffsets
from trioha.broker._types import BrokerLike
from trioha.store._consumequeue import java_string_hash
from trioha.store._contract import NewMessage
from trioha.store._message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    DecodedMessage,
    decode_record,
)

if TYPE_CHECKING:
    from trioha.broker._reput import ReputService

log = logging.getLogger("trioha.broker.schedule")

#: ``TopicValidator.RMQ_SYS_TRANS_HALF_TOPIC``: never delivered from a delay level.
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_DELAY_LEVEL = 18
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: ``FIRST_DELAY_TIME`` and ``DELAY_FOR_A_WHILE``/``DELAY_FOR_A_PERIOD`` (seconds).
FIRST_DELAY = 1.0
RETRY_DELAY = 0.1
ERROR_DELAY = 10.0
_TRANSACTION_MASK = 0xC
_TRANSACTION_PREPARED = 0x4
_TRANSACTION_ROLLBACK = 0xC


def parse_delay_levels(text: str) -> list[int]:
    """``parseDelayLevel``: the delay of each level in ms (level n at index n - 1).

    Tokens are split on single spaces, each a decimal number and one unit of ``s m h d``;
    anything else is a :class:`ConfigError` (RocketMQ's service then fails to load).
    """
    delays = []
    for token in text.split(" "):
        unit = _UNITS.get(token[-1:])
        if unit is None or not token[:-1].isdigit():
            raise ConfigError(
                f"message_delay_level: bad level {token!r} in {text!r} "
                "(expected a number and one of s, m, h, d)"
            )
        delays.append(int(token[:-1]) * unit)
    return delays


def delay_level_of(properties: MutableMapping[str, str]) -> int:
    """``getDelayTimeLevel``: the ``DELAY`` property, 0 without one; ValueError if not a
    number (the put is refused as MESSAGE_ILLEGAL)."""
    raw = properties.get(PROPERTY_DELAY_TIME_LEVEL)
    if raw is None:
        return 0
    try:
        level = int(raw)
    except ValueError:
        raise ValueError(f"the DELAY property {raw!r} is not a number") from None
    if not -(2**31) <= level < 2**31:  # Integer.parseInt's range
        raise ValueError(f"the DELAY property {raw!r} is out of range")
    return level


def schedule_rewrite(
    topic: str,
    queue_id: int,
    sysflag: int,
    properties: MutableMapping[str, str],
    *,
    max_level: int,
) -> tuple[str, int]:
    """The put-time rewrite of ``CommitLog.asyncPutMessage``: (topic, queue id) to store at.

    Only for non-transactional and committed messages with ``DELAY`` > 0; ``properties``
    gains ``REAL_TOPIC``/``REAL_QID`` (and a capped ``DELAY``) in place.
    """
    if sysflag & _TRANSACTION_MASK in (_TRANSACTION_PREPARED, _TRANSACTION_ROLLBACK):
        return topic, queue_id
    level = delay_level_of(properties)
    if level <= 0:
        return topic, queue_id
    if level > max_level:
        level = max_level
        properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    properties[PROPERTY_REAL_TOPIC] = topic
    properties[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    return SCHEDULE_TOPIC, level - 1


def is_delayed(properties: Mapping[str, str]) -> bool:
    """Whether the put will park this message at a delay level (a ``DELAY`` number > 0)."""
    try:
        return int(properties.get(PROPERTY_DELAY_TIME_LEVEL, "0")) > 0
    except ValueError:
        return False


def java_hashmap_order(items: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The iteration order of a Java ``HashMap`` filled with ``items`` in this order.

    RocketMQ re-serialises a delayed message's properties from its ``HashMap``; rebuilding
    that order makes the stored bytes RocketMQ's. Buckets are ``(h ^ h >>> 16) & (capacity-1)``
    of ``String.hashCode``, the capacity starts at 16 and doubles past a 0.75 load; entries
    iterate by bucket, then in insertion order (a re-put key keeps its place). Buckets that
    Java would turn into trees (8 or more entries) are not modelled.
    """
    capacity = 16
    while len(items) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    ranked = sorted((bucket(key), i) for i, (key, _value) in enumerate(items))
    return [items[i] for _bucket, i in ranked]


def apply_delay_levels(messages: Sequence[NewMessage], max_level: int) -> Sequence[NewMessage]:
    """:func:`schedule_rewrite` over a put's messages (those without ``DELAY`` unchanged);
    a rewritten message's properties take the order RocketMQ's re-serialisation gives."""
    for message in messages:
        if message.get_property(PROPERTY_DELAY_TIME_LEVEL) is not None:
            break
    else:
        return messages
    out: list[NewMessage] = []
    for message in messages:
        props = dict(message.properties)
        topic, queue_id = schedule_rewrite(
            message.topic, message.queue_id, message.sysflag, props, max_level=max_level
        )
        if (topic, queue_id) == (message.topic, message.queue_id):
            out.append(message)
        else:
            ordered = java_hashmap_order(list(props.items()))
            out.append(attrs.evolve(message, topic=topic, queue_id=queue_id, properties=ordered))
    return out


def deliver_timestamp(delays: list[int], level: int, store_timestamp: int) -> int:
    """``computeDeliverTimestamp``: the consume queue tagsCode of a scheduled message."""
    level = min(level, len(delays))
    if level <= 0:
        return store_timestamp + 1000
    return store_timestamp + delays[level - 1]


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
