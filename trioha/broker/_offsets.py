"""``ConsumerManageProcessor``: committed consumer offsets and a group's members."""

from __future__ import annotations

import logging

from trioha.broker._context import (
    BrokerContext,
    Handler,
    queue_min_offset,
)
from trioha.remoting import (
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    dumps_bytes,
)

log = logging.getLogger("trioha.broker")


class ConsumerManageProcessor:
    """Mirrors RocketMQ's ``ConsumerManageProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
        }

    async def query_consumer_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``queryConsumerOffset``: the committed offset, or 0 for a new group on a queue
        that still starts at 0 (RocketMQ answers that when the first message is in memory;
        trioha treats every message as in memory), else QUERY_NOT_FOUND."""
        group, topic = request.require("consumerGroup"), request.require("topic")
        queue_id = request.int_field("queueId")
        offset = self.ctx.meta.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return request.response(ResponseCode.SUCCESS, None, {"offset": offset})
        queue = self.ctx.reput.queues.get(topic, queue_id)
        min_offset = (
            queue_min_offset(queue, self.ctx.broker.store.commitlog.min_offset) if queue else 0
        )
        if min_offset <= 0:
            return request.response(ResponseCode.SUCCESS, None, {"offset": 0})
        return request.response(
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    async def update_consumer_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``updateConsumerOffset``: accepted on a slave too (a consumer whose master is
        down commits there; the next metadata sync keeps the newer offset)."""
        self.ctx.meta.offsets.commit(
            request.require("consumerGroup"),
            request.require("topic"),
            request.int_field("queueId"),
            request.int_field("commitOffset"),
        )
        return request.response(ResponseCode.SUCCESS)

    async def get_consumer_list_by_group(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``ConsumerManageProcessor.getConsumerListByGroup``."""
        group = request.require("consumerGroup")
        ids = self.ctx.clients.consumer_ids(group)
        if not ids:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}"
            )
        return request.response(ResponseCode.SUCCESS, body=dumps_bytes({"consumerIdList": ids}))
