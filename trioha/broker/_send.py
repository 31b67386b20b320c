"""``SendMessageProcessor``: sends, batches and consumers' send-backs.

Every send takes the same three steps, whether it arrived alone or in a read with others
(``RemotingConnection`` hands a read's sends over together, :meth:`SendMessageProcessor.
take_sends`; the dispatcher one, :meth:`SendMessageProcessor.send_message`):

1. **accept** (:meth:`~SendMessageProcessor._accept`): the header typed once
   (:class:`~trioha.broker._sendheader.SendMessageHeader`), the checks of ``msgCheck`` and
   ``handleRetryAndDLQ``, and the records to store (one, or a batch's), or the response
   refusing the send before the store;
2. **store**: every accepted send of the read appended now, in arrival order, with one write
   (``Broker.append_each``), and one wait for the flush and replication policies up to the
   last one's end (``Broker.wait_stored``), as RocketMQ's group commit would answer them;
3. **answer** (:meth:`~SendMessageProcessor._answer`): ``handlePutMessageResult``'s response
   code, header fields and remarks; the figures of every answered send recorded in one place
   (:meth:`~SendMessageProcessor._record`: the served counters and latencies, the runtime
   info's ``StoreStatsService`` figures, the broker's put statistics).
"""

from __future__ import annotations

import collections
import logging
import random
from collections.abc import Sequence

import attrs
import trio

from trioha._status import PutResult, PutStatus
from trioha.broker._batch import BatchError, decode_batch
from trioha.broker._context import (
    SERVICE_NOT_AVAILABLE_REMARK,
    BrokerContext,
    Handler,
    peer_address,
    topic_error,
)
from trioha.broker._delaylevels import is_delayed
from trioha.broker._metadata import DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX, TopicConfig
from trioha.broker._sendheader import SendMessageHeader
from trioha.remoting import (
    AUTO_CREATE_TOPIC,
    PERM_READ,
    PERM_WRITE,
    Burst,
    HeaderError,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    encode_response,
)
from trioha.store import (
    MAX_PROPERTIES_SIZE,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    HostAddress,
    NewMessage,
    string_to_properties,
)

log = logging.getLogger("trioha.broker")

#: ``MixAll.PROPERTY_CLUSTER`` and the region/trace fields a 4.9 broker adds to responses.
PROPERTY_CLUSTER = "CLUSTER"
DEFAULT_REGION = "DefaultRegion"
#: The request codes of a send (a consumer's send-back is a request of its own).
SENDS = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)
_SEND_NAMES: dict[int, str] = {code: RequestCode(code).name for code in SENDS}
#: Response codes of a stored message (``PutMessageResult.isOk``, whatever the flush or
#: replica outcome): the runtime info counts the others as failed puts.
_STORED = frozenset(status.response_code for status in PutStatus if status.is_stored)


def _stored_fields(result: PutResult, queue_id: int) -> dict[str, str]:
    """``SendMessageResponseHeader`` of a stored message, and the region and trace flags a
    4.9 broker adds (``handlePutMessageResult``)."""
    return {
        "msgId": result.msg_id,
        "queueId": str(queue_id),
        "queueOffset": str(result.queue_offset),
        "MSG_REGION": DEFAULT_REGION,
        "TRACE_ON": "true",
    }


@attrs.frozen
class _Read:
    """What the sends of one read share, looked up once for all of them."""

    peer: str
    slave: bool
    cluster: str
    born_host: HostAddress | None


class SendMessageProcessor:
    """Mirrors RocketMQ's ``SendMessageProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self._hosts: dict[str, HostAddress] = {}
        #: Topic names already found valid (``topic_error``), checked once.
        self._valid_topics: set[str] = set()

    def _born_host(self, connection: RemotingConnection) -> HostAddress | None:
        """The producer's address as the store takes it, parsed once per peer."""
        peer = connection.peer
        host = self._hosts.get(peer)
        if host is None:
            address = peer_address(connection)
            if address is None:
                return None
            if len(self._hosts) >= 4096:  # peers come and go: forget them now and then
                self._hosts.clear()
            host = self._hosts[peer] = HostAddress(*address)
        return host

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
        }

    # --- the two ways in ----------------------------------------------------------------
    def take_sends(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        """Take the sends of one read (every send code, batches too): accepted and appended
        now, together, before this returns (so they are stored in the order they arrived),
        answered by one wait (the module docstring's steps)."""
        sends = [request for request in requests if request.code in SENDS]
        return self._serve(sends, connection, frames=True) if sends else None

    async def send_message(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``SendMessageProcessor.asyncSendMessage`` / ``asyncSendBatchMessage`` for one send
        handed over on its own: the same steps as a read's sends, for one."""
        (response,) = await self._serve([request], connection, frames=False).finish()
        assert isinstance(response, RemotingCommand)
        return response

    def _serve(
        self, sends: Sequence[RemotingCommand], connection: RemotingConnection, *, frames: bool
    ) -> Burst:
        """Accept and append *sends* now; the burst's ``finish`` waits and answers them
        (response frames with *frames*, commands without)."""
        started = trio.current_time()  # the run's clock: a test's MockClock decides it
        ctx = self.ctx
        slave = ctx.is_slave
        read = _Read(
            connection.peer,
            slave,
            ctx.config.broker_cluster_name,
            None if slave else self._born_host(connection),
        )
        accepted = [self._accept(request, read) for request in sends]
        puts = [records for records in accepted if not isinstance(records, RemotingCommand)]
        broker = ctx.broker
        results = broker.append_each(puts) if puts else []

        async def finish() -> list[RemotingCommand | bytes | None]:
            stored = [result for result in results if result.offset >= 0]
            status = PutStatus.PUT_OK
            if stored:
                status = await broker.wait_stored(stored[0].offset, stored[-1].end_offset)
            responses: list[RemotingCommand | bytes | None] = []
            codes: collections.Counter[tuple[int, int]] = collections.Counter()
            put = 0
            for request, records in zip(sends, accepted, strict=True):
                if isinstance(records, RemotingCommand):
                    response: RemotingCommand | bytes = records
                    code = records.code
                else:
                    response, code = self._answer(
                        request, results[put], status, records[0].queue_id, frames=frames
                    )
                    put += 1
                codes[request.code, code] += 1
                responses.append(response)
            self._record(codes, puts, results, status, trio.current_time() - started)
            return responses

        return Burst(sends, finish)

    # --- 1. accept ----------------------------------------------------------------------
    def _accept(
        self, request: RemotingCommand, read: _Read
    ) -> Sequence[NewMessage] | RemotingCommand:
        """The records a send asks to store (one, or a batch's), or the response refusing it
        before the store: ``msgCheck``, ``handleRetryAndDLQ`` and the message built as
        ``asyncSendMessage``/``asyncSendBatchMessage`` build it (``WAIT`` dropped unless the
        message is delayed, ``CLUSTER`` added)."""
        try:
            header = SendMessageHeader.from_command(request)
        except HeaderError as exc:
            return request.response(ResponseCode.SYSTEM_ERROR, str(exc))
        if read.slave:
            # The store would refuse anyway (SERVICE_NOT_AVAILABLE); refusing first keeps a
            # slave from auto-creating topics its master does not have.
            return request.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE_REMARK
            )
        topic = header.topic
        config = self._check_topic(request, topic, header)
        if isinstance(config, RemotingCommand):
            return config
        queue_id = header.queue_id
        if queue_id >= max(config.read_queue_nums, config.write_queue_nums):
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, {config} Producer: {read.peer}",
            )
        if queue_id < 0:
            queue_id = random.randrange(config.write_queue_nums)
        reconsume_times = header.reconsume_times
        target, dead_letter = topic, False
        if topic.startswith(RETRY_TOPIC_PREFIX) and reconsume_times >= header.max_reconsume_times:
            # handleRetryAndDLQ: on to the dead-letter queue
            target = DLQ_TOPIC_PREFIX + topic[len(RETRY_TOPIC_PREFIX) :]
            self.ctx.meta.topics.create_in_send_back(target, 1, PERM_WRITE)
            self.ctx.on_topics_changed()
            queue_id, dead_letter = 0, True
        sysflag, born_timestamp = header.sys_flag, header.born_timestamp or None
        cluster, born_host = read.cluster, read.born_host
        if header.batch:
            try:
                items = decode_batch(request.body)
            except BatchError as exc:
                return request.response(ResponseCode.MESSAGE_ILLEGAL, str(exc))
            if not items:
                return request.response(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
            records = []
            for item in items:
                props = dict(string_to_properties(item.properties))
                props.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
                props[PROPERTY_CLUSTER] = cluster
                records.append(
                    NewMessage(
                        target,
                        item.body,
                        queue_id,
                        item.flag,
                        props,
                        sysflag,
                        born_timestamp,
                        born_host,
                        reconsume_times=reconsume_times,
                    )
                )
            return records
        properties = dict(string_to_properties(header.properties))
        if dead_letter:
            properties[PROPERTY_DELAY_TIME_LEVEL] = "0"  # setDelayTimeLevel(0)
        if PROPERTY_DELAY_TIME_LEVEL not in properties or not is_delayed(properties):
            # A delayed message is re-serialised with it, as in Java (RocketMQ #2883).
            properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
        properties[PROPERTY_CLUSTER] = cluster
        return (
            NewMessage(
                target,
                request.body,
                queue_id,
                header.flag,
                properties,
                sysflag,
                born_timestamp,
                born_host,
                reconsume_times=reconsume_times,
            ),
        )

    def _check_topic(
        self, request: RemotingCommand, topic: str, header: SendMessageHeader
    ) -> TopicConfig | RemotingCommand:
        """``AbstractSendMessageProcessor.msgCheck``: find or auto-create the topic.

        The topic's config, or the response refusing the send.
        """
        if topic not in self._valid_topics:
            error = topic_error(topic)
            if error is not None:
                return request.response(ResponseCode.SYSTEM_ERROR, error)
            if len(self._valid_topics) >= 4096:  # names come and go: forget them now and then
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        config = self.ctx.meta.topics.select(topic)
        if config is None:
            config = self.ctx.meta.topics.create_in_send(
                topic,
                header.default_topic or AUTO_CREATE_TOPIC,
                self.ctx.config.default_topic_queue_nums
                if header.default_topic_queue_nums is None
                else header.default_topic_queue_nums,
                header.topic_sys_flag,
            )
            if config is None and topic.startswith(RETRY_TOPIC_PREFIX):
                group = self.ctx.meta.groups.find(topic[len(RETRY_TOPIC_PREFIX) :])
                if group is not None:
                    config = self.ctx.meta.topics.create_in_send_back(
                        topic, group.retry_queue_nums, PERM_READ | PERM_WRITE
                    )
            if config is None:
                return request.response(
                    ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                )
            self.ctx.on_topics_changed()
        if not config.writeable:
            return request.response(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
            )
        return config

    # --- 3. answer ----------------------------------------------------------------------
    def _answer(
        self,
        request: RemotingCommand,
        result: PutResult,
        waited: PutStatus,
        queue_id: int,
        *,
        frames: bool,
    ) -> tuple[RemotingCommand | bytes, int]:
        """``handlePutMessageResult``: the put's status as a response code, the stored
        message's header fields or the refusal's remark; and the response code.

        A stored message's status is what the wait for the policies gave (*waited*). With
        *frames* a stored message's response is its frame, formatted straight from the
        fields (``encode_response``).
        """
        status = waited if result.offset >= 0 else result.status
        code = status.response_code
        if status.is_stored:
            fields = _stored_fields(result, queue_id)
            if frames:
                return encode_response(request, code, fields), code
            return request.response(code, None, fields), code
        remarks = {
            PutStatus.SERVICE_NOT_AVAILABLE: self.ctx.service_not_available_remark(),
            PutStatus.CREATE_MAPPED_FILE_FAILED: (
                "create mapped file failed, server is busy or broken."
            ),
            PutStatus.MESSAGE_ILLEGAL: self._illegal_remark(request),
            PutStatus.PROPERTIES_SIZE_EXCEEDED: "the message is illegal, maybe msg properties "
            f"length limit {MAX_PROPERTIES_SIZE} bytes.",
            PutStatus.OS_PAGE_CACHE_BUSY: (
                "[PC_SYNCHRONIZED]broker busy, start flow control for a while"
            ),
        }
        return request.response(code, remarks.get(status, status.value)), code

    def _record(
        self,
        codes: collections.Counter[tuple[int, int]],
        puts: Sequence[Sequence[NewMessage]],
        results: Sequence[PutResult],
        waited: PutStatus,
        seconds: float,
    ) -> None:
        """The one place the figures of answered sends are recorded, however they arrived:
        requests served and their latency by request and response code (``status``,
        ``/metrics``), ``StoreStatsService``'s put figures (the runtime info's
        ``putMessageEntireTimeMax``, ``putMessageDistributeTime``, failed puts) and the
        broker's put results and latency by message."""
        ctx = self.ctx
        for (request_code, code), count in codes.items():
            name = _SEND_NAMES[request_code]
            ctx.served[f"{name}.{code}"] += count
            ctx.latency[name].observe(seconds, count)
            ctx.stats.record_put(seconds * 1000, ok=code in _STORED, count=count)
        stored = 0
        refused: collections.Counter[PutStatus] = collections.Counter()
        for records, result in zip(puts, results, strict=True):
            if result.offset >= 0:
                stored += len(records)
            else:
                refused[result.status] += len(records)
        if stored:
            ctx.broker.count_puts(waited, stored, seconds)
        for status, count in refused.items():
            ctx.broker.count_puts(status, count, seconds)

    # --- the checks ---------------------------------------------------------------------
    def _illegal_remark(self, request: RemotingCommand) -> str:
        """Why a send was refused as MESSAGE_ILLEGAL, with the limits this broker runs with.

        RocketMQ 4.9.7 says "msg body length limit 128k" whatever ``maxMessageSize`` is (4 MiB
        by default); trioha names the configured limit and, for a single message, its size.
        """
        limit = self.ctx.config.max_message_size
        body = len(request.body)
        if request.code != RequestCode.SEND_BATCH_MESSAGE and body > limit:
            return (
                f"the message is illegal: its body is {body} bytes, more than maxMessageSize "
                f"{limit} bytes"
            )
        return (
            "the message is illegal, maybe msg body or properties length not matched. msg body "
            f"length limit {limit} bytes (maxMessageSize), msg properties length limit "
            f"{MAX_PROPERTIES_SIZE} bytes."
        )

    async def consumer_send_msg_back(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``SendMessageProcessor.consumerSendMsgBack``: a failed message goes to retry.

        Into ``%RETRY%<group>`` after a delay level (the request's, or 3 + reconsume times),
        so the put parks it in ``SCHEDULE_TOPIC_XXXX`` until due; into ``%DLQ%<group>``
        after ``maxReconsumeTimes`` or for a negative level.
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
            config = self.ctx.meta.topics.create_in_send_back(topic, 1, PERM_READ | PERM_WRITE)
            delay_level = 0
        else:
            delay_level = delay_level or 3 + reconsume_times
            topic = RETRY_TOPIC_PREFIX + group_name
            config = self.ctx.meta.topics.create_in_send_back(
                topic, group.retry_queue_nums, PERM_READ | PERM_WRITE
            )
        self.ctx.on_topics_changed()
        props = message.properties_dict()
        props.setdefault(PROPERTY_RETRY_TOPIC, message.topic)
        # The first delivery's offset message id (store host + commit log offset), as
        # RocketMQ keeps it: queryMsgById decodes it. Not the request's originMsgId, which
        # a client fills with its UNIQ_KEY.
        if not props.get(PROPERTY_ORIGIN_MESSAGE_ID, "").strip():
            props[PROPERTY_ORIGIN_MESSAGE_ID] = message.msg_id
        props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)  # setDelayTimeLevel
        result = await self.ctx.broker.put(
            NewMessage(
                topic=topic,
                body=message.body,
                queue_id=random.randrange(config.write_queue_nums),
                flag=message.flag,
                properties=props,
                sysflag=message.sysflag,
                born_timestamp=message.born_timestamp or None,
                born_host=peer_address(connection),
                reconsume_times=reconsume_times + 1,
            )
        )
        if result.status.is_stored:
            return request.response(ResponseCode.SUCCESS)
        return request.response(ResponseCode.SYSTEM_ERROR, result.status.value)
