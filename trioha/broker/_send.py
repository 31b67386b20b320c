"""``SendMessageProcessor``: sends, batches and consumers' send-backs."""

from __future__ import annotations

import logging
import random
from typing import Any

from trioha._status import PutResult, PutStatus
from trioha.broker._batch import BatchError, decode_batch
from trioha.broker._context import (
    SERVICE_NOT_AVAILABLE_REMARK,
    BrokerContext,
    Handler,
    peer_address,
    topic_error,
)
from trioha.broker._metadata import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX, TopicConfig
from trioha.broker._types import new_message
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._codes import (
    AUTO_CREATE_TOPIC,
    PERM_READ,
    PERM_WRITE,
    RequestCode,
    ResponseCode,
)
from trioha.remoting._connection import RemotingConnection
from trioha.store._message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    string_to_properties,
)

log = logging.getLogger("trioha.broker")

#: ``MixAll.PROPERTY_CLUSTER`` and the region/trace fields a 4.9 broker adds to responses.
PROPERTY_CLUSTER = "CLUSTER"
DEFAULT_REGION = "DefaultRegion"
#: ``subscriptionGroupConfig.retryMaxTimes`` default when the request does not say.
MAX_RECONSUME_TIMES = 16


class SendMessageProcessor:
    """Mirrors RocketMQ's ``SendMessageProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
        }

    @staticmethod
    def _send_header(request: RemotingCommand) -> dict[str, str]:
        """SendMessageRequestHeaderV2's one-letter fields as SendMessageRequestHeader's names."""
        if request.code == RequestCode.SEND_MESSAGE:
            return request.ext_fields
        fields = request.ext_fields
        if "b" not in fields and "topic" in fields:
            return fields  # a batch sent with the long header
        names = {
            "a": "producerGroup",
            "b": "topic",
            "c": "defaultTopic",
            "d": "defaultTopicQueueNums",
            "e": "queueId",
            "f": "sysFlag",
            "g": "bornTimestamp",
            "h": "flag",
            "i": "properties",
            "j": "reconsumeTimes",
            "k": "unitMode",
            "l": "maxReconsumeTimes",
            "m": "batch",
        }
        return {names.get(k, k): v for k, v in fields.items()}

    async def send_message(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``SendMessageProcessor.asyncSendMessage`` / ``asyncSendBatchMessage``."""
        header = RemotingCommand(code=request.code, ext_fields=self._send_header(request))
        topic = header.require("topic")
        if self.ctx.is_slave:
            # The store would refuse anyway (SERVICE_NOT_AVAILABLE); refusing first keeps a
            # slave from auto-creating topics its master does not have.
            return request.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE_REMARK
            )
        config = self._check_topic(header, connection)
        if isinstance(config, RemotingCommand):
            return request.response(config.code, config.remark)
        queue_id = header.int_field("queueId", -1)
        if queue_id >= max(config.read_queue_nums, config.write_queue_nums):
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, {config} Producer: {connection.peer}",
            )
        if queue_id < 0:
            queue_id = random.randrange(config.write_queue_nums)
        reconsume_times = header.int_field("reconsumeTimes", 0)
        properties = dict(string_to_properties(header.field("properties") or ""))
        target = topic
        if topic.startswith(RETRY_TOPIC_PREFIX):
            max_times = header.int_field("maxReconsumeTimes", MAX_RECONSUME_TIMES)
            if reconsume_times >= max_times:  # handleRetryAndDLQ: on to the dead-letter queue
                group = topic[len(RETRY_TOPIC_PREFIX) :]
                target = DLQ_TOPIC_PREFIX + group
                self.ctx.meta.topics.create_in_send_back(target, 1, PERM_WRITE)
                self.ctx.on_topics_changed()
                queue_id = 0
        properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None)  # not stored (RocketMQ #2883)
        properties[PROPERTY_CLUSTER] = self.ctx.config.broker_cluster_name
        common: dict[str, Any] = {
            "topic": target,
            "queue_id": queue_id,
            "sysflag": header.int_field("sysFlag", 0),
            "born_timestamp": header.int_field("bornTimestamp", 0) or None,
            "born_host": peer_address(connection),
            "reconsume_times": reconsume_times,
        }
        # Java clients send batches as SEND_BATCH_MESSAGE; the C++ client sends SEND_MESSAGE
        # with batch=1, which a Java broker (Boolean.parseBoolean) would store as one
        # message holding the encoded batch. trioha reads it as the batch it is.
        batch_flag = (header.field("batch") or "").strip().lower()
        if request.code == RequestCode.SEND_BATCH_MESSAGE or batch_flag in {"true", "1"}:
            try:
                items = decode_batch(request.body)
            except BatchError as exc:
                return request.response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
            if not items:
                return request.response(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
            batch = []
            for item in items:
                props = dict(string_to_properties(item.properties))
                props.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
                props[PROPERTY_CLUSTER] = self.ctx.config.broker_cluster_name
                batch.append(
                    new_message(**common, body=item.body, flag=item.flag, properties=props)
                )
            result = await self.ctx.broker.put_batch(batch)
        else:
            result = await self.ctx.broker.put(
                body=request.body,
                flag=header.int_field("flag", 0),
                properties=properties,
                **common,
            )
        return self._send_response(request, result, queue_id)

    def _check_topic(
        self, header: RemotingCommand, connection: RemotingConnection
    ) -> TopicConfig | RemotingCommand:
        """``AbstractSendMessageProcessor.msgCheck``: find or auto-create the topic."""
        topic = header.require("topic")
        error = topic_error(topic)
        if error is not None:
            return header.response(ResponseCode.SYSTEM_ERROR, error)
        config = self.ctx.meta.topics.select(topic)
        if config is None:
            config = self.ctx.meta.topics.create_in_send(
                topic,
                header.field("defaultTopic") or AUTO_CREATE_TOPIC,
                header.int_field("defaultTopicQueueNums", self.ctx.config.default_topic_queue_nums),
                header.int_field("topicSysFlag", 0),
            )
            if config is None and topic.startswith(RETRY_TOPIC_PREFIX):
                group = self.ctx.meta.groups.find(topic[len(RETRY_TOPIC_PREFIX) :])
                if group is not None:
                    config = self.ctx.meta.topics.create_in_send_back(
                        topic, group.retry_queue_nums, PERM_READ | PERM_WRITE
                    )
            if config is None:
                return header.response(
                    ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                )
            self.ctx.on_topics_changed()
        if not config.writeable:
            return header.response(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
            )
        return config

    def _send_response(
        self, request: RemotingCommand, result: PutResult, queue_id: int
    ) -> RemotingCommand:
        """``handlePutMessageResult``: PutStatus → response code, and the header fields."""
        status = result.status
        if status.is_stored:
            return request.response(
                status.response_code,
                None,
                {
                    "msgId": result.msg_id,
                    "queueId": queue_id,
                    "queueOffset": result.queue_offset,
                    "MSG_REGION": DEFAULT_REGION,
                    "TRACE_ON": "true",
                },
            )
        remarks = {
            PutStatus.SERVICE_NOT_AVAILABLE: self.ctx.service_not_available_remark(),
            PutStatus.CREATE_MAPPED_FILE_FAILED: (
                "create mapped file failed, server is busy or broken."
            ),
            PutStatus.MESSAGE_ILLEGAL: "the message is illegal, maybe msg body or properties "
            "length not matched. msg body length limit 128k, msg properties length limit 32k.",
            PutStatus.PROPERTIES_SIZE_EXCEEDED: "the message is illegal, maybe msg properties "
            "length limit 32k.",
            PutStatus.OS_PAGE_CACHE_BUSY: (
                "[PC_SYNCHRONIZED]broker busy, start flow control for a while"
            ),
        }
        return request.response(status.response_code, remarks.get(status, status.value))

    async def consumer_send_msg_back(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``SendMessageProcessor.consumerSendMsgBack``: a failed message goes to retry.

        trioha puts it straight into ``%RETRY%<group>`` (no delay level: there is no
        schedule service), or into ``%DLQ%<group>`` after ``maxReconsumeTimes``.
        """
        if self.ctx.is_slave:
            return request.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE_REMARK
            )
        group_name = request.require("group")
        group = self.ctx.meta.groups.find(group_name)
        if group is None:
            return request.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group_name}",
            )
        offset = request.int_field("offset")
        record = self.ctx.read_record_at(offset)
        if record is None:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}"
            )
        message = record
        max_times = request.int_field("maxReconsumeTimes", group.retry_max_times)
        delay_level = request.int_field("delayLevel", 0)
        reconsume_times = message.reconsume_times
        if reconsume_times >= max_times or delay_level < 0:
            topic = DLQ_TOPIC_PREFIX + group_name
            config = self.ctx.meta.topics.create_in_send_back(topic, 1, PERM_WRITE)
        else:
            topic = RETRY_TOPIC_PREFIX + group_name
            config = self.ctx.meta.topics.create_in_send_back(
                topic, group.retry_queue_nums, PERM_READ | PERM_WRITE
            )
        self.ctx.on_topics_changed()
        props = message.properties_dict()
        props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, request.field("originMsgId") or message.msg_id)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        result = await self.ctx.broker.put(
            topic=topic,
            body=message.body,
            properties=props,
            queue_id=random.randrange(config.write_queue_nums),
            flag=message.flag,
            sysflag=message.sysflag,
            born_timestamp=message.born_timestamp,
            born_host=peer_address(connection),
            reconsume_times=reconsume_times + 1,
        )
        if result.status.is_stored:
            return request.response(ResponseCode.SUCCESS)
        return request.response(ResponseCode.SYSTEM_ERROR, result.status.value)
