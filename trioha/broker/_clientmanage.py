"""``ClientManageProcessor`` and ``ClientHousekeepingService``: who the clients are.

Heartbeats and unregistrations keep the client tables; a group's members are told whenever the
group changes.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

import attrs
import trio

from trioha._errors import RemotingError
from trioha.broker._clients import ClientChannel, SubscriptionData
from trioha.broker._context import (
    BrokerContext,
    Handler,
)
from trioha.broker._metadata import RETRY_TOPIC_PREFIX
from trioha.remoting import (
    PERM_READ,
    PERM_WRITE,
    HeaderError,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    loads_lenient,
)

log = logging.getLogger("trioha.broker")


class ClientManageProcessor:
    """Mirrors RocketMQ's ``ClientManageProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
        }

    async def heart_beat(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``ClientManageProcessor.heartBeat``: register producers and consumers.

        A consumer group gets its subscription group (auto-created) and its retry topic, as
        RocketMQ creates them here; members are notified when the group changed.
        """
        try:
            data = loads_lenient(request.body) if request.body else {}
        except ValueError as exc:
            raise HeaderError(f"heartbeat body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HeaderError("heartbeat body is not a JSON object")
        client_id = str(data.get("clientID", ""))
        now = self.ctx.now()
        channel = ClientChannel(client_id, connection, request.language, request.version, now)
        for consumer in data.get("consumerDataSet") or []:
            group_name = str(consumer.get("groupName", ""))
            group = self.ctx.meta.groups.find(group_name)
            if group is not None and not self.ctx.is_slave:
                retry = RETRY_TOPIC_PREFIX + group_name
                if self.ctx.meta.topics.select(retry) is None:
                    self.ctx.meta.topics.create_in_send_back(
                        retry, group.retry_queue_nums, PERM_READ | PERM_WRITE
                    )
                    self.ctx.on_topics_changed()
            subscriptions = [
                SubscriptionData.from_json(s)
                for s in consumer.get("subscriptionDataSet") or []
                if isinstance(s, dict)
            ]
            changed = self.ctx.clients.register_consumer(
                group_name,
                attrs.evolve(channel),
                consume_type=str(consumer.get("consumeType", "CONSUME_PASSIVELY")),
                message_model=str(consumer.get("messageModel", "CLUSTERING")),
                consume_from_where=str(consumer.get("consumeFromWhere", "")),
                subscriptions=subscriptions,
            )
            if changed and (group is None or group.notify_consumer_ids_changed_enable):
                self.notify_consumer_ids_changed(group_name)
        for producer in data.get("producerDataSet") or []:
            self.ctx.clients.register_producer(
                str(producer.get("groupName", "")), attrs.evolve(channel)
            )
        return request.response(ResponseCode.SUCCESS)

    async def unregister_client(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``ClientManageProcessor.unregisterClient``."""
        producer = request.field("producerGroup")
        if producer:
            self.ctx.clients.unregister_producer(producer, connection)
        consumer = request.field("consumerGroup")
        if consumer and self.ctx.clients.unregister_consumer(consumer, connection):
            self.notify_consumer_ids_changed(consumer)
        return request.response(ResponseCode.SUCCESS)

    async def check_client_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS)

    def notify_consumer_ids_changed(self, group: str) -> None:
        """``DefaultConsumerIdsChangeListener``: tell every member (oneway, best effort)."""
        for member in self.ctx.clients.connections_of(group):
            if isinstance(member, RemotingConnection):
                self.ctx.nursery.start_soon(self._notify, member, group)

    @staticmethod
    async def _notify(connection: RemotingConnection, group: str) -> None:
        command = RemotingCommand.request(
            RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group}, oneway=True
        )
        with trio.move_on_after(3):
            try:
                await connection.oneway(command)
            except RemotingError as exc:
                log.debug("notify %s of group %s failed: %s", connection.peer, group, exc)

    def connection_closed(self, connection: Hashable) -> None:
        """``ClientHousekeepingService.onChannelClose``."""
        for group in self.ctx.clients.connection_closed(connection):
            self.notify_consumer_ids_changed(group)

    def scan_not_active(self) -> None:
        for group in self.ctx.clients.scan_not_active(self.ctx.now()):
            self.notify_consumer_ids_changed(group)
