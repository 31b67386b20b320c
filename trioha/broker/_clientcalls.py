"""``Broker2Client``: the admin requests a broker answers by asking its clients.

``mqadmin resetOffsetByTime`` / ``skipAccumulatedMessage`` (INVOKE_BROKER_TO_RESET_OFFSET) and
``mqadmin consumerStatus`` (GET_CONSUMER_RUNNING_INFO) reach consumers only through the broker
they are connected to: the broker computes the new offsets and tells every member of the group
(RESET_CONSUMER_CLIENT_OFFSET, oneway), or relays the question to one member and its answer
back. As in RocketMQ the broker does not write the group's offsets itself: the consumers do,
through their next commit. With no member online the reset answers CONSUMER_NOT_ONLINE (206),
on which ``mqadmin`` falls back to writing each queue's offset with UPDATE_CONSUMER_OFFSET
(docs/rocketmq-protocol.md §16.4).
"""

from __future__ import annotations

import logging

import trio

from trioha._errors import RemotingError
from trioha.broker._admin import message_queue_json, object_keyed
from trioha.broker._clients import ClientChannel
from trioha.broker._context import BrokerContext, Handler
from trioha.remoting import RemotingCommand, RemotingConnection, RequestCode, ResponseCode, dumps

log = logging.getLogger("trioha.broker")

#: ``MQVersion.Version.V3_0_7_SNAPSHOT.ordinal()``: older clients cannot reset their offsets.
VERSION_3_0_7_SNAPSHOT = 28
#: ``MQVersion.Version.V3_1_8_SNAPSHOT.ordinal()``: older clients cannot report running info.
VERSION_3_1_8_SNAPSHOT = 62
#: ``Broker2Client.callClient``: how long a relayed request waits for the client (10 s).
CALL_CLIENT_TIMEOUT = 10.0
#: ``Broker2Client.resetOffset``: how long one oneway send may take (5 s).
ONEWAY_TIMEOUT = 5.0

_EARLY_VERSIONS = (
    "V3_0_0_SNAPSHOT",
    "V3_0_0_ALPHA1",
    *(f"V3_0_0_BETA{n}" for n in range(1, 6)),
    *(name for n in range(6, 10) for name in (f"V3_0_0_BETA{n}_SNAPSHOT", f"V3_0_0_BETA{n}")),
    "V3_0_0_FINAL",
    *(name for n in range(1, 16) for name in (f"V3_0_{n}_SNAPSHOT", f"V3_0_{n}")),
    *(name for n in range(10) for name in (f"V3_1_{n}_SNAPSHOT", f"V3_1_{n}")),
)


def version_desc(version: int) -> str:
    """``MQVersion.getVersionDesc`` for the releases before 3.2 (the ones these calls
    refuse); a later version by its number."""
    if 0 <= version < len(_EARLY_VERSIONS):
        return _EARLY_VERSIONS[version]
    return f"version {version}"


class ClientCallsProcessor:
    """``AdminBrokerProcessor``'s codes that go through ``Broker2Client``."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self.get_consumer_running_info,
        }

    async def reset_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``Broker2Client.resetOffset``: every write queue of the topic to the offset of
        ``timestamp`` (-1: the queue's end), or to the group's offset where that is smaller and
        ``isForce`` is off; the new offsets go to every member of the group.

        A C++ caller (``mqadmin resetOffsetByTime -c``) gets the list form C++ clients read.
        """
        topic, group = request.require("topic"), request.require("group")
        timestamp = request.int_field("timestamp")
        force = request.bool_field("isForce")
        log.info(
            "[reset-offset] reset offset started by %s. topic=%s, group=%s, timestamp=%d, "
            "isForce=%s",
            connection.peer,
            topic,
            group,
            timestamp,
            force,
        )
        config = self.ctx.meta.topics.select(topic)
        if config is None:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}",
            )
        offsets: list[tuple[int, int]] = []
        for queue_id in range(config.write_queue_nums):
            consumer_offset = self.ctx.meta.offsets.query(group, topic, queue_id)
            if consumer_offset == -1:
                return request.response(
                    ResponseCode.SYSTEM_ERROR, f"THe consumer group <{group}> not exist"
                )
            if timestamp == -1:
                queue = self.ctx.reput.queues.get(topic, queue_id)
                target = queue.max_offset if queue is not None else 0
            else:
                target = self.ctx.offset_by_time(topic, queue_id, timestamp)
            target = max(0, target)
            offsets.append(
                (queue_id, target if force or target < consumer_offset else consumer_offset)
            )
        members = self._members(group)
        if not members:
            remark = (
                f"Consumer not online, so can not reset offset, Group: {group} Topic: {topic} "
                f"Timestamp: {timestamp}"
            )
            log.error("%s", remark)
            return request.response(ResponseCode.CONSUMER_NOT_ONLINE, remark)
        broker_name = self.ctx.config.broker_name
        body = self._offset_table(broker_name, topic, offsets)
        if request.language == "CPP":
            body = self._offset_list(broker_name, topic, offsets)
        command = RemotingCommand.request(
            RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
            {"topic": topic, "group": group, "timestamp": timestamp, "isForce": "false"},
            body,
            oneway=True,
        )
        for member, channel in members:
            if channel.version < VERSION_3_0_7_SNAPSHOT:
                return request.response(
                    ResponseCode.SYSTEM_ERROR,
                    "the client does not support this feature. version="
                    + version_desc(channel.version),
                )
            with trio.move_on_after(ONEWAY_TIMEOUT):
                try:
                    await member.oneway(command)
                    log.info(
                        "[reset-offset] reset offset success. topic=%s, group=%s, clientId=%s",
                        topic,
                        group,
                        channel.client_id,
                    )
                except RemotingError as exc:
                    log.error(
                        "[reset-offset] reset offset exception. topic=%s, group=%s ,error=%s",
                        topic,
                        group,
                        exc,
                    )
        return request.response(
            ResponseCode.SUCCESS, body=self._offset_table(broker_name, topic, offsets)
        )

    def _members(self, group: str) -> list[tuple[RemotingConnection, ClientChannel]]:
        """The group's members this broker can send to (its remoting connections)."""
        info = self.ctx.clients.consumers.get(group)
        if info is None:
            return []
        return [
            (connection, channel)
            for connection, channel in info.channels.items()
            if isinstance(connection, RemotingConnection)
        ]

    @staticmethod
    def _offset_table(broker_name: str, topic: str, offsets: list[tuple[int, int]]) -> bytes:
        """``ResetOffsetBody``: ``{"offsetTable":{<MessageQueue>:offset, ...}}`` (fastjson)."""
        entries = [
            (message_queue_json(broker_name, topic, queue_id), str(offset))
            for queue_id, offset in offsets
        ]
        return ('{"offsetTable":' + object_keyed(entries) + "}").encode()

    @staticmethod
    def _offset_list(broker_name: str, topic: str, offsets: list[tuple[int, int]]) -> bytes:
        """``ResetOffsetBodyForC``: a list of ``MessageQueueForC``, for C++ clients."""
        table = [
            {"brokerName": broker_name, "offset": offset, "queueId": queue_id, "topic": topic}
            for queue_id, offset in offsets
        ]
        return dumps({"offsetTable": table}).encode()

    async def get_consumer_running_info(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getConsumerRunningInfo`` (``callConsumer``): the request, as it came, to the
        member ``clientId`` of ``consumerGroup``; its answer, as it came, back."""
        group, client_id = request.require("consumerGroup"), request.require("clientId")
        channel = self.ctx.clients.find_channel(group, client_id)
        if channel is None or not isinstance(channel.connection, RemotingConnection):
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
            )
        if channel.version < VERSION_3_1_8_SNAPSHOT:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"The Consumer <{client_id}> Version <{version_desc(channel.version)}> too low "
                "to finish, please upgrade it to V3_1_8_SNAPSHOT",
            )
        member = channel.connection
        relayed = RemotingCommand.request(request.code, request.ext_fields, request.body)
        try:
            with trio.fail_after(CALL_CLIENT_TIMEOUT):
                answer = await member.request(relayed)
        except trio.TooSlowError:
            return request.response(
                ResponseCode.CONSUME_MSG_TIMEOUT,
                f"consumer <{group}> <{client_id}> Timeout: wait response on the channel "
                f"<{member.peer}> timeout, {int(CALL_CLIENT_TIMEOUT * 1000)}(ms)",
            )
        except RemotingError as exc:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{group}> <{client_id}> Exception: {exc}",
            )
        return request.response(answer.code, answer.remark, answer.ext_fields, answer.body)
