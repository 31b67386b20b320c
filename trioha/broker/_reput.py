"""The consume queue builder: follows the commit log and indexes each message.

Mirrors ``DefaultMessageStore.ReputMessageService`` with
``CommitLogDispatcherBuildConsumeQueue`` and the long-polling wake-up
(``NotifyMessageArrivingListener``). It runs on a master and on a slave alike:

* it reads records from ``reput_from`` up to the commit log's end and writes one unit per
  message into the message's queue (queue offset, physical offset and size, tag hash);
* a blank record moves it to the next segment;
* a record that is not complete yet (a slave that has received half of it, docs/rocketmq-protocol.md
  §1.7) stops it until the log grows; it is never skipped, whatever the broker id;
* an invalid record stops it with an error log: the commit log's recovery is what removes
  bad bytes, skipping them here would hide the problem;
* consumers long-polling a queue are woken when units are added to it;
* with the message index enabled, each message's unique key and keys are indexed
  (``CommitLogDispatcherBuildIndex``), also on a slave, which indexes what it replicates.

On start, units pointing past the commit log's end are truncated (``truncateDirtyLogicFiles``)
and building resumes from a checkpoint written after each flush of the queues, so a crash that
loses unflushed queue pages only costs a re-dispatch (units already present are skipped).

Queues and index are flushed on their own schedule, so after a power cut they may hold units
and entries of messages the commit log lost; in classic mode the log is then closed with
END_OF_FILE records past the lost range, which puts those units *below* the log's end. So
recovery also checks the newest units of every queue and the newest index entries against
the log (every record names its own physical offset, queue and queue offset) and removes
those whose message is not there, newest first: building then resumes at the recovered end,
steps over the padding and indexes new messages at the queue offsets the log gives them. A
replica cut back (:func:`truncate_replica`) takes its queues and index with it.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

import trio

from trioha._errors import StorageError
from trioha.broker._delaylevels import SCHEDULE_TOPIC, deliver_timestamp
from trioha.broker._metadata import write_config_file
from trioha.broker._types import CommitLogLike
from trioha.remoting import dumps, loads_lenient
from trioha.store import (
    CONSUME_QUEUE,
    CONSUME_QUEUE_CHECKPOINT,
    MESSAGE_INDEX,
    MESSAGE_MAGIC,
    MIN_RECORD_SIZE,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RECORD_HEAD_SIZE,
    CommitLog,
    ConsumeQueue,
    ConsumeQueueStore,
    CQUnit,
    DecodedBlank,
    DecodedIncomplete,
    DecodedInvalid,
    DiskGuard,
    IndexService,
    RecordLayout,
    SetAside,
    is_record_at,
    parse_record,
    tags_code,
)

log = logging.getLogger("trioha.broker.reput")

#: ``MessageSysFlag`` transaction bits: only plain and committed messages are indexed.
_TRANSACTION_MASK = 0xC
_TRANSACTION_NOT_TYPE = 0x0
_TRANSACTION_COMMIT = 0x8
_TRANSACTION_ROLLBACK = 0xC

_TAGS_KEY = PROPERTY_TAGS.encode() + b"\x01"
_KEYS_KEY = PROPERTY_KEYS.encode() + b"\x01"
_UNIQ_KEY = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX.encode() + b"\x01"
_DELAY_KEY = PROPERTY_DELAY_TIME_LEVEL.encode() + b"\x01"


def _property(data: bytes, key: bytes, start: int, end: int) -> bytes | None:
    """The raw value of ``key`` (with its \\x01) in the properties at ``data[start:end]``,
    found in place without decoding the others."""
    at = data.find(key, start, end)
    while at > start and data[at - 1] != 2:  # a key starts the string or follows \x02
        at = data.find(key, at + 1, end)
    if at < 0:
        return None
    value = at + len(key)
    stop = data.find(b"\x02", value, end)
    return data[value : stop if stop >= 0 else end]


#: What the index needs of one record: topic, offset, store time, raw UNIQ_KEY and KEYS.
_Indexed = tuple[str, int, int, bytes | None, bytes | None]


def _index_keys(data: bytes, start: int, end: int) -> tuple[bytes | None, bytes | None]:
    """What ``buildIndex`` reads of a record's properties (``data[start:end]``): its unique
    key and its keys, as stored."""
    return _property(data, _UNIQ_KEY, start, end), _property(data, _KEYS_KEY, start, end)


#: Tag hash codes by raw tag bytes: a topic has few tags, and hashing one costs a Python loop
#: over its characters. Bounded, so a producer inventing tags cannot grow it.
_TAG_CODES: dict[bytes | None, int] = {None: 0}
_TAG_CODES_MAX = 4096


def _tags_code(data: bytes, start: int, end: int) -> int:
    """``tagsString2tagsCode`` of the TAGS property at ``data[start:end]`` (0 without one)."""
    raw = _property(data, _TAGS_KEY, start, end)
    code = _TAG_CODES.get(raw)
    if code is None:
        assert raw is not None
        code = tags_code(raw.decode("utf-8", "replace"))
        if len(_TAG_CODES) < _TAG_CODES_MAX:
            _TAG_CODES[raw] = code
    return code


#: The fields a unit needs of the common record (V1 magic, IPv4 born and store hosts), in one
#: unpack: TOTALSIZE, MAGICCODE, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG,
#: STORETIMESTAMP, BODY length (docs/rocketmq-protocol.md §4.1); the rest is skipped.
_FAST_HEAD = struct.Struct(">iI4xi4xqqi16xq20xi")
_fast_head = _FAST_HEAD.unpack_from
_FAST_HEAD_SIZE = _FAST_HEAD.size
_props_len = struct.Struct(">h").unpack_from
#: ``MessageSysFlag.BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG``: other header lengths.
_IPV6_HOSTS = 0x30


#: Bytes read per step, and records dispatched before yielding to other tasks.
READ_CHUNK = 1 << 20
BATCH_RECORDS = 2048
#: ``flushIntervalConsumeQueue``: 1 s.
FLUSH_INTERVAL = 1.0
CHECKPOINT_FILE = "consumeQueueCheckpoint.json"


class ReputService:
    """Builds ``queues`` from ``commitlog``; see the module docstring."""

    def __init__(
        self,
        commitlog: CommitLogLike,
        queues: ConsumeQueueStore,
        *,
        checkpoint: Path,
        disk: DiskGuard | None = None,
        retry_interval: float = FLUSH_INTERVAL,
        index: IndexService | None = None,
        delay_levels: list[int] | None = None,
    ) -> None:
        self.commitlog = commitlog
        self.queues = queues
        self.checkpoint = checkpoint
        #: Where write failures go (puts stop while the queues cannot be written).
        self.disk = disk if disk is not None else DiskGuard({})
        self.retry_interval = retry_interval
        #: The message index, None when ``message_index_enable`` is off.
        self.index = index
        #: The delay of each level (ms): scheduled messages' units carry their due time.
        self.delay_levels = delay_levels or []
        self.reput_from = 0
        self._arrivals: dict[tuple[str, int], trio.Event] = {}
        self._any_arrival = trio.Event()
        self._stuck_at: int | None = None
        #: Held while the index is flushed in a worker thread, so its files are not deleted
        #: under it (:meth:`delete_expired_index`).
        self._index_lock = trio.Lock()

    # --- start --------------------------------------------------------------------------
    def recover(self) -> None:
        """Load the queues, cut what the commit log no longer holds, pick the start."""
        commitlog = self.commitlog
        self.queues.load()
        self.queues.truncate_dirty(commitlog.max_offset)
        self._cut_lost_units()
        start = max(self.queues.max_physical_offset(), commitlog.min_offset)
        saved = self._read_checkpoint()
        if saved is not None:
            start = min(start, saved)
        if self.index is not None:
            self.index.load(flushed_up_to=saved)
            removed = self.index.cut_tail(lambda phy: not self._holds(phy))
            if removed:
                log.warning(
                    "message index: its last %d entries point at commit log bytes that hold "
                    "no message (a tail lost in a crash); removed",
                    removed,
                )
            # The index is derived data too: build what it lacks (all of it, the first time).
            start = min(start, self.index.end_phy_offset)
        self.reput_from = min(max(start, commitlog.min_offset), commitlog.max_offset)
        # recoverTopicQueueTable: a queue whose messages retention deleted goes on from its
        # consume queue's end, never from 0 again.
        commitlog.floor_queue_offsets(self.queues.ends())
        for queue in self.queues:
            queue.correct_min_offset(commitlog.min_offset)
        log.info(
            "consume queues resume from commit log offset %d (log [%d, %d))",
            self.reput_from,
            commitlog.min_offset,
            commitlog.max_offset,
        )

    def _read_checkpoint(self) -> int | None:
        return _read_dispatched(self.checkpoint)

    def _holds(
        self,
        offset: int,
        *,
        size: int | None = None,
        queue_id: int | None = None,
        queue_offset: int | None = None,
    ) -> bool:
        """Whether the commit log holds the message a unit or an index entry points at
        (:func:`~trioha.store.is_record_at`); offsets below the log's start (deleted
        segments) count as held: what is gone there is retention's, not damage."""
        commitlog = self.commitlog
        if offset < commitlog.min_offset:
            return True
        if offset + RECORD_HEAD_SIZE > commitlog.max_offset:
            return False
        try:
            head = commitlog.read(offset, RECORD_HEAD_SIZE)
        except StorageError:
            return False
        return is_record_at(head, offset, size=size, queue_id=queue_id, queue_offset=queue_offset)

    def _cut_lost_units(self) -> int:
        """Remove, newest first, the units whose message the commit log does not hold."""
        total = 0
        for queue in self.queues:
            queue_id = queue.queue_id

            def gone(unit: CQUnit, at: int, queue_id: int = queue_id) -> bool:
                return not self._holds(
                    unit.commitlog_offset, size=unit.size, queue_id=queue_id, queue_offset=at
                )

            removed = queue.cut_tail(gone)
            if removed:
                log.warning(
                    "consume queue %s/%d: its last %d units point at commit log bytes that "
                    "hold no such message (a tail lost in a crash); removed, the queue is "
                    "built again from the log",
                    queue.topic,
                    queue_id,
                    removed,
                )
            total += removed
        return total

    def truncated(self, offset: int) -> int:
        """Follow a cut of the commit log back to ``offset``; returns the units removed.

        Call it right after the commit log was truncated (:func:`truncate_replica` does
        both): units pointing at or past ``offset`` go, durably, and building resumes there.
        """
        removed = cut_consume_queues(self.queues, self.checkpoint, offset, index=self.index)
        self.reput_from = min(self.reput_from, offset)
        self._stuck_at = None
        return removed

    # --- dispatching --------------------------------------------------------------------
    @property
    def behind(self) -> int:
        """Commit log bytes not indexed yet (``dispatchBehindBytes``)."""
        return max(0, self.commitlog.max_offset - self.reput_from)

    def dispatch_available(self, max_records: int = BATCH_RECORDS) -> int:
        """Index complete records from ``reput_from``; returns how many were dispatched.

        Stops at the end of the log, at a partial record, at an invalid one, or after
        ``max_records`` (call again).
        """
        commitlog = self.commitlog
        done = 0
        touched: dict[tuple[str, int], ConsumeQueue] = {}
        topics: dict[bytes, str] = {}
        index = self.index
        indexed: list[_Indexed] = []
        while done < max_records and self.reput_from < commitlog.max_offset:
            if self.reput_from < commitlog.min_offset:
                log.warning(
                    "consume queues were built up to commit log offset %d, below the log's "
                    "start %d: the messages in between were deleted before they were indexed "
                    "(retention); building goes on from %d",
                    self.reput_from,
                    commitlog.min_offset,
                    commitlog.min_offset,
                )
                self.reput_from = commitlog.min_offset
                continue
            offset = self.reput_from
            # One copy per read: bytes can be searched in place (properties) and sliced.
            buf = bytes(commitlog.read(offset, READ_CHUNK))
            pos, end = 0, len(buf)
            while pos < end and done < max_records:
                # Only the fields a consume queue unit needs are read: decoding whole
                # messages cost a slave most of its catch-up CPU. The common record (V1
                # magic, IPv4 hosts, complete, lengths adding up) is read with one unpack
                # here; anything else goes through parse_record, which names what is wrong.
                fast = False
                if pos + _FAST_HEAD_SIZE <= end:
                    total, magic, queue_id, queue_offset, phy, sysflag, stamp, body_len = (
                        _fast_head(buf, pos)
                    )
                    rec_end = pos + total
                    body_end = pos + _FAST_HEAD_SIZE + body_len
                    if (
                        magic == MESSAGE_MAGIC
                        and not sysflag & _IPV6_HOSTS
                        and total >= MIN_RECORD_SIZE
                        and rec_end <= end
                        and body_len >= 0
                        and body_end < rec_end
                    ):
                        topic_start = body_end + 1
                        topic_end = topic_start + buf[body_end]
                        fast = (
                            buf[body_end] <= 127
                            and topic_end + 2 <= rec_end
                            and topic_end + 2 + _props_len(buf, topic_end)[0] == rec_end
                        )
                if not fast:
                    result = parse_record(buf, pos, end, False, offset)
                    if type(result) is RecordLayout:  # (not `match`: this runs per message)
                        f = result.fields
                        total, queue_id, queue_offset, phy, sysflag, stamp = (
                            f[0],
                            f[3],
                            f[5],
                            f[6],
                            f[7],
                            f[11],
                        )
                        topic_start, topic_end = result.topic_start, result.topic_end
                        rec_end = result.props_end
                        fast = True
                if fast:
                    transaction = sysflag & _TRANSACTION_MASK
                    if transaction in (_TRANSACTION_NOT_TYPE, _TRANSACTION_COMMIT):
                        raw_topic = buf[topic_start:topic_end]
                        topic = topics.get(raw_topic)
                        if topic is None:
                            topic = topics[raw_topic] = raw_topic.decode("utf-8", "replace")
                        key = (topic, queue_id)
                        queue = touched.get(key)
                        if queue is None:
                            queue = touched[key] = self.queues.find_or_create(*key)
                        if topic == SCHEDULE_TOPIC:
                            tags = self._schedule_tags_code(buf, topic_end + 2, rec_end, stamp)
                        else:
                            tags = _tags_code(buf, topic_end + 2, rec_end)
                        queue.put(queue_offset, phy, total, tags)
                        if index is not None:
                            uniq, keys = _index_keys(buf, topic_end + 2, rec_end)
                            indexed.append((topic, phy, stamp, uniq, keys))
                    elif index is not None and transaction != _TRANSACTION_ROLLBACK:
                        # Prepared messages are indexed, not queued (CommitLogDispatcherBuildIndex).
                        topic = buf[topic_start:topic_end].decode("utf-8", "replace")
                        uniq, keys = _index_keys(buf, topic_end + 2, rec_end)
                        indexed.append((topic, phy, stamp, uniq, keys))
                    pos += total
                    done += 1
                elif type(result) is DecodedBlank:
                    size = commitlog.segment_size
                    self.reput_from = (offset + pos) // size * size + size
                    break
                elif type(result) is DecodedIncomplete:
                    at, needed = result.offset, result.needed
                    if at + needed <= commitlog.max_offset and pos == 0:
                        # A record larger than one read: read it whole.
                        buf = bytes(commitlog.read(at, needed))
                        end = len(buf)
                        if end >= needed:
                            continue
                    self.reput_from = offset + pos
                    self._finish(indexed, touched)
                    return done
                else:
                    assert type(result) is DecodedInvalid
                    self.reput_from = offset + pos
                    if self._stuck_at != result.offset:
                        self._stuck_at = result.offset
                        log.error(
                            "consume queue building stopped at commit log offset %d: %s (%s)",
                            result.offset,
                            result.detail,
                            result.reason.value,
                        )
                    self._finish(indexed, touched)
                    return done
            else:
                self.reput_from = offset + pos
        self._finish(indexed, touched)
        return done

    def _schedule_tags_code(self, data: bytes, start: int, end: int, store_timestamp: int) -> int:
        """A scheduled message's unit carries its due time (``CommitLog.checkMessageAndReturn
        Size`` with ``computeDeliverTimestamp``), or its tag hash without a usable level."""
        raw = _property(data, _DELAY_KEY, start, end)
        try:
            level = int(raw) if raw is not None else 0
        except ValueError:
            level = 0
        if level <= 0 or not self.delay_levels:
            return _tags_code(data, start, end)
        return deliver_timestamp(self.delay_levels, level, store_timestamp)

    def _finish(
        self, indexed: list[_Indexed], touched: dict[tuple[str, int], ConsumeQueue]
    ) -> None:
        """The end of a dispatch pass: index what it read, write and wake its queues (both
        tried, whichever the disk refuses: the refusal of the index raises
        :class:`_IndexRefused`, the queues' their ``OSError``)."""
        try:
            self._build_index(indexed)
        finally:
            self._wake(touched)

    def _build_index(self, messages: list[_Indexed]) -> None:
        index = self.index
        if index is not None and (messages or index.pending):
            try:
                index.build_batch(messages, now_ms=int(time.time() * 1000))
            except OSError as exc:
                # The index keeps what it could not write and writes it with the next batch.
                raise _IndexRefused(exc) from exc

    def _wake(self, touched: dict[tuple[str, int], ConsumeQueue]) -> None:
        if not touched:
            return
        for key, queue in touched.items():
            queue.write_pending()  # one write per queue and batch (reads would do it anyway)
            event = self._arrivals.pop(key, None)
            if event is not None:
                event.set()
        self._any_arrival.set()
        self._any_arrival = trio.Event()

    async def wait_arrival(self, topic: str, queue_id: int, beyond: int) -> None:
        """Return once queue ``topic``/``queue_id`` has a unit at offset ``beyond`` or later.

        Long polling's wait (``PullRequestHoldService``); bound it with a Trio timeout.
        """
        while True:
            queue = self.queues.get(topic, queue_id)
            if queue is not None and queue.max_offset > beyond:
                return
            event = self._arrivals.get((topic, queue_id))
            if event is None:
                event = self._arrivals[(topic, queue_id)] = trio.Event()
            await event.wait()

    async def wait_dispatched(self, offset: int) -> None:
        """Return once everything below commit log ``offset`` is indexed (tests, shutdown)."""
        while self.reput_from < offset:
            await self._any_arrival.wait()

    # --- running ------------------------------------------------------------------------
    async def run(
        self,
        wait_log_grew: Callable[[int], Awaitable[object]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Follow the log forever (``ReputMessageService.run``), flushing every second."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            task_status.started()
            while True:
                if not await self._dispatch_all():
                    # The disk refused a unit: nothing is skipped, the same records are
                    # dispatched again (units already written are recognised) until it works.
                    await trio.sleep(self.retry_interval)
                    continue
                # Wait for growth past what is in the log now: a partial record at the
                # end stays partial until more bytes arrive.
                await wait_log_grew(self.commitlog.max_offset)
                # Growth wakes this task together with the HA writer (master) or the ack
                # writer (slave); one more pass lets those go first, since a sync put waits on
                # them and indexing does not. Measured: sync puts lose a whole dispatch batch
                # of latency per round trip otherwise.
                await trio.lowlevel.checkpoint()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _dispatch_all(self) -> bool:
        """Dispatch until caught up; False if a consume queue or index write failed (ENOSPC,
        EIO). Both stop puts while they fail (a message nobody can find is worse than a
        refused one) and are retried until they work."""
        try:
            while self.dispatch_available():
                await trio.lowlevel.checkpoint()
        except _IndexRefused as refused:  # one name per type: compiled, a name has one type
            self.disk.failed(MESSAGE_INDEX, refused.error)
            return False
        except OSError as exc:
            self.disk.failed(CONSUME_QUEUE, exc)
            return False
        for what in (CONSUME_QUEUE, MESSAGE_INDEX):
            if self.disk.failing(what):
                self.disk.succeeded(what)
        return True

    async def _flush_loop(self) -> None:
        last = -1
        try:
            while True:
                await trio.sleep(FLUSH_INTERVAL)
                if self.reput_from != last:
                    last = await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                await self.flush()

    async def flush(self) -> int:
        """fsync the queues, then record how far they are complete; returns that offset.

        A write the disk refuses is reported to the disk guard, not raised: the checkpoint
        then stays where it was (so a restart dispatches the rest again) and the next flush
        tries again. Returns the offset recorded, or -1 if nothing could be.
        """
        dispatched = self.reput_from
        try:
            fds = self.queues.dirty_handles()
        except OSError as exc:
            self.disk.failed(CONSUME_QUEUE, exc)
            return -1
        await trio.to_thread.run_sync(_sync_all, fds)
        try:
            if self.index is not None:
                async with self._index_lock:
                    await trio.to_thread.run_sync(self.index.flush)
            await trio.to_thread.run_sync(
                write_config_file, self.checkpoint, dumps({"dispatchedOffset": dispatched})
            )
        except OSError as exc:
            self.disk.failed(CONSUME_QUEUE_CHECKPOINT, exc, blocks_puts=False)
            return -1
        if self.disk.failing(CONSUME_QUEUE_CHECKPOINT):
            self.disk.succeeded(CONSUME_QUEUE_CHECKPOINT)
        return dispatched

    async def delete_expired_index(self, commitlog_min: int) -> int:
        """``IndexService.deleteExpiredFile``: the index files wholly below the commit log's
        start, never the newest (not while a flush of the index runs); returns how many."""
        if self.index is None:
            return 0
        async with self._index_lock:
            return self.index.delete_expired(commitlog_min)


class _IndexRefused(Exception):
    """The message index could not be written (its ``OSError`` is :attr:`error`)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _sync_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.fdatasync(fd)
        except OSError as exc:  # a file closed meanwhile (truncation); the next flush retries
            log.debug("consume queue fsync of fd %d failed: %s", fd, exc)


# --- cutting a replica back (the safe truncation) ----------------------------------------


def cut_consume_queues(
    queues: ConsumeQueueStore,
    checkpoint: Path,
    offset: int,
    *,
    index: IndexService | None = None,
) -> int:
    """Make the consume queues, the message index and the build checkpoint end at commit log
    ``offset``.

    ``truncateDirtyLogicFiles`` after a cut of the commit log, made durable at once: the
    removed units and entries are synced away and the checkpoint lowered before any new
    bytes land at those offsets, so no crash can bring back a unit pointing into a history
    that is gone, and the messages stored there next are indexed (the index skips offsets
    below its end). Returns how many units were removed.
    """
    removed = queues.truncate_dirty(offset)
    _sync_all(queues.dirty_handles())
    if index is not None:
        index.truncate(offset)
    saved = _read_dispatched(checkpoint)
    if saved is not None and saved > offset:
        write_config_file(checkpoint, dumps({"dispatchedOffset": offset}))
    return removed


def truncate_replica(
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    checkpoint: Path,
    offset: int,
    *,
    reput: ReputService | None = None,
    index: IndexService | None = None,
) -> list[SetAside]:
    """Cut a replica back to ``offset``: commit log, consume queues, index and checkpoint.

    ``offset`` must be a message boundary (:class:`~trioha.NotAMessageBoundaryError`
    otherwise, and nothing changes). The commit log goes first: it is the truth, and a
    crash between the steps is repaired on the next start (``truncate_dirty`` and the
    check of the newest units and entries cut the queues and the index to the recovered
    log). The cut bytes are kept aside; what was kept is returned. Pass the running
    ``reput`` service (whose ``queues`` and index are these) to have it follow, or, with no
    service running, the ``index`` to cut.
    """
    kept = commitlog.truncate_to_boundary(offset)
    if reput is not None:
        reput.truncated(offset)
    else:
        cut_consume_queues(queues, checkpoint, offset, index=index)
    return kept


def _read_dispatched(checkpoint: Path) -> int | None:
    try:
        value = loads_lenient(checkpoint.read_text(encoding="utf-8"))
        return int(value["dispatchedOffset"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable %s: %s", checkpoint, exc)
        return None
