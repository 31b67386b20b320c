"""Who is connected: consumer groups and producer groups (``ConsumerManager``, ``ProducerManager``).

Clients announce themselves with HEART_BEAT (every 30 s in RocketMQ's clients); a consumer
group's members and subscriptions come from those heartbeats. A member leaves when it
unregisters, when its connection closes, or when it has not sent a heartbeat for
:data:`CHANNEL_EXPIRED_TIME` (``ClientHousekeepingService``). Whenever a group's membership
or subscriptions change, its members are told (NOTIFY_CONSUMER_IDS_CHANGED) so that they
rebalance at once instead of at their next 20 s rebalance tick.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import attrs

from trioha.store import tags_code

log = logging.getLogger("trioha.broker.clients")

#: ``ClientHousekeepingService``/``ConsumerManager.CHANNEL_EXPIRED_TIMEOUT``: 120 s.
CHANNEL_EXPIRED_TIME = 120_000
#: ``SubscriptionData.SUB_ALL``.
SUB_ALL = "*"


@attrs.frozen
class SubscriptionData:
    """``SubscriptionData`` as ``FilterAPI.buildSubscriptionData`` builds it (tag filters)."""

    topic: str
    sub_string: str = SUB_ALL
    tags: frozenset[str] = frozenset()
    codes: frozenset[int] = frozenset()
    sub_version: int = 0
    expression_type: str = "TAG"

    @classmethod
    def build(
        cls,
        topic: str,
        expression: str | None,
        *,
        sub_version: int = 0,
        expression_type: str = "TAG",
    ) -> SubscriptionData:
        """``"*"`` or empty subscribes to everything; else ``"a || b"`` is a set of tags."""
        if expression is None or not expression.strip() or expression.strip() == SUB_ALL:
            return cls(topic, SUB_ALL, sub_version=sub_version, expression_type=expression_type)
        tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
        return cls(
            topic,
            expression,
            tags,
            frozenset(tags_code(t) for t in tags),
            sub_version,
            expression_type,
        )

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> SubscriptionData:
        """From a heartbeat's ``subscriptionDataSet`` entry (the broker rebuilds the sets)."""
        built = cls.build(
            str(value.get("topic", "")),
            str(value.get("subString", SUB_ALL)),
            sub_version=int(value.get("subVersion", 0) or 0),
            expression_type=str(value.get("expressionType") or "TAG"),
        )
        return built

    def matches(self, tags_hash: int) -> bool:
        """``ExpressionMessageFilter.isMatchedByConsumeQueue`` for tag filters."""
        return self.sub_string == SUB_ALL or tags_hash in self.codes

    def to_json(self) -> dict[str, Any]:
        return {
            "classFilterMode": False,
            "codeSet": sorted(self.codes),
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": sorted(self.tags),
            "topic": self.topic,
        }


@attrs.define
class ClientChannel:
    """``ClientChannelInfo``: one client on one connection."""

    client_id: str
    connection: Hashable
    language: str
    version: int
    last_update: int


@attrs.define
class ConsumerGroupInfo:
    """``ConsumerGroupInfo``: a consumer group's members and what they subscribe to."""

    group_name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Hashable, ClientChannel] = attrs.field(factory=dict)
    subscriptions: dict[str, SubscriptionData] = attrs.field(factory=dict)

    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.channels.values()]


class ClientManager:
    """Consumer and producer groups by connection; no IO (the caller sends notifications)."""

    def __init__(self) -> None:
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[Hashable, ClientChannel]] = {}

    # --- heartbeats -----------------------------------------------------------------------
    def register_consumer(
        self,
        group: str,
        channel: ClientChannel,
        *,
        consume_type: str,
        message_model: str,
        consume_from_where: str,
        subscriptions: Iterable[SubscriptionData],
    ) -> bool:
        """``ConsumerManager.registerConsumer``; True when members or subscriptions changed."""
        info = self.consumers.get(group)
        if info is None:
            info = self.consumers[group] = ConsumerGroupInfo(group)
        info.consume_type = consume_type
        info.message_model = message_model
        info.consume_from_where = consume_from_where
        known = info.channels.get(channel.connection)
        new_member = known is None or known.client_id != channel.client_id
        info.channels[channel.connection] = channel
        subs = {s.topic: s for s in subscriptions}
        changed_subs = False
        for topic, sub in subs.items():
            old = info.subscriptions.get(topic)
            if old is None or (old.sub_string, old.sub_version) != (
                sub.sub_string,
                sub.sub_version,
            ):
                if old is not None and sub.sub_version < old.sub_version:
                    continue  # an older heartbeat arriving late
                info.subscriptions[topic] = sub
                changed_subs = True
        for topic in list(info.subscriptions):
            if topic not in subs:
                del info.subscriptions[topic]
                changed_subs = True
        if new_member:
            log.info("consumer %s joined group %s", channel.client_id, group)
        return new_member or changed_subs

    def register_producer(self, group: str, channel: ClientChannel) -> None:
        self.producers.setdefault(group, {})[channel.connection] = channel

    # --- leaving --------------------------------------------------------------------------
    def unregister_consumer(self, group: str, connection: Hashable) -> bool:
        """``unregisterConsumer``: True when the group lost a member."""
        info = self.consumers.get(group)
        if info is None or info.channels.pop(connection, None) is None:
            return False
        if not info.channels:
            del self.consumers[group]
        return True

    def unregister_producer(self, group: str, connection: Hashable) -> None:
        members = self.producers.get(group)
        if members is not None:
            members.pop(connection, None)
            if not members:
                del self.producers[group]

    def connection_closed(self, connection: Hashable) -> list[str]:
        """``doChannelCloseEvent``: forget the connection; returns the groups that changed."""
        for group in list(self.producers):
            self.unregister_producer(group, connection)
        return [g for g in list(self.consumers) if self.unregister_consumer(g, connection)]

    def scan_not_active(self, now: int) -> list[str]:
        """``scanNotActiveChannel``: drop clients silent for 120 s; returns changed groups."""
        changed = []
        for group, info in list(self.consumers.items()):
            stale = [
                conn
                for conn, c in info.channels.items()
                if now - c.last_update > CHANNEL_EXPIRED_TIME
            ]
            for conn in stale:
                log.warning(
                    "consumer %s of group %s expired (no heartbeat for %d ms)",
                    info.channels[conn].client_id,
                    group,
                    CHANNEL_EXPIRED_TIME,
                )
                self.unregister_consumer(group, conn)
            if stale:
                changed.append(group)
        for group, members in list(self.producers.items()):
            for conn in [
                c for c, ch in members.items() if now - ch.last_update > CHANNEL_EXPIRED_TIME
            ]:
                self.unregister_producer(group, conn)
        return changed

    # --- queries --------------------------------------------------------------------------
    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        return info.client_ids() if info else []

    def connections_of(self, group: str) -> list[Hashable]:
        info = self.consumers.get(group)
        return list(info.channels) if info else []

    def find_channel(self, group: str, client_id: str) -> ClientChannel | None:
        """``ConsumerManager.findChannel``: the connection of one member of *group*."""
        info = self.consumers.get(group)
        if info is None:
            return None
        return next((c for c in info.channels.values() if c.client_id == client_id), None)

    def find_subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.consumers.get(group)
        return info.subscriptions.get(topic) if info else None
