"""``SendMessageProcessor``: sends, batches and consumers' send-backs."""

from __future__ import annotations

import collections
import logging
import random
import time
from collections.abc import Sequence

import attrs

from trioha._errors import StorageError
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
from trioha.broker._types import new_message
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
    int_field,
)
from trioha.store import (
    MAX_PROPERTIES_SIZE,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    HostAddress,
    NewMessage,
    PreparedMessage,
    string_to_properties,
)

log = logging.getLogger("trioha.broker")

#: ``MixAll.PROPERTY_CLUSTER`` and the region/trace fields a 4.9 broker adds to responses.
PROPERTY_CLUSTER = "CLUSTER"
DEFAULT_REGION = "DefaultRegion"
#: ``subscriptionGroupConfig.retryMaxTimes`` default when the request does not say.
MAX_RECONSUME_TIMES = 16
_PLAIN_SENDS = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2})
_SEND_NAMES: dict[int, str] = {code: RequestCode(code).name for code in _PLAIN_SENDS}


#: SendMessageRequestHeaderV2's one-letter fields and SendMessageRequestHeader's names for them.
_V2_NAMES = {
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
_V2_LETTERS = {name: letter for letter, name in _V2_NAMES.items()}
#: SendMessageRequestHeader's ``@CFNotNull`` fields, in their declaration order.
_REQUIRED_SEND_ORDER = (
    "producerGroup",
    "topic",
    "defaultTopic",
    "defaultTopicQueueNums",
    "queueId",
    "sysFlag",
    "bornTimestamp",
    "flag",
)
_REQUIRED_SEND_FIELDS = frozenset(_REQUIRED_SEND_ORDER)
_REQUIRED_V2_FIELDS = frozenset(_V2_LETTERS[name] for name in _REQUIRED_SEND_ORDER)


def _require_send_fields(fields: dict[str, str], letters: dict[str, str]) -> None:
    """Raise :class:`HeaderError` naming the first ``@CFNotNull`` field of a send's header that
    is missing (*letters*: the one-letter names of SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE).

    A 4.9.7 broker logs the missing field while decoding the header, goes on with null, and
    fails where it unboxes the null (a NullPointerException): SYSTEM_ERROR. trioha answers the
    same code and says which field it was, in the words of ``decodeCommandCustomHeader``;
    nothing is stored or auto-created (docs/rocketmq-protocol.md §19: unlike 4.9.7, trioha also
    refuses a header lacking only ``producerGroup``, which no client sends).
    """
    for name in _REQUIRED_SEND_ORDER:
        key = letters.get(name, name)
        if key not in fields:
            named = f"<{key}> ({name})" if key != name else f"<{name}>"
            raise HeaderError(f"the custom field {named} is null")


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
class _Checked:
    """A send that passed the checks: what its records are built from."""

    header: dict[str, str]
    target: str
    queue_id: int
    properties: dict[str, str]
    reconsume_times: int
    born_host: HostAddress | None
    #: A ``DELAY`` property, valid or not: the put path rewrites (or refuses) the message.
    has_delay: bool
    is_batch: bool


@attrs.frozen
class _Prepared:
    """A checked send on its way to the store: its records and the queue they go to."""

    records: list[NewMessage]
    queue_id: int
    is_batch: bool


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

    @staticmethod
    def _send_header(request: RemotingCommand) -> dict[str, str]:
        """SendMessageRequestHeaderV2's one-letter fields as SendMessageRequestHeader's names,
        every ``@CFNotNull`` field present (:func:`_require_send_fields`)."""
        fields = request.ext_fields
        if request.code == RequestCode.SEND_MESSAGE or ("b" not in fields and "topic" in fields):
            # SendMessageRequestHeader (a C++ client's send, or a batch with the long header)
            if not fields.keys() >= _REQUIRED_SEND_FIELDS:
                _require_send_fields(fields, {})
            return fields
        if not fields.keys() >= _REQUIRED_V2_FIELDS:
            _require_send_fields(fields, _V2_LETTERS)
        return {_V2_NAMES.get(k, k): v for k, v in fields.items()}

    def _check(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | _Checked:
        """Everything a send does before building its records: checks, topic, queue.

        A response when the send is refused before reaching the store, else what the
        records are built from.
        """
        header = self._send_header(request)
        topic = header["topic"]
        if self.ctx.is_slave:
            # The store would refuse anyway (SERVICE_NOT_AVAILABLE); refusing first keeps a
            # slave from auto-creating topics its master does not have.
            return request.response(
                ResponseCode.SERVICE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE_REMARK
            )
        config = self._check_topic(request, topic, header)
        if isinstance(config, RemotingCommand):
            return config
        queue_id = int_field(header, "queueId", -1)
        if queue_id >= max(config.read_queue_nums, config.write_queue_nums):
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, {config} Producer: {connection.peer}",
            )
        if queue_id < 0:
            queue_id = random.randrange(config.write_queue_nums)
        reconsume_times = int_field(header, "reconsumeTimes", 0)
        properties = dict(string_to_properties(header.get("properties") or ""))
        target = topic
        if topic.startswith(RETRY_TOPIC_PREFIX):
            max_times = int_field(header, "maxReconsumeTimes", MAX_RECONSUME_TIMES)
            if reconsume_times >= max_times:  # handleRetryAndDLQ: on to the dead-letter queue
                group = topic[len(RETRY_TOPIC_PREFIX) :]
                target = DLQ_TOPIC_PREFIX + group
                self.ctx.meta.topics.create_in_send_back(target, 1, PERM_WRITE)
                self.ctx.on_topics_changed()
                queue_id = 0
                properties[PROPERTY_DELAY_TIME_LEVEL] = "0"  # setDelayTimeLevel(0)
        if not is_delayed(properties):  # a delayed one is re-serialised with it, as in Java
            properties.pop(PROPERTY_WAIT_STORE_MSG_OK, None)  # not stored (RocketMQ #2883)
        properties[PROPERTY_CLUSTER] = self.ctx.config.broker_cluster_name
        # Java clients send batches as SEND_BATCH_MESSAGE; the C++ client sends SEND_MESSAGE
        # with batch=1, which a Java broker (Boolean.parseBoolean) would store as one
        # message holding the encoded batch. trioha reads it as the batch it is.
        batch_flag = header.get("batch") or ""
        if batch_flag != "false":  # what every plain send says
            batch_flag = batch_flag.strip().lower()
        return _Checked(
            header,
            target,
            queue_id,
            properties,
            reconsume_times,
            self._born_host(connection),
            PROPERTY_DELAY_TIME_LEVEL in properties,
            request.code == RequestCode.SEND_BATCH_MESSAGE or batch_flag in {"true", "1"},
        )

    def _prepare(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | _Prepared:
        """:meth:`_check`, then the records to put (one, or a batch's)."""
        checked = self._check(request, connection)
        if isinstance(checked, RemotingCommand):
            return checked
        if checked.is_batch:
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
                batch.append(self._new_message(checked, item.body, item.flag, props))
            return _Prepared(batch, checked.queue_id, is_batch=True)
        flag = int_field(checked.header, "flag", 0)
        record = self._new_message(checked, request.body, flag, checked.properties)
        return _Prepared([record], checked.queue_id, is_batch=False)

    @staticmethod
    def _new_message(
        checked: _Checked, body: bytes, flag: int, properties: dict[str, str]
    ) -> NewMessage:
        header = checked.header
        return new_message(
            topic=checked.target,
            queue_id=checked.queue_id,
            sysflag=int_field(header, "sysFlag", 0),
            born_timestamp=int_field(header, "bornTimestamp", 0) or None,
            born_host=checked.born_host,
            reconsume_times=checked.reconsume_times,
            body=body,
            flag=flag,
            properties=properties,
        )

    def _record(self, checked: _Checked, request: RemotingCommand) -> NewMessage | PreparedMessage:
        """A plain send's record, encoded here for the log (no :class:`NewMessage` between,
        the properties joined once); a delayed one, or one the log would refuse, as a
        :class:`NewMessage`, which the put path rewrites or refuses with its status."""
        header = checked.header
        flag = int_field(header, "flag", 0)
        if not checked.has_delay:
            try:
                return self.ctx.broker.store.commitlog.prepare(
                    topic=checked.target,
                    body=request.body,
                    queue_id=checked.queue_id,
                    flag=flag,
                    sysflag=int_field(header, "sysFlag", 0),
                    born_timestamp=int_field(header, "bornTimestamp", 0) or int(time.time() * 1000),
                    born_host=checked.born_host,
                    reconsume_times=checked.reconsume_times,
                    properties=checked.properties,
                )
            except (StorageError, ValueError):
                pass  # refused below, by the put path, with the status it gives
        return self._new_message(checked, request.body, flag, checked.properties)

    async def send_message(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``SendMessageProcessor.asyncSendMessage`` / ``asyncSendBatchMessage``."""
        prepared = self._prepare(request, connection)
        if isinstance(prepared, RemotingCommand):
            return prepared
        result = await self.ctx.broker.put_batch(prepared.records)
        return self._send_response(request, result, prepared.queue_id)

    def take_sends(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        """Take the plain sends of one read: appended now, together, answered by one wait.

        Each send is checked as :meth:`send_message` checks it and gets the same response;
        the valid ones are appended in one write (``Broker.append_each``) before this
        returns, so they are stored in the order they arrived, and one wait for the flush and
        replication policies up to the last one's end answers them all, as RocketMQ's group
        commit would. Batches and sends on a slave are left to :meth:`send_message`.
        """
        if self.ctx.is_slave:
            return None
        taken: list[RemotingCommand] = []
        answers: list[RemotingCommand | int] = []  # a response, or an index into records
        queues: list[int] = []
        records: list[NewMessage | PreparedMessage] = []
        for request in requests:
            if request.code not in _PLAIN_SENDS:
                continue
            try:
                checked = self._check(request, connection)
            except HeaderError as exc:
                checked = request.response(ResponseCode.SYSTEM_ERROR, str(exc))
            if isinstance(checked, _Checked):
                if checked.is_batch:
                    continue  # the C++ client's batch flag: send_message takes it
                try:
                    record = self._record(checked, request)
                except HeaderError as exc:
                    answers.append(request.response(ResponseCode.SYSTEM_ERROR, str(exc)))
                else:
                    answers.append(len(records))
                    queues.append(checked.queue_id)
                    records.append(record)
            else:
                answers.append(checked)
            taken.append(request)
        if not taken:
            return None
        started = time.perf_counter()
        broker = self.ctx.broker
        results = broker.append_each(records) if records else []
        stored = [r for r in results if r.offset >= 0]
        for refused in results:
            if refused.offset < 0:
                broker.count_puts(refused.status, 1, 0.0)

        async def finish() -> list[RemotingCommand | bytes | None]:
            status = PutStatus.PUT_OK
            if stored:
                status = await broker.wait_stored(stored[0].offset, stored[-1].end_offset)
                broker.count_puts(status, len(stored), time.perf_counter() - started)
            responses: list[RemotingCommand | bytes | None] = []
            codes: collections.Counter[tuple[int, int]] = collections.Counter()
            for request, answer in zip(taken, answers, strict=True):
                if isinstance(answer, RemotingCommand):
                    response: RemotingCommand | bytes = answer
                    code = answer.code
                else:
                    result = results[answer]
                    if result.offset >= 0 and status is not PutStatus.PUT_OK:
                        result = attrs.evolve(result, status=status)
                    if result.status.is_stored:
                        code = result.status.response_code
                        response = encode_response(
                            request, code, _stored_fields(result, queues[answer])
                        )
                    else:
                        response = self._send_response(request, result, queues[answer])
                        code = response.code
                codes[request.code, code] += 1
                responses.append(response)
            seconds = time.perf_counter() - started
            for (request_code, code), count in codes.items():
                name = _SEND_NAMES[request_code]
                self.ctx.served[f"{name}.{code}"] += count
                self.ctx.latency[name].observe(seconds, count)
            return responses

        return Burst(taken, finish)

    def _check_topic(
        self, request: RemotingCommand, topic: str, header: dict[str, str]
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
                header.get("defaultTopic") or AUTO_CREATE_TOPIC,
                int_field(
                    header, "defaultTopicQueueNums", self.ctx.config.default_topic_queue_nums
                ),
                int_field(header, "topicSysFlag", 0),
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

    def _send_response(
        self, request: RemotingCommand, result: PutResult, queue_id: int
    ) -> RemotingCommand:
        """``handlePutMessageResult``: PutStatus → response code, and the header fields."""
        status = result.status
        if status.is_stored:
            return request.response(status.response_code, None, _stored_fields(result, queue_id))
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
        return request.response(status.response_code, remarks.get(status, status.value))

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
