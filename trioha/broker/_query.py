"""``QueryMessageProcessor``: a message by its offset id, or by key (the message index)."""

from __future__ import annotations

import logging

from trioha.broker._context import (
    BrokerContext,
    Handler,
)
from trioha.remoting import RemotingCommand, RemotingConnection, RequestCode, ResponseCode

log = logging.getLogger("trioha.broker")

#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``: the ext field of a query by unique key (message id).
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
#: ``BrokerConfig.defaultQueryMaxNum``: the result size of a query by unique key.
DEFAULT_QUERY_MAX_NUM = 32


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
        """``viewMessageById``: the record at a commit log offset, as stored."""
        offset = request.int_field("offset")
        record = self.ctx.raw_record_at(offset)
        if record is None:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return request.response(ResponseCode.SUCCESS, body=record)

    async def query_message(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``queryMessage`` over the message index (``DefaultMessageStore.queryMessage``).

        Up to three rounds: each looks up the newest offsets in [begin, end], and when none of
        them can be read, lowers ``end`` to the store time of the first one found.
        """
        topic, key = request.require("topic"), request.require("key")
        max_num = request.int_field("maxNum")
        begin = request.int_field("beginTimestamp")
        end = request.int_field("endTimestamp")
        if (request.field(UNIQUE_MSG_QUERY_FLAG) or "").strip().lower() == "true":
            max_num = DEFAULT_QUERY_MAX_NUM
        index = self.ctx.reput.index
        records: list[bytes] = []
        last_ts = last_offset = 0
        if index is not None:
            last_query_time = end
            for _ in range(3):
                found = index.query_offsets(topic, key, max_num, begin, last_query_time)
                if not found.phy_offsets:
                    break
                last_ts = found.index_last_update_timestamp
                last_offset = found.index_last_update_phy_offset
                for position, offset in enumerate(sorted(found.phy_offsets)):
                    if position == 0:
                        message = self.ctx.read_record_at(offset)
                        if message is not None:
                            last_query_time = message.store_timestamp
                    record = self.ctx.raw_record_at(offset)
                    if record is not None:
                        records.append(record)
                if records or last_query_time < begin:
                    break
        fields = {"indexLastUpdateTimestamp": last_ts, "indexLastUpdatePhyoffset": last_offset}
        if not records:
            return request.response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                fields,
            )
        return request.response(ResponseCode.SUCCESS, None, fields, b"".join(records))
