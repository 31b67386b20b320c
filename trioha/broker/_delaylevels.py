"""Delay levels' pure rules: ``messageDelayLevel`` parsed, the put-time rewrite, due times.

A message whose ``DELAY`` property names a level n > 0 is not stored under its topic: the put
rewrites it (``CommitLog.asyncPutMessage``) into queue n - 1 of ``SCHEDULE_TOPIC_XXXX``, with
the real topic and queue kept in ``REAL_TOPIC``/``REAL_QID``. Levels are the durations of
``messageDelayLevel`` (default ``1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``);
a level past the last is lowered to it. The consume queue unit of such a message carries its
due time (store time + the level's delay) instead of a tag hash, on master and slave alike.

These rules do no IO: the send path and the broker's put apply the rewrite, the reput task
computes the due times, and :mod:`trioha.broker._schedule` (the Trio service delivering each
level) reads them from here.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence

import attrs

from trioha._errors import ConfigError
from trioha.broker._metadata import SCHEDULE_TOPIC as SCHEDULE_TOPIC  # noqa: PLC0414 - kept importable from here
from trioha.store import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    NewMessage,
    java_string_hash,
)

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_MAX_DELAY_LEVEL = 18
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
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
