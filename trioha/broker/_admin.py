"""``AdminBrokerProcessor``: topics, queue offsets, tables and runtime info, queue locks.

The whole tables are what a slave's metadata sync asks for; the queue locks are
``RebalanceLockManager``'s, for orderly consumers.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs

from trioha._errors import StorageError
from trioha.broker._context import (
    BrokerContext,
    Handler,
    json_body,
    queue_min_offset,
    topic_error,
)
from trioha.broker._metadata import TopicConfig
from trioha.broker._stats import disk_capacity_text, disk_used_ratio, human_bytes, java_double
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._codes import (
    PERM_READ,
    PERM_WRITE,
    RequestCode,
    ResponseCode,
)
from trioha.remoting._connection import RemotingConnection
from trioha.remoting._json import dumps_bytes
from trioha.store._consumequeue import ConsumeQueue
from trioha.store._message import (
    DecodedMessage,
    decode_record,
)

log = logging.getLogger("trioha.broker")

#: ``MQVersion.CURRENT_VERSION`` of the RocketMQ release trioha answers as: 4.9.7.
BROKER_VERSION_DESC = "V4_9_7"
BROKER_VERSION = 407
#: pool -> (queue size key, capacity key, head wait key, ``BrokerConfig`` capacity default).
_POOL_KEYS = {
    "send": (
        "sendThreadPoolQueueSize",
        "sendThreadPoolQueueCapacity",
        "sendThreadPoolQueueHeadWaitTimeMills",
        10000,
    ),
    "pull": (
        "pullThreadPoolQueueSize",
        "pullThreadPoolQueueCapacity",
        "pullThreadPoolQueueHeadWaitTimeMills",
        100000,
    ),
    "query": (
        "queryThreadPoolQueueSize",
        "queryThreadPoolQueueCapacity",
        "queryThreadPoolQueueHeadWaitTimeMills",
        20000,
    ),
    "transaction": ("EndTransactionQueueSize", "EndTransactionThreadPoolQueueCapacity", "", 100000),
}


class AdminBrokerProcessor:
    """Mirrors RocketMQ's ``AdminBrokerProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        #: (group, topic, queue id) -> (client id, locked at ms): ``RebalanceLockManager``.
        self._locks: dict[tuple[str, str, int], tuple[str, int]] = {}

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self.get_all_delay_offset,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.get_all_subscription_group,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
        }

    def _queue(self, request: RemotingCommand) -> tuple[ConsumeQueue | None, int]:
        queue = self.ctx.reput.queues.get(request.require("topic"), request.int_field("queueId"))
        commitlog_min = self.ctx.broker.store.commitlog.min_offset
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
            data = self.ctx.broker.store.commitlog.read(unit.commitlog_offset, unit.size)
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

    async def update_and_create_topic(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``updateAndCreateTopic``."""
        topic = request.require("topic")
        error = topic_error(topic)
        if error is not None:
            return request.response(ResponseCode.SYSTEM_ERROR, error)
        if topic == self.ctx.config.broker_cluster_name:
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
        self.ctx.meta.topics.update(config)
        self.ctx.on_topics_changed()
        return request.response(ResponseCode.SUCCESS)

    async def get_all_topic_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.ctx.meta.topics.encode().encode())

    async def get_all_consumer_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.ctx.meta.offsets.encode().encode())

    async def get_all_delay_offset(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.ctx.meta.delay.encode().encode())

    async def get_all_subscription_group(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        return request.response(ResponseCode.SUCCESS, body=self.ctx.meta.groups.encode().encode())

    async def get_broker_runtime_info(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getBrokerRuntimeInfo``: a KVTable with every key RocketMQ 4.9.7 reports, then
        trioha's own figures (role, addresses, data versions, the broker's ``statistics()``
        under ``stats.``, requests answered under ``served.``)."""
        return request.response(
            ResponseCode.SUCCESS, body=dumps_bytes({"table": self.runtime_info()})
        )

    def runtime_info(self) -> dict[str, str]:
        ctx = self.ctx
        commitlog = ctx.broker.store.commitlog
        root = ctx.broker.store.root
        table = ctx.stats.runtime_info(
            put_size_total=max(0, commitlog.max_offset - ctx.boot_max_offset)
        )
        commitlog_dir = str(root / "commitlog")
        commitlog_ratio = java_double(disk_used_ratio(commitlog_dir))
        earliest = ctx.read_record_at(commitlog.min_offset)
        now = time.monotonic()
        table.update(
            {
                f"commitLogDiskRatio_{commitlog_dir}": commitlog_ratio,
                "commitLogDiskRatio": commitlog_ratio,
                "consumeQueueDiskRatio": java_double(disk_used_ratio(str(root / "consumequeue"))),
                "commitLogMinOffset": str(commitlog.min_offset),
                "commitLogMaxOffset": str(commitlog.max_offset),
                "brokerVersionDesc": BROKER_VERSION_DESC,
                "brokerVersion": str(BROKER_VERSION),
                "dispatchBehindBytes": str(ctx.reput.behind),
                # Appends run on the event loop between awaits: no put lock is ever held
                # while a request waits, so this is always 0.
                "pageCacheLockTimeMills": "0",
                "earliestMessageTimeStamp": str(
                    earliest.store_timestamp if earliest is not None else -1
                ),
                "startAcceptSendRequestTimeStamp": "0",
                "remainTransientStoreBufferNumbs": str(2**31 - 1),
                "remainHowManyDataToFlush": human_bytes(
                    max(0, commitlog.max_offset - commitlog.flushed_offset)
                ),
                "commitLogDirCapacity": disk_capacity_text(str(root)),
            }
        )
        for pool, (size_key, capacity_key, wait_key, capacity) in _POOL_KEYS.items():
            in_flight = ctx.in_flight[pool]
            table[size_key] = str(len(in_flight))
            table[capacity_key] = str(capacity)
            if wait_key:
                oldest = min(in_flight.values(), default=now)
                table[wait_key] = str(int((now - oldest) * 1000))
        for level, (offset, max_offset) in ctx.schedule_offsets().items():
            table[f"scheduleMessageOffset_{level}"] = f"{offset},{max_offset}"
        table.update(
            {
                "brokerRole": ctx.config.broker_role.value,
                "brokerName": ctx.config.broker_name,
                "brokerId": str(ctx.config.broker_id),
                "brokerAddr": ctx.broker_addr,
                "topicConfigDataVersion": dumps_bytes(
                    ctx.meta.topics.data_version.to_json()
                ).decode(),
                "subscriptionGroupDataVersion": dumps_bytes(
                    ctx.meta.groups.data_version.to_json()
                ).decode(),
            }
        )
        table.update(ctx.extra_info())
        table.update(_flatten("stats", ctx.broker.statistics()))
        table.update({f"served.{key}": str(n) for key, n in sorted(ctx.served.items())})
        return table

    async def lock_batch_mq(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``lockBatchMQ``: a queue is locked to one client for 60 s at a time."""
        body = json_body(request)
        group, client_id = str(body.get("consumerGroup", "")), str(body.get("clientId", ""))
        now = self.ctx.now()
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
        body = json_body(request)
        group, client_id = str(body.get("consumerGroup", "")), str(body.get("clientId", ""))
        for mq in body.get("mqSet") or []:
            key = (group, str(mq.get("topic")), int(mq.get("queueId", 0)))
            if self._locks.get(key, ("", 0))[0] == client_id:
                del self._locks[key]
        return request.response(ResponseCode.SUCCESS)


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
    if value is None:
        return {}  # absent (a master has no HA client): no key rather than a "None"
    if isinstance(value, bool):
        return {prefix: "true" if value else "false"}
    if isinstance(value, float):
        return {prefix: java_double(value)}
    if hasattr(value, "value") and not isinstance(value, int | str):
        return _flatten(prefix, value.value)
    return {prefix: str(value)}
