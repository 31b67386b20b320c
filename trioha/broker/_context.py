"""What every request processor of the broker port shares: the broker and its tables.

RocketMQ's processors each hold the ``BrokerController`` and reach everything through it; here
each holds a :class:`BrokerContext`, which carries exactly what they use, plus the helpers more
than one processor needs.
"""

from __future__ import annotations

import collections
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from trioha._config import BrokerConfig, BrokerRole
from trioha._errors import StorageError
from trioha._histogram import LatencyHistogram
from trioha.broker._clients import ClientManager
from trioha.broker._delaylevels import SCHEDULE_TOPIC
from trioha.broker._metadata import Metadata
from trioha.broker._reput import ReputService
from trioha.broker._stats import BrokerStats
from trioha.broker._types import BrokerLike
from trioha.remoting import (
    DataVersion,
    HeaderError,
    RemotingCommand,
    RemotingConnection,
    loads_lenient,
)
from trioha.store import (
    RECORD_HEAD_SIZE,
    ConsumeQueue,
    DecodedMessage,
    decode_record,
    is_record_at,
)

Handler = Callable[[RemotingCommand, RemotingConnection], Awaitable[RemotingCommand | None]]

SERVICE_NOT_AVAILABLE_REMARK = (
    "service not available now. It may be caused by one of the following reasons: "
    "the broker's disk is full, messages are put to the slave, message store has been "
    "shut down, etc."
)


def disk_full_remark(ratios: str) -> str:
    """``SendMessageProcessor``'s remark with the used fractions (``diskUtil()``)."""
    return SERVICE_NOT_AVAILABLE_REMARK.replace("is full,", f"is full [{ratios}],")


class BrokerContext:
    """The broker state the processors share (``BrokerController``'s part they use)."""

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
        self.meta = meta
        self.reput = reput
        self.broker_addr = broker_addr
        self.clients = clients or ClientManager()
        self.nursery = nursery
        self.on_topics_changed = on_topics_changed
        self.extra_info = extra_info
        self.now = clock
        #: Requests answered, by ``"<code name>.<response code>"`` (reported by ``status``).
        self.served: collections.Counter[str] = collections.Counter()
        #: Time to answer, by request code name (``/metrics``).
        self.latency: collections.defaultdict[str, LatencyHistogram] = collections.defaultdict(
            LatencyHistogram
        )
        #: ``StoreStatsService``'s figures; puts are the broker's own count of stored messages.
        self.stats = BrokerStats(puts_total=lambda: int(getattr(broker.statistics(), "puts", 0)))
        #: ``Configuration``'s data version (GET_BROKER_CONFIG's ``version`` header).
        self.config_version = DataVersion.new()
        #: The commit log's end when the broker started (``putMessageSizeTotal`` counts from it).
        self.boot_max_offset = broker.store.commitlog.max_offset
        #: Requests being processed, by thread-pool name ("send", "pull", "query",
        #: "transaction"): the task answering it -> since when (``time.monotonic``), for the
        #: ``*ThreadPoolQueue*`` keys. A held long poll is not in it (see :meth:`held`).
        self.in_flight: dict[str, dict[trio.lowlevel.Task, float]] = {
            "send": {},
            "pull": {},
            "query": {},
            "transaction": {},
        }

    @property
    def config(self) -> BrokerConfig:
        """The broker's configuration as it is now (UPDATE_BROKER_CONFIG changes some keys)."""
        return self.broker.config

    @contextlib.contextmanager
    def held(self, pool: str) -> Iterator[None]:
        """The current request waits for something other than a worker (a long poll held
        for a message): out of *pool*'s in-flight figures meanwhile, and back in from the
        moment it resumes.

        RocketMQ's ``pullThreadPoolQueueSize`` counts pulls waiting for a pull thread; a held
        pull sits in ``PullRequestHoldService`` instead, and a woken one is queued afresh.
        Counting held pulls made an idle broker with one push consumer look overloaded
        (``#OutTPS(LOAD)`` in ``clusterList``).
        """
        task = trio.lowlevel.current_task()
        in_flight = self.in_flight[pool]
        counted = in_flight.pop(task, None) is not None
        try:
            yield
        finally:
            if counted:
                in_flight[task] = time.monotonic()

    @property
    def is_slave(self) -> bool:
        return self.config.broker_role is BrokerRole.SLAVE

    def service_not_available_remark(self) -> str:
        """The SERVICE_NOT_AVAILABLE remark, with RocketMQ's disk bracket when the broker has
        a disk guard (``CL:  0.93 CQ:  0.93 INDEX:  0.93``)."""
        disk = getattr(self.broker, "disk", None)
        if disk is None:
            return SERVICE_NOT_AVAILABLE_REMARK
        return disk_full_remark(disk.ratio_remark())

    def schedule_offsets(self) -> dict[int, tuple[int, int]]:
        """Delay level -> (delivered offset, max offset of its queue): the runtime info's
        ``scheduleMessageOffset_<level>`` (``ScheduleMessageService.buildRunningStats``)."""
        out = {}
        for level, offset in sorted(self.meta.delay.table.items()):
            queue = self.reput.queues.get(SCHEDULE_TOPIC, level - 1)
            out[level] = (offset, queue.max_offset if queue is not None else 0)
        return out

    def store_timestamp(self, queue: ConsumeQueue, queue_offset: int) -> int | None:
        """The store time of one queue entry, None when it cannot be read
        (``getMessageStoreTimeStamp``)."""
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

    def offset_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """``getOffsetInQueueByTime``: the first queue offset stored at or after *timestamp*
        (the queue's end when none is; 0 for a queue that does not exist)."""
        queue = self.reput.queues.get(topic, queue_id)
        if queue is None:
            return 0
        lo, hi = queue_min_offset(queue, self.broker.store.commitlog.min_offset), queue.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            stamp = self.store_timestamp(queue, mid)
            if stamp is not None and stamp < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def raw_record_at(self, offset: int) -> bytes | None:
        """The stored bytes of the message record at ``offset`` (TOTALSIZE read from there),
        or None when they cannot be read whole (``DefaultMessageStore.selectOneMessageByOffset``)
        or are no message stored at that offset (an index entry of a message the log lost,
        a blank marker, padding: :func:`~trioha.store.is_record_at`)."""
        commitlog = self.broker.store.commitlog
        try:
            head = commitlog.read(offset, RECORD_HEAD_SIZE)
            if not is_record_at(head, offset):
                return None
            size = int.from_bytes(head[:4], "big", signed=True)
            data = commitlog.read(offset, size)
        except StorageError:
            return None
        return bytes(data) if len(data) == size else None

    def read_record_at(self, offset: int) -> Any:
        """The decoded message at ``offset``, or None (``lookMessageByOffset``)."""
        data = self.raw_record_at(offset)
        if data is None:
            return None
        decoded = decode_record(data, 0, check_crc=False, base_offset=offset)
        return decoded.message if isinstance(decoded, DecodedMessage) else None


def queue_min_offset(queue: ConsumeQueue, commitlog_min: int) -> int:
    """First queue offset whose message is still in the commit log (``getMinOffsetInQueue``)."""
    return queue.first_offset_held(commitlog_min)


def json_body(request: RemotingCommand) -> dict[str, Any]:
    try:
        value = loads_lenient(request.body) if request.body else {}
    except ValueError as exc:
        raise HeaderError(f"request body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HeaderError("request body is not a JSON object")
    return value


_TOPIC_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")


def topic_error(topic: str) -> str | None:
    """``TopicValidator.validateTopic``: the remark for an invalid name, None if valid."""
    if not topic.strip():
        return "The specified topic is blank."
    if len(topic) > 127:
        return "The specified topic is longer than topic max length."
    if _TOPIC_CHARS.fullmatch(topic) is None:
        return (
            f"The specified topic[{topic}] contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    return None


def peer_address(connection: RemotingConnection) -> tuple[str, int] | None:
    host, _, port = connection.peer.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)
