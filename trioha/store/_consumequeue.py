"""Consume queues: the per-topic, per-queue index into the commit log.

Mirrors RocketMQ's ``ConsumeQueue`` and ``DefaultMessageStore.consumeQueueTable``
(docs/rocketmq-protocol.md §4.5). A queue is a directory ``<root>/consumequeue/<topic>/<queueId>/``
of files named like commit log files (the byte offset of their first unit, 20 digits), each exactly
``mappedFileSizeConsumeQueue`` = 300000 × 20 bytes, created sparse. Unit ``i`` (the message with
queue offset ``i``) is 20 bytes at byte ``i * 20``::

    int64 commit log offset | int32 size | int64 tags hash code

A unit with size 0 ends the data (a file reads as zeros past it). A unit
``(0, 0x7FFFFFFF, 0)`` is RocketMQ's "pre-blank": a filler before the first real unit of a
queue that does not start at 0.

The queues are derived data. They are rebuilt from the commit log by the dispatcher
(``trioha.remoting``'s reput service, RocketMQ's ``ReputMessageService``), truncated on
start to what the commit log holds (``truncateDirtyLogicFiles``), and a unit for a queue
offset that is already present is skipped (``Build consume queue repeatedly``), so
re-dispatching a range is harmless. Plain blocking file IO: units are small and land in the
page cache. Units are gathered in memory and written in one ``pwrite`` per queue and batch
(:meth:`ConsumeQueue.write_pending`): one syscall per 20-byte unit was a quarter of a slave's
CPU while catching up. Every read of a queue writes what is pending first, so no reader (in
this thread) can tell.
"""

from __future__ import annotations

import logging
import operator
import os
import re
import shutil
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import attrs

from trioha._errors import StoreLayoutError

__all__ = [
    "CQ_UNIT_SIZE",
    "DEFAULT_CQ_FILE_SIZE",
    "CQUnit",
    "ConsumeQueue",
    "ConsumeQueueStore",
    "java_string_hash",
    "tags_code",
]

log = logging.getLogger("trioha.store.consumequeue")

CQ_UNIT_SIZE: Final = 20
"""``ConsumeQueue.CQ_STORE_UNIT_SIZE``."""
DEFAULT_CQ_FILE_SIZE: Final = 300_000 * CQ_UNIT_SIZE
"""``mappedFileSizeConsumeQueue``: 300000 units (6,000,000 bytes)."""
PRE_BLANK_SIZE: Final = 0x7FFFFFFF
"""``fillPreBlank`` writes units of (0, Integer.MAX_VALUE, 0)."""

_UNIT = struct.Struct(">qiq")
_PENDING_MAX = 64 * 1024  # bytes of units gathered before they are written regardless
_BLANK = _UNIT.pack(0, PRE_BLANK_SIZE, 0)
_NAME = re.compile(r"[0-9]{20}")


#: Per string length n: 31**(n-1-i) mod 2**32 for each position i (``String.hashCode``'s weights).
_HASH_WEIGHTS: dict[int, tuple[int, ...]] = {}


def _weights(n: int) -> tuple[int, ...]:
    weights = _HASH_WEIGHTS.get(n)
    if weights is None:
        weights = tuple(pow(31, n - 1 - i, 1 << 32) for i in range(n))
        if n <= 1024:
            _HASH_WEIGHTS[n] = weights
    return weights


def java_string_hash_extend(h: int, data: bytes) -> int:
    """The unsigned ``hashCode`` of ``s + data`` from ``h``, the unsigned hash of ``s``, for
    ASCII ``data`` (one byte per UTF-16 unit): h·31**len + Σ data[i]·31**(len-1-i), mod 2**32."""
    power, weights = _EXTENSIONS.get(len(data)) or extension_weights(len(data))
    total: int = h * power + sum(map(operator.mul, data, weights))
    return total & 0xFFFFFFFF


#: By length n: 31**n mod 2**32 and the weights of n units, for :func:`java_string_hash_extend`.
_EXTENSIONS: dict[int, tuple[int, tuple[int, ...]]] = {}


def extension_weights(n: int) -> tuple[int, tuple[int, ...]]:
    """What extending a hash by ``n`` units takes: 31**n mod 2**32 and :func:`_weights`."""
    found = _EXTENSIONS.get(n)
    if found is None:
        found = (pow(31, n, 1 << 32), _weights(n))
        if n <= 1024:
            _EXTENSIONS[n] = found
    return found


def java_string_hash(text: str) -> int:
    """``String.hashCode()``: over UTF-16 code units, 32-bit signed.

    The sum of each unit times its power of 31, mod 2**32: ``sum(map(mul, ...))`` runs in C,
    about three times faster than a loop in Python (the message index hashes every key).
    """
    if text.isascii():
        units: Sequence[int] = text.encode("ascii")
    else:
        data = text.encode("utf-16-be")
        units = [(data[i] << 8) | data[i + 1] for i in range(0, len(data), 2)]
    h: int = sum(map(operator.mul, units, _weights(len(units)))) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def tags_code(tags: str | None) -> int:
    """``MessageExtBrokerInner.tagsString2tagsCode``: the tag's hash, 0 without one."""
    return java_string_hash(tags) if tags else 0


@attrs.frozen
class CQUnit:
    """One consume queue entry: where the message is in the commit log, and its tag hash."""

    commitlog_offset: int
    size: int
    tags_code: int

    @property
    def is_blank(self) -> bool:
        return self.size == PRE_BLANK_SIZE and self.commitlog_offset == 0


class _CQFile:
    __slots__ = ("dirty", "fd", "path", "start")

    def __init__(self, path: Path, fd: int, start: int) -> None:
        self.path = path
        self.fd = fd
        self.start = start
        self.dirty = False


class ConsumeQueue:
    """One topic's queue ``queue_id``; offsets here are logical (unit indexes)."""

    def __init__(self, directory: Path, topic: str, queue_id: int, file_size: int) -> None:
        if file_size <= 0 or file_size % CQ_UNIT_SIZE:
            raise ValueError(f"consume queue file size {file_size} is not a multiple of 20")
        self.directory = directory
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self._files: list[_CQFile] = []
        #: Byte offset just after the last unit written (the queue's wrotePosition).
        self._end = 0
        #: Logical offset of the first real unit (after any pre-blank).
        self.min_offset = 0
        #: End (offset + size) in the commit log of the last unit.
        self.max_physical_offset = -1
        #: Units not written yet; they end at ``_end``.
        self._pending = bytearray()

    def __repr__(self) -> str:
        return f"<ConsumeQueue {self.topic}/{self.queue_id} [{self.min_offset}, {self.max_offset})>"

    @property
    def max_offset(self) -> int:
        """Logical offset the next unit gets (``getMaxOffsetInQueue``)."""
        return self._end // CQ_UNIT_SIZE

    # --- files --------------------------------------------------------------------------
    def load(self) -> None:
        """Open the files and find the end (``ConsumeQueue.load`` + ``recover``)."""
        if not self.directory.is_dir():
            return
        names = sorted(p for p in self.directory.iterdir() if _NAME.fullmatch(p.name))
        for path in names:
            size = path.stat().st_size
            if size != self.file_size:
                raise StoreLayoutError(
                    f"consume queue file {path} is {size} bytes, expected {self.file_size} "
                    "(mappedFileSizeConsumeQueue)"
                )
            start = int(path.name)
            if self._files and start != self._files[-1].start + self.file_size:
                raise StoreLayoutError(
                    f"consume queue file {path} does not follow {self._files[-1].path.name}"
                )
            self._files.append(_CQFile(path, os.open(path, os.O_RDWR | os.O_CLOEXEC), start))
        self._recover()

    def _recover(self) -> None:
        self._end = self._files[0].start if self._files else 0
        first_real: int | None = None
        for cq_file in self._files:
            data = os.pread(cq_file.fd, self.file_size, 0)
            pos = 0
            while pos < len(data):
                offset, size, _ = _UNIT.unpack_from(data, pos)
                if size <= 0 or offset < 0:
                    break
                if first_real is None and not (offset == 0 and size == PRE_BLANK_SIZE):
                    first_real = (cq_file.start + pos) // CQ_UNIT_SIZE
                if size != PRE_BLANK_SIZE:
                    self.max_physical_offset = offset + size
                pos += CQ_UNIT_SIZE
            self._end = cq_file.start + pos
            if pos < self.file_size:
                break
        self.min_offset = first_real if first_real is not None else self.max_offset
        # Files wholly past the end hold nothing (a crash after creating the next file).
        while len(self._files) > 1 and self._files[-1].start >= self._end:
            self._drop_last_file()

    def _drop_last_file(self) -> None:
        cq_file = self._files.pop()
        os.close(cq_file.fd)
        cq_file.path.unlink(missing_ok=True)

    def _file_for(self, byte_offset: int, *, create: bool) -> _CQFile | None:
        start = byte_offset - byte_offset % self.file_size
        if self._files and self._files[0].start <= start:
            index = (start - self._files[0].start) // self.file_size
            if index < len(self._files):
                return self._files[index]
        if not create:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        while not self._files or self._files[-1].start < start:
            next_start = self._files[-1].start + self.file_size if self._files else start
            path = self.directory / f"{next_start:020d}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.ftruncate(fd, self.file_size)
            self._files.append(_CQFile(path, fd, next_start))
        return self._files[-1]

    # --- writing ------------------------------------------------------------------------
    def put(self, queue_offset: int, commitlog_offset: int, size: int, tags: int) -> bool:
        """Write the unit of ``queue_offset`` (``putMessagePositionInfo``).

        Returns False when that unit is already present (a re-dispatch), True when written.
        A unit beyond the end leaves a gap that is filled with pre-blank units, as RocketMQ
        fills a queue's first file (``fillPreBlank``); a gap anywhere but at the start of a
        queue is logged as the bug it is.
        """
        expect = queue_offset * CQ_UNIT_SIZE
        if expect != self._end or not self._pending:  # not simply the next gathered unit
            if expect < self._end:
                return False
            self.write_pending()
            self._prepare_end(expect, queue_offset)
        self._pending += _UNIT.pack(commitlog_offset, size, tags)
        self._end = expect + CQ_UNIT_SIZE
        self.max_physical_offset = commitlog_offset + size
        if len(self._pending) >= _PENDING_MAX:
            self.write_pending()
        return True

    def _prepare_end(self, expect: int, queue_offset: int) -> None:
        """Before a first unit, or one beyond the end: place the start, fill a gap."""
        if not self._files and self._end == 0:
            # A queue whose first message is not at offset 0 (its older messages were
            # never here): its first file is the one holding that unit.
            self._end = expect - expect % self.file_size
            self.min_offset = queue_offset
        elif expect > self._end:
            log.error(
                "consume queue %s/%d: unit %d arrives at end %d; the gap is filled with blanks",
                self.topic,
                self.queue_id,
                queue_offset,
                self.max_offset,
            )
        while self._end < expect:  # fillPreBlank, one write per file
            cq_file = self._file_for(self._end, create=True)
            assert cq_file is not None
            stop = min(expect, cq_file.start + self.file_size)
            os.pwrite(
                cq_file.fd, _BLANK * ((stop - self._end) // CQ_UNIT_SIZE), self._end - cq_file.start
            )
            cq_file.dirty = True
            self._end = stop

    def write_pending(self) -> None:
        """Write the gathered units to their files (one ``pwrite`` per file they span)."""
        pending = self._pending
        if not pending:
            return
        at = self._end - len(pending)
        done = 0
        with memoryview(pending) as view:  # released before the clear below
            while done < len(view):
                cq_file = self._file_for(at, create=True)
                assert cq_file is not None
                n = min(len(view) - done, cq_file.start + self.file_size - at)
                written = os.pwrite(cq_file.fd, view[done : done + n], at - cq_file.start)
                cq_file.dirty = True
                done += written
                at += written
        pending.clear()

    def truncate_dirty(self, commitlog_end: int) -> int:
        """Drop units pointing at or past ``commitlog_end`` (``truncateDirtyLogicFiles``).

        Returns how many units were removed.
        """
        removed = self.cut_tail(lambda unit, _: unit.commitlog_offset + unit.size > commitlog_end)
        if removed:
            log.info(
                "consume queue %s/%d truncated by %d units to end before commit log offset %d",
                self.topic,
                self.queue_id,
                removed,
                commitlog_end,
            )
        return removed

    def cut_tail(self, gone: Callable[[CQUnit, int], bool]) -> int:
        """Drop units from the end while ``gone(unit, queue_offset)`` says their message is
        not in the commit log (a pre-blank unit stops it); returns how many were removed.

        The units are overwritten with zeros in place (pages already written: a full disk
        allows it) and files wholly past the new end are deleted.
        """
        self.write_pending()
        removed = 0
        while self._end > 0:
            unit = self._read_unit(self._end - CQ_UNIT_SIZE)
            if unit is None or unit.is_blank or not gone(unit, self._end // CQ_UNIT_SIZE - 1):
                break
            self._end -= CQ_UNIT_SIZE
            cq_file = self._file_for(self._end, create=False)
            assert cq_file is not None
            os.pwrite(cq_file.fd, bytes(CQ_UNIT_SIZE), self._end - cq_file.start)
            cq_file.dirty = True
            removed += 1
        # Files from the end on hold nothing now (the first file of a queue stays).
        while len(self._files) > 1 and self._files[-1].start >= self._end:
            self._drop_last_file()
        last = self._read_unit(self._end - CQ_UNIT_SIZE) if self._end else None
        self.max_physical_offset = (
            last.commitlog_offset + last.size if last is not None and not last.is_blank else -1
        )
        self.min_offset = min(self.min_offset, self.max_offset)
        return removed

    # --- retention ----------------------------------------------------------------------
    def delete_expired(self, commitlog_min: int) -> int:
        """Delete the oldest files whose units all point below ``commitlog_min``, never the
        last file, then correct the queue's min offset (``ConsumeQueue.deleteExpiredFile``:
        ``deleteExpiredFileByOffset`` and ``correctMinOffset``). Returns how many files went.

        A file is judged by its last unit, as RocketMQ does (units are in commit log order); a
        file of pre-blank units goes too. Closed and unlinked at once: a file is small, and
        every read of a queue happens in the thread that calls this.
        """
        self.write_pending()
        deleted = 0
        while len(self._files) > 1:
            first = self._files[0]
            data = os.pread(first.fd, CQ_UNIT_SIZE, self.file_size - CQ_UNIT_SIZE)
            if len(data) < CQ_UNIT_SIZE:
                break
            last = CQUnit(*_UNIT.unpack(data))
            if last.size <= 0 or last.commitlog_offset >= commitlog_min:
                break
            log.info(
                "consume queue %s/%d: %s ends with commit log offset %d, below the log's start "
                "%d; deleted",
                self.topic,
                self.queue_id,
                first.path.name,
                last.commitlog_offset,
                commitlog_min,
            )
            self._files.pop(0)
            os.close(first.fd)
            first.path.unlink(missing_ok=True)
            deleted += 1
        self.correct_min_offset(commitlog_min)
        return deleted

    def first_offset_held(
        self, commitlog_min: int, lo: int | None = None, hi: int | None = None
    ) -> int:
        """The first queue offset in ``[lo, hi)`` (default: the whole queue) whose message is
        at or after ``commitlog_min``, pre-blanks skipped; ``hi`` if none
        (``getMinOffsetInQueue`` after a deletion). Units are in commit log order, so a
        binary search."""
        lo = self.min_offset if lo is None else lo
        hi = self.max_offset if hi is None else hi
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get(mid)
            if unit is not None and (unit.is_blank or unit.commitlog_offset < commitlog_min):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def correct_min_offset(self, commitlog_min: int) -> int:
        """``correctMinOffset``: the queue now starts at its first unit whose message is at
        or after ``commitlog_min`` (pre-blanks skipped), searched in the first file (past
        its last unit when none is); returns the new min offset."""
        if not self._files:
            return self.min_offset
        first = self._files[0]
        lo = self.first_offset_held(
            commitlog_min,
            max(self.min_offset, first.start // CQ_UNIT_SIZE),
            min(self.max_offset, (first.start + self.file_size) // CQ_UNIT_SIZE),
        )
        if lo != self.min_offset:
            log.info(
                "consume queue %s/%d: min offset now %d (the commit log starts at %d)",
                self.topic,
                self.queue_id,
                lo,
                commitlog_min,
            )
            self.min_offset = lo
        return lo

    def destroy(self) -> None:
        """Close the queue and delete its files and directory (``ConsumeQueue.destroy``)."""
        self._pending.clear()
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- reading ------------------------------------------------------------------------
    def _read_unit(self, byte_offset: int) -> CQUnit | None:
        if byte_offset >= self._readable_end():
            return None
        cq_file = self._file_for(byte_offset, create=False)
        if cq_file is None or byte_offset < 0:
            return None
        data = os.pread(cq_file.fd, CQ_UNIT_SIZE, byte_offset - cq_file.start)
        if len(data) < CQ_UNIT_SIZE:
            return None
        return CQUnit(*_UNIT.unpack(data))

    def get(self, queue_offset: int) -> CQUnit | None:
        """The unit at ``queue_offset``, None outside ``[0, max_offset)`` or not on disk yet."""
        if not 0 <= queue_offset < self.max_offset:
            return None
        return self._read_unit(queue_offset * CQ_UNIT_SIZE)

    def _readable_end(self) -> int:
        """Where the units on disk end: pending units are written first if the disk lets
        them; if it does not (ENOSPC), readers see only what is there and the dispatcher,
        which owns the failure, retries the write."""
        if self._pending:
            try:
                self.write_pending()
            except OSError as exc:
                log.debug(
                    "consume queue %s/%d: pending units not written: %s",
                    self.topic,
                    self.queue_id,
                    exc,
                )
        return self._end - len(self._pending)

    def read(self, queue_offset: int, max_units: int) -> list[CQUnit]:
        """Up to ``max_units`` units from ``queue_offset`` (not crossing a file)."""
        if not 0 <= queue_offset < self.max_offset or max_units <= 0:
            return []
        readable = self._readable_end()
        begin = queue_offset * CQ_UNIT_SIZE
        cq_file = self._file_for(begin, create=False)
        if cq_file is None or begin >= readable:
            return []
        end = min(readable, cq_file.start + self.file_size, begin + max_units * CQ_UNIT_SIZE)
        data = os.pread(cq_file.fd, end - begin, begin - cq_file.start)
        return [CQUnit(*_UNIT.unpack_from(data, p)) for p in range(0, len(data), CQ_UNIT_SIZE)]

    def flush(self) -> None:
        for fd in self.dirty_handles():
            os.fdatasync(fd)

    def dirty_handles(self) -> list[int]:
        """File descriptors written since the last call, for a worker thread to fsync."""
        self.write_pending()
        fds = [f.fd for f in self._files if f.dirty]
        for cq_file in self._files:
            cq_file.dirty = False
        return fds

    def close(self) -> None:
        if self._files or self._pending:
            try:
                self.write_pending()
            except OSError as exc:
                # Not lost: the dispatch checkpoint was never moved past them, so the next
                # start dispatches these messages again.
                log.error(
                    "consume queue %s/%d closed with %d units unwritten: %s",
                    self.topic,
                    self.queue_id,
                    len(self._pending) // CQ_UNIT_SIZE,
                    exc,
                )
        for cq_file in self._files:
            os.close(cq_file.fd)
        self._files.clear()


class ConsumeQueueStore:
    """Every consume queue under ``<root>/consumequeue`` (``consumeQueueTable``)."""

    def __init__(self, root: Path, *, file_size: int = DEFAULT_CQ_FILE_SIZE) -> None:
        self.directory = root / "consumequeue"
        self.file_size = file_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}

    def load(self) -> None:
        """Open every queue found on disk (``loadConsumeQueue`` + ``recoverConsumeQueue``)."""
        if not self.directory.is_dir():
            return
        for topic_dir in sorted(self.directory.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.is_dir() or not queue_dir.name.isdigit():
                    log.warning("ignoring %s: not a consume queue directory", queue_dir)
                    continue
                queue = ConsumeQueue(queue_dir, topic_dir.name, int(queue_dir.name), self.file_size)
                queue.load()
                self._queues[(topic_dir.name, int(queue_dir.name))] = queue

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """``findConsumeQueue``: files appear only when the first unit is written."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            directory = self.directory / topic / str(queue_id)
            queue = ConsumeQueue(directory, topic, queue_id, self.file_size)
            self._queues[(topic, queue_id)] = queue
        return queue

    def remove_topic(self, topic: str) -> int:
        """Close and delete every queue of ``topic`` (``cleanUnusedTopic`` for a deleted
        topic); returns how many queues there were."""
        keys = [key for key in self._queues if key[0] == topic]
        for key in keys:
            self._queues.pop(key).close()
        shutil.rmtree(self.directory / topic, ignore_errors=True)
        return len(keys)

    def destroy(self, topic: str, queue_id: int) -> bool:
        """Close and delete one queue (``cleanExpiredConsumerQueue``), and its topic's
        directory once it holds no queue; False if there was no such queue."""
        queue = self._queues.pop((topic, queue_id), None)
        if queue is None:
            return False
        queue.destroy()
        if not any(t == topic for t, _ in self._queues):
            shutil.rmtree(self.directory / topic, ignore_errors=True)
        return True

    def ends(self) -> dict[tuple[str, int], int]:
        """Each queue's max offset (the next unit's), by ``(topic, queue id)``."""
        return {key: queue.max_offset for key, queue in self._queues.items()}

    def queue_ids(self, topic: str) -> list[int]:
        """The queue ids of ``topic`` that have a consume queue here."""
        return sorted(q for t, q in self._queues if t == topic)

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def max_physical_offset(self) -> int:
        """The furthest commit log end any queue points at (-1 with no units)."""
        return max((q.max_physical_offset for q in self._queues.values()), default=-1)

    def truncate_dirty(self, commitlog_end: int) -> int:
        """Drop units past the commit log's end in every queue (after its recovery)."""
        return sum(q.truncate_dirty(commitlog_end) for q in self._queues.values())

    def flush(self) -> None:
        for queue in list(self._queues.values()):
            queue.flush()

    def dirty_handles(self) -> list[int]:
        return [fd for queue in list(self._queues.values()) for fd in queue.dirty_handles()]

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()
