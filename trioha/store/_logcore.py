"""The logic both commit logs share: RocketMQ's placement rules over segments.

:class:`LogCore` holds ``CommitLog.DefaultAppendMessageCallback.doAppend``,
``MappedFileQueue.getLastMappedFile`` and ``CommitLog.appendData``; the file log
(``_commitlog``) and the in-memory log (``_memory``) differ only in where a segment's bytes live.

Threading: every method belongs to one owner thread (the Trio thread) except :meth:`flush`,
which may run in a worker thread (``trio.to_thread.run_sync``) while the owner appends. A
``threading.Lock`` guards the segment list and write positions; it is never held across an
fsync.
"""

from __future__ import annotations

import abc
import bisect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, Generic, Self, TypeVar

from trioha._errors import CorruptLogError, MessageTooLargeError, OffsetMismatchError, StorageError
from trioha.store._boundary import boundaries_around, check_boundary, last_record
from trioha.store._contract import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_STORE_HOST,
    AppendResult,
    NewMessage,
    Released,
    SegmentLike,
    SetAside,
    system_clock_ms,
    to_host,
)
from trioha.store._message import (
    BLANK_RECORD_SIZE,
    DecodedIncomplete,
    DecodedInvalid,
    HostAddress,
    PreparedMessage,
    PropertiesForm,
    StoredMessage,
    _decode_topic,
    build_message,
    encode_blank,
)
from trioha.store._scan import PageBudget, QueueOffsets, RecordScan

log = logging.getLogger("trioha.store")

#: What a read of END_OF_FILE padding returns (a shared buffer: no copy for the usual sizes).
_ZEROS = memoryview(bytes(1 << 20))

S = TypeVar("S", bound=SegmentLike)


class LogCore(abc.ABC, Generic[S]):
    """RocketMQ's commit log rules over segments whose storage a subclass provides."""

    def __init__(
        self,
        *,
        segment_size: int,
        store_host: HostAddress = DEFAULT_STORE_HOST,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        properties_form: PropertiesForm = PropertiesForm.V4_9,
        clock_ms: Callable[[], int] = system_clock_ms,
    ) -> None:
        self._segment_size = segment_size
        self.store_host = store_host
        self.max_message_size = max_message_size
        self.properties_form = properties_form
        self._clock_ms = clock_ms
        self._segments: list[S] = []
        self._lock = threading.Lock()
        self._generation = 0  # bumped by truncate: a racing flush must not claim cut bytes
        self._flushed = 0
        self._queues = QueueOffsets(0)
        self._pages = PageBudget()
        self._closed = False
        self.set_aside: list[SetAside] = []

    # --- storage hooks --------------------------------------------------------------------

    @abc.abstractmethod
    def _create_segment(self, start: int) -> S:
        """A new empty segment starting at ``start``."""

    @abc.abstractmethod
    def _keep_aside(self, seg: S, pos: int, end: int, reason: str) -> SetAside:
        """Save bytes [pos, end) of ``seg`` before they are overwritten."""

    @abc.abstractmethod
    def _move_aside(self, seg: S, reason: str) -> SetAside:
        """Take a whole segment out of the log, keeping its bytes."""

    @abc.abstractmethod
    def _delete(self, seg: S) -> None:
        """Delete a segment (retention)."""

    @abc.abstractmethod
    def _record_start(self, offset: int | None) -> None:
        """Remember (or forget, with None) that the log starts inside its first segment."""

    def _sync_handles(self, segments: list[S]) -> list[Any]:
        """Called under the lock: what :meth:`_sync` needs to make ``segments`` durable."""
        return []

    def _sync(self, handles: list[Any]) -> None:
        """Called without the lock, possibly in a worker thread."""

    def _after_truncate(self, seg: S) -> None:
        """Make the zeroed tail of ``seg`` durable (so that cut records cannot come back)."""

    # --- offsets --------------------------------------------------------------------------

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def min_offset(self) -> int:
        segs = self._segments
        return segs[0].start + segs[0].data_start if segs else 0

    @property
    def max_offset(self) -> int:
        segs = self._segments
        if not segs:
            return 0
        last = segs[-1]
        return last.start + last.wrote

    @property
    def flushed_offset(self) -> int:
        return self._flushed

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_store_timestamp(self) -> int:
        """Store timestamp of the last message counted (appended, recovered or caught up)."""
        return self._queues.last_store_timestamp

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self!r} is closed")

    def _segment_at(self, offset: int) -> int:
        """Index of the segment holding ``offset`` (callers check the range)."""
        starts = [s.start for s in self._segments]
        return bisect.bisect_right(starts, offset) - 1

    def _add_segment(self, start: int) -> S:
        seg = self._create_segment(start)
        with self._lock:
            self._segments.append(seg)
        return seg

    # --- appending ------------------------------------------------------------------------

    def append(self, message: NewMessage) -> AppendResult:
        """Append one message at the end of the log (see :meth:`append_batch`)."""
        return self.append_batch((message,))[0]

    def prepare(self, message: NewMessage, now: int) -> PreparedMessage:
        """*message* encoded for this log, its offsets still to be placed: the one place a
        record is made from a message.

        What the message leaves to the log is decided here: born timestamp *now*, born host
        the store host, store host and properties form the log's own, the body checked
        against ``max_message_size``. Raises as :meth:`append_batch` does for a message it
        refuses (``MessageIllegalError``, ``BodyTooLargeError``, ``TopicTooLongError``,
        ``PropertiesTooLargeError``; ValueError for a host that is no address).
        """
        store_host = message.store_host
        if store_host is None:
            store_host = self.store_host
        elif not isinstance(store_host, HostAddress):
            store_host = to_host(store_host)
        born_host = message.born_host
        if born_host is None:
            born_host = store_host
        elif not isinstance(born_host, HostAddress):
            born_host = to_host(born_host)
        return PreparedMessage(
            topic=message.topic,
            body=message.body,
            queue_id=message.queue_id,
            flag=message.flag,
            sysflag=message.sysflag,
            born_timestamp=now if message.born_timestamp is None else message.born_timestamp,
            born_host=born_host,
            store_host=store_host,
            reconsume_times=message.reconsume_times,
            prepared_transaction_offset=message.prepared_transaction_offset,
            properties=message.properties,
            properties_form=message.properties_form or self.properties_form,
            max_body_size=self.max_message_size,
        )

    def append_batch(self, messages: Iterable[NewMessage]) -> list[AppendResult]:
        """Append a batch as consecutive records in one write (``MessageExtBatch``).

        As in RocketMQ the whole batch goes into one segment: if it does not fit the current
        one, a blank record closes it and the batch starts the next. Every message is
        prepared (:meth:`prepare`), and so validated, before anything is written; each is
        stamped now unless it brings its own store timestamp.
        """
        now = self._clock_ms()
        prepare = self.prepare
        prepared: list[PreparedMessage] = []
        stamps: list[int] = []
        for message in messages:
            prepared.append(prepare(message, now))
            stamps.append(now if message.store_timestamp is None else message.store_timestamp)
        if not prepared:
            return []
        return self._append_prepared(prepared, stamps)

    def _append_prepared(
        self, prepared: list[PreparedMessage], stamps: list[int]
    ) -> list[AppendResult]:
        self._check_open()
        self._catch_up()
        size = self._segment_size
        total = sum(p.length for p in prepared)
        if total + BLANK_RECORD_SIZE > size:
            what = "message" if len(prepared) == 1 else f"batch of {len(prepared)} messages"
            raise MessageTooLargeError(
                f"{what} of {total} bytes does not fit a segment of {size} bytes "
                f"(a segment keeps {BLANK_RECORD_SIZE} bytes for its end marker)"
            )
        seg = self._segments[-1] if self._segments else self._add_segment(0)
        pos = seg.wrote
        if total + BLANK_RECORD_SIZE > size - pos:
            # doAppend's END_OF_FILE: the blank marker closes the file, the message moves on.
            if size - pos >= BLANK_RECORD_SIZE:
                seg.write(pos, encode_blank(size - pos))
            with self._lock:
                seg.wrote = size
            seg = self._add_segment(seg.start + size)
            pos = 0
        buf = bytearray(total)
        queues = self._queues.next
        pending: dict[tuple[str, int], int] = {}
        results: list[AppendResult] = []
        p = 0
        base = seg.start + pos
        for msg, ts in zip(prepared, stamps, strict=True):
            key = (msg.topic_str, msg.queue_id)
            qo = pending.get(key)
            if qo is None:
                qo = queues.get(key, 0)
            pending[key] = qo + 1
            msg.write_into(buf, p, queue_offset=qo, physical_offset=base + p, store_timestamp=ts)
            results.append(
                AppendResult(
                    base + p, msg.length, qo, ts, msg.store_host, msg.topic_str, msg.queue_id
                )
            )
            p += msg.length
        seg.write(pos, buf)
        with self._lock:
            seg.wrote = pos + total
        queues.update(pending)
        self._queues.cursor = base + total
        self._queues.last_store_timestamp = stamps[-1]
        return results

    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append replicated bytes at exactly the end of the log (``CommitLog.appendData``).

        An empty log starts wherever the first bytes say. Its first segment is the one
        RocketMQ would create (``offset - offset % segment_size``) but, unlike RocketMQ, the
        bytes go to their true position inside it, so the file stays byte-identical to the
        master's from ``offset`` on; the start is remembered so that recovery knows where
        data begins. Bytes crossing a segment end are split (the HA master never sends
        such a frame, but nothing here relies on it). An empty ``data`` on an empty log
        creates the first segment, as RocketMQ's heartbeat append does.
        """
        self._check_open()
        if offset < 0:
            raise OffsetMismatchError(f"replicated bytes offered at negative offset {offset}")
        size = self._segment_size
        if self._segments and self.max_offset == self.min_offset != offset:
            # The log holds nothing (a slave cut back to an empty segment by recovery, whose
            # cut bytes were kept aside): it starts over wherever the master serves it from,
            # e.g. the master's last segment for a report of 0. Its empty files hold no data.
            log.info(
                "empty commit log at %d starts over at %d for replicated data",
                self.max_offset,
                offset,
            )
            for seg in self._segments:
                self._delete(seg)
            with self._lock:
                self._segments.clear()
            self._record_start(None)
        if not self._segments:
            inner = offset % size
            if inner:
                self._record_start(offset)
            seg = self._create_segment(offset - inner)
            seg.data_start = seg.wrote = seg.flushed = inner
            with self._lock:
                self._segments.append(seg)
            self._queues.cursor = offset
            self._flushed = offset
        elif offset != self.max_offset:
            raise OffsetMismatchError(
                f"replicated bytes offered at offset {offset}, but the log ends at "
                f"{self.max_offset}"
            )
        view = memoryview(data).cast("B")
        n = view.nbytes
        done = 0
        while done < n:
            seg = self._segments[-1]
            if seg.wrote >= size:
                seg = self._add_segment(seg.start + size)
            k = min(n - done, size - seg.wrote)
            seg.write(seg.wrote, view[done : done + k])
            with self._lock:
                seg.wrote += k
            done += k
        return self.max_offset

    def _catch_up(self) -> None:
        """Count replicated records not yet counted (before an append needs queue offsets)."""
        queues = self._queues
        if queues.cursor >= self.max_offset or not self._segments:
            return
        start = max(queues.cursor, self.min_offset)
        scan = RecordScan(
            self._segments, start, self._segment_size, check_crc_from=0, pages=self._pages
        )
        queues.count(scan)
        if scan.problem is not None and not isinstance(scan.problem, DecodedIncomplete):
            log.warning("queue offsets are counted up to %d only: %s", scan.end, scan.problem)
            queues.cursor = self.max_offset

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        self._catch_up()
        return self._queues.next.get((topic, queue_id), 0)

    # --- reading --------------------------------------------------------------------------

    def _check_range(self, offset: int) -> None:
        if not self.min_offset <= offset <= self.max_offset:
            raise StorageError(
                f"offset {offset} is outside the commit log [{self.min_offset}, {self.max_offset}]"
            )

    def read(self, offset: int, max_bytes: int) -> memoryview | bytes:
        """Written bytes from ``offset``, at most ``max_bytes``, never past a segment end.

        This is what the HA master sends (``getData``/``selectMappedBuffer``); a segment
        closed by a blank record is read up to its end, padding included. The padding is a
        hole in the file, and it is read as the zeros it is, never through the segment's
        mapping (``_segment``'s note on holes).
        """
        self._check_open()
        self._check_range(offset)
        if max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
        if offset == self.max_offset or max_bytes == 0:
            return b""
        seg = self._segments[self._segment_at(offset)]
        pos = offset - seg.start
        end = min(seg.wrote, pos + max_bytes)
        backed = seg.backed
        if end <= backed:
            view = seg.view(pos, end)
            self._pages.note(seg, len(view))
            return view
        if pos >= backed:
            return _ZEROS[: end - pos] if end - pos <= len(_ZEROS) else bytes(end - pos)
        written = seg.view(pos, backed)
        self._pages.note(seg, len(written))
        return bytes(written) + bytes(end - backed)

    def iter_messages(self, start: int | None = None) -> Iterator[StoredMessage]:
        """Messages from ``start`` (a record boundary; default the first message).

        Blank records are skipped and a partial message at the very end (a slave mid-way
        through receiving it) ends the iteration quietly. Anything else that is not a valid
        record raises :class:`CorruptLogError` naming the offset. Appends made while
        iterating are seen; a truncate or deletion while iterating is not supported.
        """
        self._check_open()
        begin = self.min_offset if start is None else start
        self._check_range(begin)
        return self._iter_messages(begin)

    def _iter_messages(self, begin: int) -> Iterator[StoredMessage]:
        scan = RecordScan(
            self._segments, begin, self._segment_size, check_crc_from=0, pages=self._pages
        )
        for buf, pos, _base, layout in scan:
            yield build_message(buf, pos, layout)
        problem = scan.problem
        if problem is None:
            return
        if isinstance(problem, DecodedIncomplete) and self._is_last_written(problem.offset):
            return
        detail = (
            f"{problem.reason.value}: {problem.detail}"
            if isinstance(problem, DecodedInvalid)
            else f"a record of {problem.needed} bytes runs past the written end"
        )
        raise CorruptLogError(f"commit log record at {problem.offset} is not valid ({detail})")

    def _is_last_written(self, offset: int) -> bool:
        last = self._segments[-1]
        return offset >= last.start

    # --- durability -----------------------------------------------------------------------

    def flush(self) -> int:
        """fsync everything written so far; safe from a worker thread during appends."""
        with self._lock:
            if self._closed:
                return self._flushed
            generation = self._generation
            target = self.max_offset
            dirty = [s for s in self._segments if s.flushed < s.wrote]
            positions = [s.wrote for s in dirty]
            handles = self._sync_handles(dirty)
        self._sync(handles)
        with self._lock:
            if generation == self._generation:
                for seg, wrote in zip(dirty, positions, strict=True):
                    seg.flushed = max(seg.flushed, wrote)
                self._flushed = max(self._flushed, target)
            return self._flushed

    # --- cutting --------------------------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """Drop everything at and after ``offset`` (``MappedFileQueue.truncateDirtyFiles``).

        The cut bytes of the segment holding ``offset`` are kept aside, then zeroed in
        place (files keep their size); later segments are moved aside whole. Queue offsets
        are rolled back to the first cut message of each queue.
        """
        self._check_open()
        self._check_range(offset)
        if offset == self.max_offset:
            return
        self._roll_back_queues(offset)
        i = self._segment_at(offset)
        seg = self._segments[i]
        pos = offset - seg.start
        old = seg.wrote
        if pos < old:  # a durable copy first: nothing is lost whatever fails next
            self.set_aside.append(self._keep_aside(seg, pos, old, "truncated"))
        with self._lock:  # detached before closing, so a concurrent flush never sees them
            later = self._segments[i + 1 :]
            del self._segments[i + 1 :]
            seg.wrote = pos
            seg.flushed = min(seg.flushed, pos)
            self._generation += 1
            self._flushed = min(self._flushed, offset)
        if pos < old:
            seg.zero(pos, min(old, max(pos, seg.backed)))  # past ``backed``: zeros already
            self._after_truncate(seg)
        # Should a move fail, recovery moves what is left on the next open: the log already
        # ends at ``offset`` on disk.
        for s in later:
            self.set_aside.append(self._move_aside(s, "truncated"))
        end = later[-1].start + later[-1].wrote if later else seg.start + old
        log.warning("commit log truncated at %d (was up to %d)", offset, end)

    # --- safe truncation (cutting a replica back to the history it shares) ----------------

    def boundaries_around(self, offset: int) -> tuple[int, int | None]:
        """The nearest message boundaries ``before <= offset <= after`` (see ``_boundary``)."""
        self._check_open()
        self._check_range(offset)
        return boundaries_around(self._segments, self._segment_size, offset)

    def last_record(self) -> tuple[int, int] | None:
        """``(offset, store timestamp)`` of the last complete message, found backwards from
        the written end (``_boundary.last_record``): a slave's log may end mid-record, and
        this costs about the last record's length, not a walk of the log."""
        self._check_open()
        return last_record(self._segments, self._segment_size)

    def truncate_to_boundary(self, offset: int) -> list[SetAside]:
        """Cut the log back to ``offset``, which must be a message boundary.

        The safe form of :meth:`truncate` for a replica cut back to what it shares with its
        master (``CommitLog.truncateDirtyFiles`` at a consistent point): an offset inside a
        record raises :class:`~trioha.NotAMessageBoundaryError` naming the nearest
        boundaries, and nothing changes. The cut bytes are kept aside as recovery keeps
        them; the entries added to :attr:`set_aside` are returned. The written end is always
        accepted (nothing to cut, even when the last record is only partly received).
        """
        self._check_open()
        self._check_range(offset)
        check_boundary(self._segments, self._segment_size, offset)
        kept = len(self.set_aside)
        self.truncate(offset)
        return self.set_aside[kept:]

    def skip_past(self, offset: int) -> int:
        """Start new data at the first segment boundary strictly beyond ``offset``.

        What a classic master does after losing bytes it had sent (docs/replication.md):
        the rest of the current segment, and every segment up to that boundary, is closed
        with RocketMQ's own END_OF_FILE blank record (``doAppend``'s ``BLANK_MAGIC_CODE``),
        which every reader, Java's included, treats as "go to the next file". New records
        thus never take an offset a slave may hold from the lost history. Returns the new
        end of the log (unchanged when it is already past ``offset``).
        """
        self._check_open()
        size = self._segment_size
        target = (offset // size + 1) * size
        if self.max_offset >= target:
            return self.max_offset
        self._catch_up()
        while self.max_offset < target:
            if not self._segments or self._segments[-1].wrote >= size:
                start = self._segments[-1].start + size if self._segments else 0
                seg = self._add_segment(max(start, self.max_offset - self.max_offset % size))
            else:
                seg = self._segments[-1]
            pos = seg.wrote
            if size - pos >= BLANK_RECORD_SIZE:
                seg.write(pos, encode_blank(size - pos))
            with self._lock:
                seg.wrote = size
        self._queues.cursor = self.max_offset
        log.warning(
            "commit log closed with end-of-file records up to %d: new data starts there",
            self.max_offset,
        )
        return self.max_offset

    def _roll_back_queues(self, offset: int) -> None:
        queues = self._queues
        if queues.cursor <= offset:
            return
        scan = RecordScan(
            self._segments, offset, self._segment_size, check_crc_from=1 << 63, pages=self._pages
        )
        first: dict[tuple[str, int], int] = {}
        for buf, pos, base, layout in scan:
            if base + pos >= queues.cursor:  # beyond what was counted
                break
            topic = _decode_topic(bytes(buf[layout.topic_start : layout.topic_end]))
            first.setdefault((topic, layout.fields[3]), layout.fields[5])
        if scan.end < min(queues.cursor, self.max_offset) and scan.problem is not None:
            # Not a record boundary, or unreadable bytes: count everything again.
            queues.next.clear()
            queues.cursor = self.min_offset
            queues.last_store_timestamp = 0
            return
        queues.next.update(first)
        queues.cursor = offset

    def segment_times(self) -> list[int]:
        """Each segment's last-modified time (ms since the epoch), oldest first
        (``MappedFile.getLastModifiedTimestamp``): what retention compares with
        ``fileReservedTime``. The last entry is the segment written now."""
        self._check_open()
        return [seg.modified_ms for seg in self._segments]

    def floor_queue_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Make the next queue offset of each ``(topic, queue id)`` at least the one given.

        ``recoverTopicQueueTable``: the log counts queue offsets from the records it holds,
        so a queue whose messages retention deleted would start again at 0 after a restart,
        at offsets its consume queue already holds. The broker passes each consume queue's
        end here when it opens them.
        """
        self._catch_up()
        nxt = self._queues.next
        for key, offset in offsets.items():
            if offset > nxt.get(key, 0):
                nxt[key] = offset

    def forget_queue(self, topic: str, queue_id: int) -> None:
        """``CommitLog.removeQueueFromTopicQueueTable`` (``cleanExpiredConsumerQueue``): the
        queue, whose consume queue was destroyed, counts from 0 again."""
        self._check_open()
        self._catch_up()
        if self._queues.next.pop((topic, queue_id), None) is not None:
            log.info("removeQueueFromTopicQueueTable OK Topic: %s QueueId: %d", topic, queue_id)

    def release_segments_before(self, offset: int) -> Released:
        """Retention's first half (``deleteExpiredFileByOffset``), in the owner thread: take
        the whole segments ending at or before ``offset`` out of the log, oldest first,
        never the last one. Readers see the new min offset at once; the files are deleted by
        :meth:`Released.destroy` (blocking IO: any thread, e.g. a worker's).

        A reader still holding a view of a released segment keeps its mapping alive until it
        lets go (``_segment``'s note on lifetime): the bytes under a view never change or
        fault, which is what ``destroyMapedFileIntervalForcibly`` waits for in RocketMQ.
        """
        self._check_open()
        self._catch_up()
        size = self._segment_size
        doomed: list[S] = []
        with self._lock:
            while len(self._segments) > 1 and self._segments[0].start + size <= offset:
                doomed.append(self._segments.pop(0))
        if not doomed:
            return Released((), self.min_offset)
        self._queues.cursor = max(self._queues.cursor, self.min_offset)
        starts = tuple(seg.start for seg in doomed)
        return Released(starts, self.min_offset, partial(self._destroy, doomed, self.min_offset))

    def delete_segments_before(self, offset: int) -> int:
        """:meth:`release_segments_before` and :meth:`Released.destroy` at once; returns how
        many segments went."""
        released = self.release_segments_before(offset)
        released.destroy()
        return len(released.starts)

    def _destroy(self, doomed: list[S], min_offset: int) -> None:
        for seg in doomed:  # oldest first: a crash in between never leaves a hole
            self._delete(seg)
        # The start marker last: it may point into the first deleted segment, and one that
        # points nowhere is ignored on open, while a first segment without it would be read
        # from its very start.
        self._record_start(None)
        log.info(
            "deleted %d commit log segment(s) [%d, %d); the log now starts at %d",
            len(doomed),
            doomed[0].start,
            doomed[-1].start + self._segment_size,
            min_offset,
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush and release the segments; offsets stay readable, IO raises afterwards."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
        for seg in self._segments:
            seg.close()
