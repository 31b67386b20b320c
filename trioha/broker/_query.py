"""``QueryMessageProcessor``: a message by its offset id, or by key."""

from __future__ import annotations

import logging

from trioha.broker._context import (
    BrokerContext,
    Handler,
)
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._codes import (
    RequestCode,
    ResponseCode,
)
from trioha.remoting._connection import RemotingConnection

log = logging.getLogger("trioha.broker")


class QueryMessageProcessor:
    """Mirrors RocketMQ's ``QueryMessageProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.QUERY_MESSAGE: self.query_message,
        }

    async def view_message_by_id(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``QueryMessageProcessor.viewMessageById``: the record at a commit log offset."""
        offset = request.int_field("offset")
        message = self.ctx.read_record_at(offset)
        if message is None:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return request.response(ResponseCode.SUCCESS, body=message.encode())

    async def query_message(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            "trioha keeps no message index: query by key is not supported; "
            "use VIEW_MESSAGE_BY_ID with the message's offset id",
        )
