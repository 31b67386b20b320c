"""``PullMessageProcessor``: pulls, long polling and ``DefaultMessageStore.getMessage``.

A pull that finds nothing waits as ``PullRequestHoldService`` would make it wait.

A unit whose message the commit log does not hold is never served: RocketMQ skips a unit
whose bytes it cannot select (``getMessage`` answers MESSAGE_WAS_REMOVING when nothing else
was found, and the consumer moves past it); here the record at the unit's offset must also
name that offset, queue and queue offset and have the unit's size
(:func:`~trioha.store.is_record_at`), so a unit left pointing at bytes the log lost, or at
END_OF_FILE padding, is skipped the same way, with one ERROR per queue. Recovery removes
such units (``_reput``); this is the last line of defence, not the repair.
"""

from __future__ import annotations

import logging
import time

import attrs
import trio

from trioha._errors import StorageError
from trioha.broker._clients import SubscriptionData
from trioha.broker._context import (
    BrokerContext,
    Handler,
    queue_min_offset,
)
from trioha.broker._metadata import RETRY_TOPIC_PREFIX, TopicConfig
from trioha.remoting import (
    MASTER_ID,
    PERM_READ,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    ResponseCode,
)
from trioha.store import CQUnit, is_record_at

log = logging.getLogger("trioha.broker")

#: ``maxTransferBytesOnMessageInMemory`` / ``maxTransferCountOnMessageInMemory``.
MAX_TRANSFER_BYTES = 256 * 1024
MAX_TRANSFER_COUNT = 32
#: ``DefaultMessageStore.getMessage``: units scanned per pull when filtering (16000 B / 20).
MAX_FILTER_UNITS = 800
#: Queues whose unit without a message has been logged (at most this many are remembered).
_REPORTED_MAX = 1024


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


class PullMessageProcessor:
    """Mirrors RocketMQ's ``PullMessageProcessor``, over a shared :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        #: Queues whose unit without a message was logged (once each).
        self._reported: set[tuple[str, int]] = set()

    def handlers(self) -> dict[int, Handler]:
        return {
            RequestCode.PULL_MESSAGE: self.pull_message,
        }

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
        with self.ctx.held("pull"), trio.move_on_after(timeout):
            await self.ctx.reput.wait_arrival(topic, queue_id, request.int_field("queueOffset"))
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
        group = self.ctx.meta.groups.find(group_name)
        if group is None:
            return request.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group_name}] does not exist",
            )
        if not group.consume_enable:
            return request.response(
                ResponseCode.NO_PERMISSION, f"subscription group no permission, {group_name}"
            )
        config = self.ctx.meta.topics.select(topic)
        if config is None and self.ctx.is_slave:
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
            found = self.ctx.clients.find_subscription(group_name, topic)
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
        started = time.monotonic()
        result = self.get_message(
            topic, queue_id, offset, request.int_field("maxMsgNums", 32), subscription
        )
        self.ctx.stats.record_get(
            (time.monotonic() - started) * 1000,
            found=result.status is GetStatus.FOUND,
            messages=len(result.records),
            group_topic=(request.field("consumerGroup") or "", topic),
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
        if code == ResponseCode.PULL_OFFSET_MOVED and self.ctx.is_slave:
            # A slave does not correct offsets (offsetCheckInSlave=false): it may just be
            # behind its master. The consumer retries, at the offset it asked for.
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
            next_offset = offset
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
            return None
        if (
            allow_suspend
            and sys_flag & PULL_FLAG_COMMIT_OFFSET
            and not self.ctx.is_slave
            and request.field("commitOffset") is not None
        ):
            commit = request.int_field("commitOffset")
            if commit >= 0:
                self.ctx.meta.offsets.commit(group_name, topic, queue_id, commit)
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
        queue_ids = self.ctx.reput.queues.queue_ids(topic)
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
        commitlog = self.ctx.broker.store.commitlog
        queue = self.ctx.reput.queues.get(topic, queue_id)
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
                if not is_record_at(
                    data,
                    unit.commitlog_offset,
                    size=unit.size,
                    queue_id=queue_id,
                    queue_offset=offset + scanned - 1,
                ):
                    self._report_unheld(topic, queue_id, offset + scanned - 1, unit)
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

    def _report_unheld(self, topic: str, queue_id: int, queue_offset: int, unit: CQUnit) -> None:
        """One ERROR per queue for units whose message the commit log does not hold."""
        key = (topic, queue_id)
        if key in self._reported or len(self._reported) >= _REPORTED_MAX:
            return
        self._reported.add(key)
        log.error(
            "consume queue %s/%d: unit %d points at commit log offset %d (%d bytes), which "
            "holds no such message; skipped (as are any others of this queue, logged once)",
            topic,
            queue_id,
            queue_offset,
            unit.commitlog_offset,
            unit.size,
        )
