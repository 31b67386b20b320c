"""``AdminBrokerProcessor``: topics, queue offsets, tables and runtime info, queue locks.

The whole tables are what a slave's metadata sync asks for; the queue locks are
``RebalanceLockManager``'s, for orderly consumers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from trioha._config import BrokerConfig, config_properties
from trioha._errors import ConfigError
from trioha.broker._clients import ClientChannel
from trioha.broker._context import (
    BrokerContext,
    Handler,
    json_body,
    queue_min_offset,
    topic_error,
)
from trioha.broker._liveconfig import (
    DEFAULT_CONFIG_FILE,
    parse_settings,
    persist_settings,
    updated_config,
)
from trioha.broker._metadata import (
    SCHEDULE_TOPIC,
    SubscriptionGroupConfig,
    TopicConfig,
    reply_topic,
)
from trioha.broker._stats import disk_capacity_text, human_bytes, java_double
from trioha.remoting import (
    PERM_READ,
    PERM_WRITE,
    VERSION_4_9_7,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
    dumps,
    dumps_bytes,
)
from trioha.store import ConsumeQueue, used_ratio

log = logging.getLogger("trioha.broker")

#: ``MQVersion.CURRENT_VERSION`` of the RocketMQ release trioha answers as: 4.9.7.
BROKER_VERSION_DESC = "V4_9_7"
BROKER_VERSION = VERSION_4_9_7
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
        #: One UPDATE_BROKER_CONFIG at a time (RocketMQ's is ``synchronized``): each reads the
        #: configuration the last one left and rewrites the same file.
        self._config_update = trio.Lock()

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
            RequestCode.GET_BROKER_CONFIG: self.get_broker_config,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_and_create_group,
            RequestCode.GET_TOPIC_STATS_INFO: self.get_topic_stats_info,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.get_consumer_connection_list,
            RequestCode.GET_CONSUME_STATS: self.get_consume_stats,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: self.query_topic_consume_by_who,
            RequestCode.GET_BROKER_CONSUME_STATS: self.get_broker_consume_stats,
            RequestCode.GET_PRODUCER_CONNECTION_LIST: self.get_producer_connection_list,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_subscription_group,
            RequestCode.QUERY_CONSUME_QUEUE: self.query_consume_queue,
            RequestCode.CLEAN_UNUSED_TOPIC: self.clean_unused_topic,
            RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: self.clean_expired_consume_queue,
            RequestCode.DELETE_EXPIRED_COMMITLOG: self.delete_expired_commitlog,
            RequestCode.UPDATE_BROKER_CONFIG: self.update_broker_config,
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

    async def get_earliest_msg_storetime(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        queue, commitlog_min = self._queue(request)
        stamp = (
            self.ctx.store_timestamp(queue, queue_min_offset(queue, commitlog_min))
            if queue
            else None
        )
        return request.response(ResponseCode.SUCCESS, None, {"timestamp": stamp or -1})

    async def search_offset_by_timestamp(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getOffsetInQueueByTime``: the first message stored at or after ``timestamp``."""
        offset = self.ctx.offset_by_time(
            request.require("topic"), request.int_field("queueId"), request.int_field("timestamp")
        )
        return request.response(ResponseCode.SUCCESS, None, {"offset": offset})

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
        # The commit log may live elsewhere (storePathCommitLog); the memory log has no dir.
        commitlog_dir = str(getattr(commitlog, "directory", root / "commitlog"))
        commitlog_ratio = java_double(used_ratio(commitlog_dir))
        earliest = ctx.read_record_at(commitlog.min_offset)
        now = time.monotonic()
        table.update(
            {
                f"commitLogDiskRatio_{commitlog_dir}": commitlog_ratio,
                "commitLogDiskRatio": commitlog_ratio,
                "consumeQueueDiskRatio": java_double(used_ratio(root / "consumequeue")),
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

    # --- mqadmin's admin codes ---------------------------------------------------------------
    def _refuse_on_slave(self, request: RemotingCommand) -> RemotingCommand | None:
        """``validateSlave``: tables are changed on the master, slaves copy them."""
        if not self.ctx.is_slave:
            return None
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            "Can't modify topic or subscription group from slave broker, "
            "please execute it from master broker.",
        )

    async def get_broker_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getBrokerConfig``: ``key=value`` lines of the configuration, its version."""
        body = "".join(f"{k}={v}\n" for k, v in config_properties(self.ctx.config).items())
        return request.response(
            ResponseCode.SUCCESS,
            None,
            {"version": dumps(self.ctx.config_version.to_json())},
            body.encode(),
        )

    async def update_and_create_group(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``updateAndCreateSubscriptionGroup``: the body is a ``SubscriptionGroupConfig``."""
        refused = self._refuse_on_slave(request)
        if refused is not None:
            return refused
        body = json_body(request)
        name = str(body.get("groupName") or "")
        if not name.strip():
            return request.response(ResponseCode.SYSTEM_ERROR, "the group name is blank")
        try:
            config = SubscriptionGroupConfig.from_json(name, body)
        except (TypeError, ValueError) as exc:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"bad subscription group config: {exc}"
            )
        self.ctx.meta.groups.update(config)
        return request.response(ResponseCode.SUCCESS)

    def _offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) consume queue offsets of a queue, 0 for a queue with none."""
        queue = self.ctx.reput.queues.get(topic, queue_id)
        if queue is None:
            return 0, 0
        commitlog_min = self.ctx.broker.store.commitlog.min_offset
        return max(0, queue_min_offset(queue, commitlog_min)), max(0, queue.max_offset)

    def _message_time(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """``getMessageStoreTimeStamp``: the store time of one queue entry, 0 if unknown."""
        queue = self.ctx.reput.queues.get(topic, queue_id)
        if queue is None or queue_offset < 0:
            return 0
        return self.ctx.store_timestamp(queue, queue_offset) or 0

    def _mq(self, topic: str, queue_id: int) -> str:
        return message_queue_json(self.ctx.config.broker_name, topic, queue_id)

    async def get_topic_stats_info(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getTopicStatsInfo``: offsets and last store time of every write queue."""
        topic = request.require("topic")
        config = self.ctx.meta.topics.select(topic)
        if config is None:
            return request.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        entries = []
        for queue_id in range(config.write_queue_nums):
            low, high = self._offsets(topic, queue_id)
            stamp = self._message_time(topic, queue_id, high - 1) if high > 0 else 0
            entries.append(
                (
                    self._mq(topic, queue_id),
                    dumps({"lastUpdateTimestamp": stamp, "maxOffset": high, "minOffset": low}),
                )
            )
        body = '{"offsetTable":' + object_keyed(entries) + "}"
        return request.response(ResponseCode.SUCCESS, body=body.encode())

    async def get_consumer_connection_list(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getConsumerConnectionList``: who is online in a group, and what it subscribes."""
        group = request.require("consumerGroup")
        info = self.ctx.clients.consumers.get(group)
        if info is None or not info.channels:
            return request.response(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        body = {
            "connectionSet": [connection_json(channel) for channel in info.channels.values()],
            "consumeFromWhere": info.consume_from_where,
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "subscriptionTable": {t: s.to_json() for t, s in info.subscriptions.items()},
        }
        return request.response(ResponseCode.SUCCESS, body=dumps_bytes(body))

    async def get_producer_connection_list(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getProducerConnectionList``: the producers of a group connected here."""
        group = request.require("producerGroup")
        members = self.ctx.clients.producers.get(group)
        if members is None:
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist"
            )
        body = {"connectionSet": [connection_json(channel) for channel in members.values()]}
        return request.response(ResponseCode.SUCCESS, body=dumps_bytes(body))

    def _consume_stats(
        self, group: str, topic: str, queue_nums: int
    ) -> tuple[list[tuple[str, str]], int]:
        """``OffsetWrapper``s of a group's queues of a topic, and their total lag."""
        entries, diff = [], 0
        for queue_id in range(queue_nums):
            _, broker_offset = self._offsets(topic, queue_id)
            consumer_offset = max(0, self.ctx.meta.offsets.query(group, topic, queue_id))
            stamp = (
                self._message_time(topic, queue_id, consumer_offset - 1)
                if consumer_offset > 0
                else 0
            )
            diff += broker_offset - consumer_offset
            entries.append(
                (
                    self._mq(topic, queue_id),
                    dumps(
                        {
                            "brokerOffset": broker_offset,
                            "consumerOffset": consumer_offset,
                            "lastTimestamp": stamp,
                        }
                    ),
                )
            )
        return entries, diff

    def _consumed_topics(self, group: str, topics: Iterable[str]) -> list[TopicConfig]:
        """The topics a group's stats cover: known here, and subscribed while it is online."""
        online = self.ctx.clients.consumers.get(group)
        subscribed = online.subscriptions if online is not None else {}
        out = []
        for topic in sorted(topics):
            config = self.ctx.meta.topics.select(topic)
            if config is None:
                log.warning("consume stats of %s: topic %s not exist", group, topic)
                continue
            if subscribed and topic not in subscribed:
                continue  # online, but no longer subscribing to it
            out.append(config)
        return out

    async def get_consume_stats(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``getConsumeStats``: broker and consumer offsets of a group's read queues."""
        group = request.require("consumerGroup")
        topic = request.field("topic") or ""
        topics = [topic] if topic.strip() else self.ctx.meta.offsets.topics_of(group)
        entries: list[tuple[str, str]] = []
        tps = 0.0
        for config in self._consumed_topics(group, topics):
            found, _ = self._consume_stats(group, config.topic_name, config.read_queue_nums)
            entries.extend(found)
            tps += self.ctx.stats.group_tps(group, config.topic_name)
        body = '{"consumeTps":' + java_double(tps) + ',"offsetTable":' + object_keyed(entries) + "}"
        return request.response(ResponseCode.SUCCESS, body=body.encode())

    async def get_broker_consume_stats(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``fetchAllConsumeStatsInBroker``: every group's stats over write queues."""
        is_order = (request.field("isOrder") or "false").strip().lower() == "true"
        groups, total_diff = [], 0
        for group in sorted(self.ctx.meta.groups.table):
            stats = []
            for config in self._consumed_topics(group, self.ctx.meta.offsets.topics_of(group)):
                if is_order and not config.order:
                    continue
                entries, diff = self._consume_stats(
                    group, config.topic_name, config.write_queue_nums
                )
                total_diff += diff
                tps = self.ctx.stats.group_tps(group, config.topic_name)
                stats.append(
                    '{"consumeTps":'
                    + java_double(tps)
                    + ',"offsetTable":'
                    + object_keyed(entries)
                    + "}"
                )
            groups.append("{" + dumps(group) + ":[" + ",".join(stats) + "]}")
        body = (
            '{"brokerAddr":'
            + dumps(self.ctx.broker_addr)
            + ',"consumeStatsList":['
            + ",".join(groups)
            + '],"totalDiff":'
            + str(total_diff)
            + "}"
        )
        return request.response(ResponseCode.SUCCESS, body=body.encode())

    async def delete_topic(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``deleteTopic``: drop the topic's config and its consume queues."""
        refused = self._refuse_on_slave(request)
        if refused is not None:
            return refused
        topic = request.require("topic")
        error = topic_error(topic)
        if error is not None:
            return request.response(ResponseCode.SYSTEM_ERROR, error)
        if is_system_topic(topic, self.ctx.config):
            return request.response(
                ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is conflict with system topic."
            )
        self.ctx.meta.topics.delete(topic)
        removed = self.ctx.reput.queues.remove_topic(topic)
        log.info("topic %s deleted by %s (%d queues removed)", topic, connection.peer, removed)
        self.ctx.on_topics_changed()
        return request.response(ResponseCode.SUCCESS)

    async def delete_subscription_group(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``deleteSubscriptionGroup``: the group's config, and its offsets with
        ``removeOffset``. A member still online recreates the group at its next heartbeat
        (``autoCreateSubscriptionGroup``), as in RocketMQ."""
        refused = self._refuse_on_slave(request)
        if refused is not None:
            return refused
        group = request.require("groupName")
        log.info("deleteSubscriptionGroup called by %s", connection.peer)
        self.ctx.meta.groups.delete(group)
        if request.bool_field("removeOffset"):
            self.ctx.meta.offsets.remove_group(group)
        return request.response(ResponseCode.SUCCESS)

    async def query_consume_queue(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``queryConsumeQueue`` (``mqadmin queryCq``): ``count`` units of a consume queue
        from ``index`` (within one consume queue file), its bounds, and with
        ``consumerGroup`` that group's subscription of the topic."""
        topic, queue_id = request.require("topic"), request.int_field("queueId")
        queue = self.ctx.reput.queues.get(topic, queue_id)
        if queue is None:
            return request.response(ResponseCode.SYSTEM_ERROR, f"{queue_id}@{topic} is not exist!")
        low = queue_min_offset(queue, self.ctx.broker.store.commitlog.min_offset)
        fields: dict[str, Any] = {}
        group = request.field("consumerGroup")
        if group is not None:
            subscription = self.ctx.clients.find_subscription(group, topic)
            if subscription is None:
                fields["filterData"] = f"{group}@{topic} is not online!"
            else:
                # ConsumerFilterManager holds filters of SQL92 groups only: null for tags.
                fields["filterData"] = "null"
                fields["subscriptionData"] = subscription.to_json()
        index = request.int_field("index")
        units = queue.read(index, request.int_field("count", 10)) if index >= low else []
        if not units:
            return request.response(
                ResponseCode.SUCCESS, f"Index {index} of {queue_id}@{topic} is not exist!"
            )
        fields["maxQueueIndex"] = queue.max_offset
        fields["minQueueIndex"] = low
        fields["queueData"] = [
            {
                "eval": False,
                "physicOffset": unit.commitlog_offset,
                "physicSize": unit.size,
                "tagsCode": unit.tags_code,
            }
            for unit in units
        ]
        return request.response(
            ResponseCode.SUCCESS, body=dumps_bytes(dict(sorted(fields.items())))
        )

    async def clean_unused_topic(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``cleanUnusedTopic``: drop the consume queues of topics the topic table no longer
        has (``DefaultMessageStore.cleanUnusedTopic``), e.g. on a slave after its master
        deleted a topic; the commit log is untouched.

        A slave's table is its master's as of its last metadata sync (every 10 s), so a topic
        created on the master since then is not in it yet: on a slave, a topic whose last
        message is younger than :data:`SLAVE_CLEAN_MIN_AGE` is kept (RocketMQ would drop its
        consume queues, and with them the slave's way to those messages).
        """
        log.warning("invoke cleanUnusedTopic start.")
        known = self.ctx.meta.topics.table
        queues = self.ctx.reput.queues
        now = self.ctx.now()
        for topic in sorted({queue.topic for queue in queues}):
            if topic in known or topic in CLEAN_UNUSED_KEEPS:
                continue
            if self.ctx.is_slave:
                newest = max(
                    (
                        self.ctx.store_timestamp(queue, queue.max_offset - 1) or 0
                        for queue in queues
                        if queue.topic == topic
                    ),
                    default=0,
                )
                if now - newest < SLAVE_CLEAN_MIN_AGE:
                    log.warning(
                        "cleanUnusedTopic: %s kept: not in the topic table, but its last "
                        "message is %d ms old (this slave's table may not have it yet)",
                        topic,
                        now - newest,
                    )
                    continue
            removed = queues.remove_topic(topic)
            log.info("cleanUnusedTopic: %s, topic destroyed (%d queues)", topic, removed)
        log.warning("invoke cleanUnusedTopic end.")
        return request.response(ResponseCode.SUCCESS)

    async def clean_expired_consume_queue(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``cleanExpiredConsumeQueue`` (``mqadmin cleanExpiredCQ``): the broker's
        :meth:`~trioha.broker.Broker.clean_expired_consume_queues` hook."""
        return self._retention(
            request, "cleanExpiredConsumeQueue", self.ctx.broker.clean_expired_consume_queues
        )

    async def delete_expired_commitlog(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``deleteExpiredCommitLog`` (``mqadmin deleteExpiredCommitLog``): the broker's
        :meth:`~trioha.broker.Broker.delete_expired_commitlog` hook."""
        return self._retention(
            request, "deleteExpiredCommitLog", self.ctx.broker.delete_expired_commitlog
        )

    @staticmethod
    def _retention(
        request: RemotingCommand, name: str, hook: Callable[[], bool]
    ) -> RemotingCommand:
        """Call a retention hook, logged as RocketMQ logs it; SYSTEM_ERROR saying so while the
        broker's retention service is not running yet (the hook answers False)."""
        log.warning("invoke %s start.", name)
        done = hook()
        log.warning("invoke %s end.", name)
        if done:
            return request.response(ResponseCode.SUCCESS)
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"{name}: retention is not running on this broker yet (it starts with the broker "
            "port); try again",
        )

    async def update_broker_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``updateBrokerConfig``: the keys in the body, applied at once and written to the
        broker's config file, or, if any of them cannot be, none (see :mod:`._liveconfig`)."""
        log.info("updateBrokerConfig called by %s", connection.peer)
        if not request.body:
            return request.response(ResponseCode.SUCCESS)
        async with self._config_update:
            return await self._update_broker_config(request, connection)

    async def _update_broker_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        try:
            settings = parse_settings(request.body)
            config = updated_config(self.ctx.config, settings)
        except ConfigError as exc:
            log.warning("updateBrokerConfig from %s refused: %s", connection.peer, exc)
            return request.response(ResponseCode.SYSTEM_ERROR, str(exc))
        log.info("updateBrokerConfig, new config: %s client: %s", settings, connection.peer)
        self.ctx.broker.update_config(config)
        self.ctx.meta.topics.broker = config
        self.ctx.config_version = self.ctx.config_version.next()
        path = self.ctx.broker.config_file or self.ctx.broker.store.root / DEFAULT_CONFIG_FILE
        try:
            await trio.to_thread.run_sync(persist_settings, path, settings)
        except OSError as exc:
            log.error("updateBrokerConfig: %s not written to %s: %s", settings, path, exc)
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"{', '.join(f'{k}={v}' for k, v in settings.items())} in effect, but not "
                f"written to {path} ({exc.strerror or exc}): lost at the next restart",
            )
        return request.response(ResponseCode.SUCCESS)

    async def query_topic_consume_by_who(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``queryTopicConsumeByWho``: online subscribers and groups with stored offsets."""
        topic = request.require("topic")
        groups = {
            name for name, info in self.ctx.clients.consumers.items() if topic in info.subscriptions
        }
        groups |= self.ctx.meta.offsets.groups_of(topic)
        body = dumps_bytes({"groupList": sorted(groups)})
        return request.response(ResponseCode.SUCCESS, body=body)


#: ``TopicValidator``'s system topics (besides the cluster and broker names).
SYSTEM_TOPICS = frozenset(
    {
        "SELF_TEST_TOPIC",
        "TBW102",
        "BenchmarkTest",
        "OFFSET_MOVED_EVENT",
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRACE_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
    }
)


def is_system_topic(topic: str, config: BrokerConfig) -> bool:
    """``TopicValidator.isSystemTopic``, with the topics RocketMQ adds at start: the cluster
    and broker names and the cluster's reply topic."""
    return (
        topic in SYSTEM_TOPICS
        or topic.startswith("rmq_sys_")
        or topic
        in (config.broker_cluster_name, config.broker_name, reply_topic(config.broker_cluster_name))
    )


#: ``cleanUnusedTopic`` keeps these topics' consume queues even when the topic table has
#: no entry for them.
CLEAN_UNUSED_KEEPS = frozenset({SCHEDULE_TOPIC, "RMQ_SYS_TRANS_OP_HALF_TOPIC"})
#: On a slave, ``cleanUnusedTopic`` keeps a topic whose last message is younger (ms): six
#: metadata syncs, so the master's topic table has reached the slave.
SLAVE_CLEAN_MIN_AGE = 60_000


def connection_json(channel: ClientChannel) -> dict[str, Any]:
    """A ``Connection`` (of ``ConsumerConnection``/``ProducerConnection``) as fastjson writes
    it: the client's address as ``RemotingHelper.parseChannelRemoteAddr`` gives it."""
    return {
        "clientAddr": str(getattr(channel.connection, "peer", channel.connection)),
        "clientId": channel.client_id,
        "language": channel.language,
        "version": channel.version,
    }


def message_queue_json(broker_name: str, topic: str, queue_id: int) -> str:
    """A ``MessageQueue`` as fastjson writes it (also as a map key, unquoted)."""
    return dumps({"brokerName": broker_name, "queueId": queue_id, "topic": topic})


def object_keyed(entries: Iterable[tuple[str, str]]) -> str:
    """A map whose keys are objects, as fastjson writes it: ``{{"k":1}:{...}}``.

    Not standard JSON, but what mqadmin and the Java client parse (``TopicStatsTable``,
    ``ConsumeStats``); both parts are already encoded.
    """
    return "{" + ",".join(f"{key}:{value}" for key, value in entries) + "}"


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
