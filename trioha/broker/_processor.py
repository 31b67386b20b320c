"""The broker port's request processors: send, pull, offsets, heartbeats, admin.

One class, :class:`BrokerProcessor`, answers every request code the official clients send
on their normal paths. Each handler names the RocketMQ processor method it mirrors
(``SendMessageProcessor``, ``PullMessageProcessor``, ``ConsumerManageProcessor``,
``ClientManageProcessor``, ``QueryMessageProcessor``, ``AdminBrokerProcessor``) and keeps
RocketMQ's response codes and remarks, because clients branch on them.

Where trioha differs, the handler says so: a slave refuses sends before any topic is
auto-created (its tables come from its master); sent-back messages go straight to the retry
topic (there is no delay-level scheduler); QUERY_MESSAGE by key is not supported (there is no
message index).
"""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import trio

from trioha._config import BrokerRole
from trioha._errors import RemotingError, StorageError
from trioha._status import PutResult, PutStatus
from trioha.broker._batch import BatchError, decode_batch
from trioha.broker._clients import ClientChannel, ClientManager, SubscriptionData
from trioha.broker._metadata import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX, Metadata, TopicConfig
from trioha.broker._reput import ReputService
from trioha.broker._types import BrokerLike
from trioha.remoting._codec import HeaderError, RemotingCommand
from trioha.remoting._codes import (
    AUTO_CREATE_TOPIC,
    MASTER_ID,
    PERM_READ,
    PERM_WRITE,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from trioha.remoting._connection import RemotingConnection
from trioha.remoting._json import dumps_bytes, loads_lenient
from trioha.store._consumequeue import ConsumeQueue
from trioha.store._message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    DecodedMessage,
    decode_record,
    string_to_properties,
)

log = logging.getLogger("trioha.remoting.broker")

#: ``maxTransferBytesOnMessageInMemory`` / ``maxTransferCountOnMessageInMemory``.
MAX_TRANSFER_BYTES = 256 * 1024
MAX_TRANSFER_COUNT = 32
#: ``DefaultMessageStore.getMessage``: units scanned per pull when filtering (16000 B / 20).
MAX_FILTER_UNITS = 800
#: ``MixAll.PROPERTY_CLUSTER`` and the region/trace fields a 4.9 broker adds to responses.
PROPERTY_CLUSTER = "CLUSTER"
DEFAULT_REGION = "DefaultRegion"
#: ``subscriptionGroupConfig.retryMaxTimes`` default when the request does not say.
MAX_RECONSUME_TIMES = 16

_SERVICE_NOT_AVAILABLE_REMARK = (
    "service not available now. It may be caused by one of the following reasons: "
    "the broker's disk is full, messages are put to the slave, message store has been "
    "shut down, etc."
)


class GetStatus:
    """``GetMessageStatus`` names (as the remark of a pull response)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.frozen
class GetResult:
    """``GetMessageResult``: the records found and where the consumer goes next."""

    status: str
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: tuple[bytes, ...] = ()


def queue_min_offset(queue: ConsumeQueue, commitlog_min: int) -> int:
    """First queue offset whose message is still in the commit log (``getMinOffsetInQueue``)."""
    lo, hi = queue.min_offset, queue.max_offset
    while lo < hi:  # units are in commit log order: binary search the first one still there
        mid = (lo + hi) // 2
        unit = queue.get(mid)
        if unit is not None and (unit.is_blank or unit.commitlog_offset < commitlog_min):
            lo = mid + 1
        else:
            hi = mid
    return lo


class BrokerProcessor:
    """Answers the broker port's requests; see the module docstring."""

    def __init__(
        self,
        broker: BrokerLike,
        meta: Metadata,
        reput: ReputService,
        *,
        broker_addr: str,
        nursery: trio.Nursery,
        clients: ClientManager | None = None,
        on_topics_changed: Callable[[], None] = lambda: None,
        extra_info: Callable[[], dict[str, str]] = dict,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.broker = broker
        self.config = broker.config
        self.meta = meta
        self.reput = reput
        self.broker_addr = broker_addr
        self.clients = clients or ClientManager()
        self.nursery = nursery
        self.on_topics_changed = on_topics_changed
        self.extra_info = extra_info
        self.now = clock
        self._handlers: dict[int, Callable[..., Any]] = {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self.get_all_delay_offset,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.get_all_subscription_group,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
        }
        self._locks: dict[tuple[str, str, int], tuple[str, int]] = {}
        #: Requests answered, by ``"<code name>.<response code>"`` (reported by ``status``).
        self.served: collections.Counter[str] = collections.Counter()

    @property
    def is_slave(self) -> bool:
        return self.config.broker_role is BrokerRole.SLAVE

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        handler = self._handlers.get(request.code)
        if handler is None:
            log.debug("%s: request code %d not supported", connection.peer, request.code)
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request.code} not supported",
            )
        result: RemotingCommand | None = await handler(request, connection)
        if result is not None:
            self.served[f"{RequestCode(request.code).name}.{result.code}"] += 1
        return result

    # --- send (SendMessageProcessor) ----------------------------------------------------
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
        if self.is_slave:
            # The store would refuse anyway (SERVICE_NOT_AVAILABLE); refusing first keeps a
            # slave from auto-creating topics its master does not have.
            return request.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, _SERVICE_NOT_AVAILABLE_REMARK
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
                self.meta.topics.create_in_send_back(target, 1, PERM_WRITE)
                self.on_topics_changed()
                queue_id = 0
        properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None)  # not stored (RocketMQ #2883)
        properties[PROPERTY_CLUSTER] = self.config.broker_cluster_name
        common: dict[str, Any] = {
            "topic": target,
            "queue_id": queue_id,
            "sysflag": header.int_field("sysFlag", 0),
            "born_timestamp": header.int_field("bornTimestamp", 0) or None,
            "born_host": _peer_address(connection),
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
                props[PROPERTY_CLUSTER] = self.config.broker_cluster_name
                batch.append({**common, "body": item.body, "flag": item.flag, "properties": props})
            result = await self.broker.put_batch(batch)
        else:
            result = await self.broker.put(
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
        error = _topic_error(topic)
        if error is not None:
            return header.response(ResponseCode.SYSTEM_ERROR, error)
        config = self.meta.topics.select(topic)
        if config is None:
            config = self.meta.topics.create_in_send(
                topic,
                header.field("defaultTopic") or AUTO_CREATE_TOPIC,
                header.int_field("defaultTopicQueueNums", self.config.default_topic_queue_nums),
                header.int_field("topicSysFlag", 0),
            )
            if config is None and topic.startswith(RETRY_TOPIC_PREFIX):
                group = self.meta.groups.find(topic[len(RETRY_TOPIC_PREFIX) :])
                if group is not None:
                    config = self.meta.topics.create_in_send_back(
                        topic, group.retry_queue_nums, PERM_READ | PERM_WRITE
                    )
            if config is None:
                return header.response(
                    ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                )
            self.on_topics_changed()
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
            PutStatus.SERVICE_NOT_AVAILABLE: _SERVICE_NOT_AVAILABLE_REMARK,
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
        if self.is_slave:
            return request.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, _SERVICE_NOT_AVAILABLE_REMARK
            )
        group_name = request.require("group")
        group = self.meta.groups.find(group_name)
        if group is None:
            return request.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group_name}",
            )
        offset = request.int_field("offset")
        record = self._read_record_at(offset)
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
            config = self.meta.topics.create_in_send_back(topic, 1, PERM_WRITE)
        else:
            topic = RETRY_TOPIC_PREFIX + group_name
            config = self.meta.topics.create_in_send_back(
                topic, group.retry_queue_nums, PERM_READ | PERM_WRITE
            )
        self.on_topics_changed()
        props = message.properties_dict()
        props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, request.field("originMsgId") or message.msg_id)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        result = await self.broker.put(
            topic=topic,
            body=message.body,
            properties=props,
            queue_id=random.randrange(config.write_queue_nums),
            flag=message.flag,
            sysflag=message.sysflag,
            born_timestamp=message.born_timestamp,
            born_host=_peer_address(connection),
            reconsume_times=reconsume_times + 1,
        )
        if result.status.is_stored:
            return request.response(ResponseCode.SUCCESS)
        return request.response(ResponseCode.SYSTEM_ERROR, result.status.value)

    def _read_record_at(self, offset: int) -> Any:
        commitlog = self.broker.store.commitlog
        try:
            head = commitlog.read(offset, 4)
            if len(head) < 4:
                return None
            size = int.from_bytes(head, "big", signed=True)
            data = commitlog.read(offset, size)
        except StorageError:
            return None
        decoded = decode_record(data, 0, check_crc=False, base_offset=offset)
        return decoded.message if isinstance(decoded, DecodedMessage) else None

    # --- pull (PullMessageProcessor) ----------------------------------------------------
    async def pull_message(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``PullMessageProcessor.processRequest`` with long polling.

        A pull that finds nothing is held until a message for its queue is indexed or
        ``suspendTimeoutMillis`` passes (``PullRequestHoldService``), then answered as a
        fresh pull would be.
        """
        response = self._pull_once(request, allow_suspend=True)
        if response is not None:
            return response
        timeout = request.int_field("suspendTimeoutMillis", 15_000) / 1000
        topic, queue_id = request.require("topic"), request.int_field("queueId")
        with trio.move_on_after(timeout):
            await self.reput.wait_arrival(topic, queue_id, request.int_field("queueOffset"))
        final = self._pull_once(request, allow_suspend=False)
        assert final is not None
        return final

    def _pull_once(
        self, request: RemotingCommand, *, allow_suspend: bool
    ) -> RemotingCommand | None:
        """One pass of the pull; None means "suspend and try again later"."""
        group_name = request.require("consumerGroup")
        topic = request.require("topic")
        queue_id = request.int_field("queueId")
        offset = request.int_field("queueOffset")
        sys_flag = request.int_field("sysFlag", 0)
        group = self.meta.groups.find(group_name)
        if group is None:
            return request.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group_name}] does not exist",
            )
        if not group.consume_enable:
            return request.response(
                ResponseCode.NO_PERMISSION, f"subscription group no permission, {group_name}"
            )
        config = self.meta.topics.select(topic)
        if config is None and self.is_slave:
            config = self._slave_topic(topic)
        if config is None:
            return request.response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not config.readable:
            return request.response(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
            )
        if not 0 <= queue_id < config.read_queue_nums:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{config.read_queue_nums}]",
            )
        if sys_flag & PULL_FLAG_SUBSCRIPTION:
            subscription = SubscriptionData.build(
                topic,
                request.field("subscription"),
                expression_type=request.field("expressionType") or "TAG",
            )
        else:
            found = self.clients.find_subscription(group_name, topic)
            if found is None:
                return request.response(
                    ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist"
                )
            subscription = found
        if subscription.expression_type.upper() != "TAG":
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                "The broker does not support consumer to filter message by "
                + subscription.expression_type,
            )
        result = self.get_message(
            topic, queue_id, offset, request.int_field("maxMsgNums", 32), subscription
        )
        code = {
            GetStatus.FOUND: ResponseCode.SUCCESS,
            GetStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
            GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
            GetStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
            GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
            GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
            GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
        }.get(result.status)
        if code is None:  # NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        next_offset = result.next_begin_offset
        if code == ResponseCode.PULL_OFFSET_MOVED and self.is_slave:
            # A slave does not correct offsets (offsetCheckInSlave=false): it may just be
            # behind its master. The consumer retries, at the offset it asked for.
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
            next_offset = offset
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
            return None
        if (
            allow_suspend
            and sys_flag & PULL_FLAG_COMMIT_OFFSET
            and not self.is_slave
            and request.field("commitOffset") is not None
        ):
            commit = request.int_field("commitOffset")
            if commit >= 0:
                self.meta.offsets.commit(group_name, topic, queue_id, commit)
        fields = {
            "suggestWhichBrokerId": MASTER_ID,
            "nextBeginOffset": next_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
        }
        body = b"".join(result.records) if code == ResponseCode.SUCCESS else b""
        return request.response(code, result.status, fields, body)

    def _slave_topic(self, topic: str) -> TopicConfig | None:
        """A topic a slave has messages for, or a retry topic, before its metadata sync.

        A slave's topic table is its master's as of the last sync (every 10 s). A topic
        created on the master since then (a retry topic is created by the first heartbeat)
        is unknown here; RocketMQ answers TOPIC_NOT_EXIST, which the C++ client retries in a
        tight loop. trioha serves what its consume queues hold, and holds a pull for an
        empty retry topic like any empty queue.
        """
        queue_ids = self.reput.queues.queue_ids(topic)
        if queue_ids:
            return TopicConfig(topic, queue_ids[-1] + 1, queue_ids[-1] + 1, PERM_READ)
        if topic.startswith(RETRY_TOPIC_PREFIX):
            return TopicConfig(topic, 1, 1, PERM_READ)
        return None

    def get_message(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_msg_nums: int,
        subscription: SubscriptionData,
    ) -> GetResult:
        """``DefaultMessageStore.getMessage`` for tag filters."""
        commitlog = self.broker.store.commitlog
        queue = self.reput.queues.get(topic, queue_id)
        if queue is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        min_offset = queue_min_offset(queue, commitlog.min_offset)
        max_offset = queue.max_offset
        if max_offset == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        if offset < min_offset:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, min_offset, min_offset, max_offset)
        if offset == max_offset:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_offset, max_offset)
        if offset > max_offset:
            correct = min_offset if min_offset == 0 else max_offset
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, correct, min_offset, max_offset)
        records: list[bytes] = []
        total = 0
        scanned = 0
        missing = 0
        limit = max(MAX_FILTER_UNITS, max_msg_nums)
        position = offset
        while scanned < limit and position < max_offset:
            units = queue.read(position, limit - scanned)
            if not units:
                break
            for unit in units:
                if records and (
                    len(records) >= max_msg_nums
                    or total + unit.size > MAX_TRANSFER_BYTES
                    or len(records) >= MAX_TRANSFER_COUNT
                ):
                    break
                scanned += 1
                if unit.is_blank or not subscription.matches(unit.tags_code):
                    continue
                try:
                    data = commitlog.read(unit.commitlog_offset, unit.size)
                except StorageError:
                    data = b""
                if len(data) != unit.size:
                    missing += 1
                    continue
                records.append(bytes(data))
                total += unit.size
            else:
                position = offset + scanned
                continue
            break
        next_offset = offset + scanned
        if records:
            status = GetStatus.FOUND
        elif missing:
            status = GetStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, next_offset, min_offset, max_offset, tuple(records))

    # --- consumer offsets (ConsumerManageProcessor) -------------------------------------
    async def query_consumer_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``queryConsumerOffset``: the committed offset, or 0 for a new group on a queue
        that still starts at 0 (RocketMQ answers that when the first message is in memory;
        trioha treats every message as in memory), else QUERY_NOT_FOUND."""
        group, topic = request.require("consumerGroup"), request.require("topic")
        queue_id = request.int_field("queueId")
        offset = self.meta.offsets.query(group, topic, queue_id)
        if offset >= 0:
            return request.response(ResponseCode.SUCCESS, None, {"offset": offset})
        queue = self.reput.queues.get(topic, queue_id)
        min_offset = queue_min_offset(queue, self.broker.store.commitlog.min_offset) if queue else 0
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
        self.meta.offsets.commit(
            request.require("consumerGroup"),
            request.require("topic"),
            request.int_field("queueId"),
            request.int_field("commitOffset"),
        )
        return request.response(ResponseCode.SUCCESS)

    # --- clients (ClientManageProcessor) ------------------------------------------------
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
        now = self.now()
        channel = ClientChannel(client_id, connection, request.language, request.version, now)
        for consumer in data.get("consumerDataSet") or []:
            group_name = str(consumer.get("groupName", ""))
            group = self.meta.groups.find(group_name)
            if group is not None and not self.is_slave:
                retry = RETRY_TOPIC_PREFIX + group_name
                if self.meta.topics.select(retry) is None:
                    self.meta.topics.create_in_send_back(
                        retry, group.retry_queue_nums, PERM_READ | PERM_WRITE
                    )
                    self.on_topics_changed()
            subscriptions = [
                SubscriptionData.from_json(s)
                for s in consumer.get("subscriptionDataSet") or []
                if isinstance(s, dict)
            ]
            changed = self.clients.register_consumer(
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
            self.clients.register_producer(
                str(producer.get("groupName", "")), attrs.evolve(channel)
            )
        return request.response(ResponseCode.SUCCESS)

    async def unregister_client(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``ClientManageProcessor.unregisterClient``."""
        producer = request.field("producerGroup")
        if producer:
            self.clients.unregister_producer(producer, connection)
        consumer = request.field("consumerGroup")
        if consumer and self.clients.unregister_consumer(consumer, connection):
            self.notify_consumer_ids_changed(consumer)
        return request.response(ResponseCode.SUCCESS)

    async def get_consumer_list_by_group(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``ConsumerManageProcessor.getConsumerListByGroup``."""
        group = request.require("consumerGroup")
        ids = self.clients.consumer_ids(group)
        if not ids:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}"
            )
        return request.response(ResponseCode.SUCCESS, body=dumps_bytes({"consumerIdList": ids}))

    async def check_client_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS)

    def notify_consumer_ids_changed(self, group: str) -> None:
        """``DefaultConsumerIdsChangeListener``: tell every member (oneway, best effort)."""
        for member in self.clients.connections_of(group):
            if isinstance(member, RemotingConnection):
                self.nursery.start_soon(self._notify, member, group)

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
        for group in self.clients.connection_closed(connection):
            self.notify_consumer_ids_changed(group)

    def scan_not_active(self) -> None:
        for group in self.clients.scan_not_active(self.now()):
            self.notify_consumer_ids_changed(group)

    # --- queue offsets and messages (AdminBrokerProcessor, QueryMessageProcessor) -------
    def _queue(self, request: RemotingCommand) -> tuple[ConsumeQueue | None, int]:
        queue = self.reput.queues.get(request.require("topic"), request.int_field("queueId"))
        commitlog_min = self.broker.store.commitlog.min_offset
        return queue, commitlog_min

    async def get_max_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        queue, _ = self._queue(request)
        return request.response(
            ResponseCode.SUCCESS, None, {"offset": queue.max_offset if queue else 0}
        )

    async def get_min_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        queue, commitlog_min = self._queue(request)
        offset = queue_min_offset(queue, commitlog_min) if queue else 0
        return request.response(ResponseCode.SUCCESS, None, {"offset": offset})

    def _store_timestamp(self, queue: ConsumeQueue, queue_offset: int) -> int | None:
        unit = queue.get(queue_offset)
        if unit is None or unit.is_blank:
            return None
        try:
            data = self.broker.store.commitlog.read(unit.commitlog_offset, unit.size)
        except StorageError:
            return None
        if len(data) != unit.size:
            return None
        decoded = decode_record(data, 0, check_crc=False, base_offset=unit.commitlog_offset)
        return decoded.message.store_timestamp if isinstance(decoded, DecodedMessage) else None

    async def get_earliest_msg_storetime(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        queue, commitlog_min = self._queue(request)
        stamp = (
            self._store_timestamp(queue, queue_min_offset(queue, commitlog_min)) if queue else None
        )
        return request.response(ResponseCode.SUCCESS, None, {"timestamp": stamp or -1})

    async def search_offset_by_timestamp(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getOffsetInQueueByTime``: the first message stored at or after ``timestamp``."""
        queue, commitlog_min = self._queue(request)
        wanted = request.int_field("timestamp")
        if queue is None:
            return request.response(ResponseCode.SUCCESS, None, {"offset": 0})
        lo, hi = queue_min_offset(queue, commitlog_min), queue.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            stamp = self._store_timestamp(queue, mid)
            if stamp is not None and stamp < wanted:
                lo = mid + 1
            else:
                hi = mid
        return request.response(ResponseCode.SUCCESS, None, {"offset": lo})

    async def view_message_by_id(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``QueryMessageProcessor.viewMessageById``: the record at a commit log offset."""
        offset = request.int_field("offset")
        message = self._read_record_at(offset)
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

    # --- admin (AdminBrokerProcessor) ----------------------------------------------------
    async def update_and_create_topic(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``updateAndCreateTopic``."""
        topic = request.require("topic")
        error = _topic_error(topic)
        if error is not None:
            return request.response(ResponseCode.SYSTEM_ERROR, error)
        if topic == self.config.broker_cluster_name:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"the topic[{topic}] is conflict with system reserved words.",
            )
        config = TopicConfig(
            topic,
            read_queue_nums=request.int_field("readQueueNums", 16),
            write_queue_nums=request.int_field("writeQueueNums", 16),
            perm=request.int_field("perm", PERM_READ | PERM_WRITE),
            topic_filter_type=request.field("topicFilterType") or "SINGLE_TAG",
            topic_sys_flag=request.int_field("topicSysFlag", 0),
            order=request.bool_field("order"),
        )
        self.meta.topics.update(config)
        self.on_topics_changed()
        return request.response(ResponseCode.SUCCESS)

    async def get_all_topic_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.meta.topics.encode().encode())

    async def get_all_consumer_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.meta.offsets.encode().encode())

    async def get_all_delay_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.meta.delay.encode().encode())

    async def get_all_subscription_group(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.meta.groups.encode().encode())

    async def get_broker_runtime_info(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getBrokerRuntimeInfo``: a KVTable of figures (RocketMQ's names where they exist,
        plus the broker's ``statistics()`` flattened under ``stats.``)."""
        commitlog = self.broker.store.commitlog
        table: dict[str, str] = {
            "brokerRole": self.config.broker_role.value,
            "brokerName": self.config.broker_name,
            "brokerId": str(self.config.broker_id),
            "brokerAddr": self.broker_addr,
            "commitLogMinOffset": str(commitlog.min_offset),
            "commitLogMaxOffset": str(commitlog.max_offset),
            "dispatchBehindBytes": str(self.reput.behind),
            "topicConfigDataVersion": dumps_bytes(self.meta.topics.data_version.to_json()).decode(),
            "subscriptionGroupDataVersion": dumps_bytes(
                self.meta.groups.data_version.to_json()
            ).decode(),
        }
        table.update(self.extra_info())
        table.update(_flatten("stats", self.broker.statistics()))
        table.update({f"served.{key}": str(n) for key, n in sorted(self.served.items())})
        return request.response(ResponseCode.SUCCESS, body=dumps_bytes({"table": table}))

    # --- orderly consumers (RebalanceLockManager) ---------------------------------------
    async def lock_batch_mq(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``lockBatchMQ``: a queue is locked to one client for 60 s at a time."""
        body = _json_body(request)
        group, client_id = str(body.get("consumerGroup", "")), str(body.get("clientId", ""))
        now = self.now()
        locked = []
        for mq in body.get("mqSet") or []:
            key = (group, str(mq.get("topic")), int(mq.get("queueId", 0)))
            holder = self._locks.get(key)
            if holder is None or holder[0] == client_id or now - holder[1] > 60_000:
                self._locks[key] = (client_id, now)
                locked.append(mq)
        return request.response(ResponseCode.SUCCESS, body=dumps_bytes({"lockOKMQSet": locked}))

    async def unlock_batch_mq(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        body = _json_body(request)
        group, client_id = str(body.get("consumerGroup", "")), str(body.get("clientId", ""))
        for mq in body.get("mqSet") or []:
            key = (group, str(mq.get("topic")), int(mq.get("queueId", 0)))
            if self._locks.get(key, ("", 0))[0] == client_id:
                del self._locks[key]
        return request.response(ResponseCode.SUCCESS)


def _json_body(request: RemotingCommand) -> dict[str, Any]:
    try:
        value = loads_lenient(request.body) if request.body else {}
    except ValueError as exc:
        raise HeaderError(f"request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HeaderError("request body is not a JSON object")
    return value


def _topic_error(topic: str) -> str | None:
    """``TopicValidator.validateTopic``: the remark for an invalid name, None if valid."""
    if not topic.strip():
        return "The specified topic is blank."
    if len(topic) > 127:
        return "The specified topic is longer than topic max length."
    if not all(c.isascii() and (c.isalnum() or c in "%|-_") for c in topic):
        return (
            f"The specified topic[{topic}] contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    return None


def _peer_address(connection: RemotingConnection) -> tuple[str, int] | None:
    host, _, port = connection.peer.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _flatten(prefix: str, value: Any) -> dict[str, str]:
    if attrs.has(type(value)):
        out: dict[str, str] = {}
        for field in attrs.fields(type(value)):
            out.update(_flatten(f"{prefix}.{field.name}", getattr(value, field.name)))
        return out
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten(f"{prefix}.{key}", item))
        return out
    if isinstance(value, list | tuple):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(f"{prefix}.{index}", item))
        return out
    if hasattr(value, "value") and not isinstance(value, int | float | str):
        return {prefix: str(value.value)}
    return {prefix: str(value)}
