"""RocketMQ's message index: ``IndexService`` over ``IndexFile``s in ``<root>/index/``.

It answers "which messages of topic T carry key K" (``QUERY_MESSAGE``, ``queryMsgByKey``,
``queryMsgByUniqueKey``). Each file is a fixed-size hash table with chained entries, written
in place through a shared memory mapping, byte for byte as RocketMQ 4.9 writes it
(``IndexFile``, ``IndexHeader``)::

    header   40 bytes  beginTimestamp i64, endTimestamp i64, beginPhyOffset i64,
                       endPhyOffset i64, hashSlotCount i32 (slots in use), indexCount i32
    slots    4 bytes × maxHashSlotNum: the newest entry number of each slot, 0 = empty
    entries  20 bytes × maxIndexNum: keyHash i32, commit log offset i64,
                       timeDiff i32 (seconds since beginTimestamp), previous entry i32

Entry 0 is never used, so ``indexCount`` (the next entry number) starts at 1. The indexed
string is ``topic + "#" + key``; its hash is Java's ``String.hashCode`` made non-negative, and
only the hash is stored: a lookup can return messages of colliding keys, which clients filter
out. Files are named by their creation time (``yyyyMMddHHmmssSSS``, local time) and created
sparse: a default file is 420,000,040 bytes but only the pages touched take space. A full
file is flushed when the next one is created.

Recovery: the broker's dispatcher re-indexes from its checkpoint; entries below a file's
``endPhyOffset`` are skipped (``buildIndex``), so re-dispatching is harmless. A file that may
hold entries not flushed before a crash (its end is past what the last flush covered) is
dropped at load, as RocketMQ drops files newer than the checkpoint's ``indexMsgTimestamp``.
Entries of messages the commit log no longer holds (a tail lost in a power cut, a replica cut
back) are removed newest first (:meth:`IndexService.cut_tail`, :meth:`IndexService.truncate`),
each slot given back the entry it held before, so that the messages later stored at those
offsets are indexed and no lookup returns a message that is gone.

Space: a page of a sparse file written through a mapping is allocated when it is first
written, and when the filesystem is full that write is a SIGBUS that kills the process (the
filesystem cannot refuse a store instruction the way it refuses a ``write``). So no page is
ever written, or read, through the mapping before its space is reserved with
``posix_fallocate``: the header and every slot page a batch touches, and the entries ahead of
the last one in steps of :data:`ENTRY_RESERVE_STEP`. A refusal (ENOSPC) comes back as the
``OSError`` of any full-disk write, before anything of the batch is written; the service keeps
the batch's keys and writes them with the next batch (the dispatcher retries, see
``trioha.broker._reput``). A file takes the space of the pages its keys touch, as before,
until it holds :data:`FULL_SLOTS_AFTER` of an entry per slot; then its whole slot table is
reserved at once (most of it is touched by then). Lookups read the slot of a page not
reserved yet with ``pread``.
"""

from __future__ import annotations

import datetime
import logging
import mmap
import operator
import os
import struct
from collections.abc import Callable, Iterable
from itertools import islice, repeat
from pathlib import Path
from typing import Final

import attrs

from trioha.store._consumequeue import (
    _EXTENSIONS,
    extension_weights,
    java_string_hash,
    java_string_hash_extend,
)

__all__ = [
    "DEFAULT_MAX_HASH_SLOT_NUM",
    "DEFAULT_MAX_INDEX_NUM",
    "DEFAULT_MAX_MSGS_NUM_BATCH",
    "IndexFile",
    "IndexService",
    "QueryOffsetResult",
    "index_key_hash",
]

log = logging.getLogger("trioha.store.index")

DEFAULT_MAX_HASH_SLOT_NUM: Final = 5_000_000
"""``MessageStoreConfig.maxHashSlotNum``."""
DEFAULT_MAX_INDEX_NUM: Final = 20_000_000
"""``MessageStoreConfig.maxIndexNum``."""
DEFAULT_MAX_MSGS_NUM_BATCH: Final = 64
"""``MessageStoreConfig.maxMsgsNumBatch``: the most offsets one lookup returns."""

HEADER_SIZE: Final = 40
SLOT_SIZE: Final = 4
ENTRY_SIZE: Final = 20
_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_INT_MAX = 2**31 - 1
_MAX_CACHED_TOPICS = 100_000
_PAGE = mmap.PAGESIZE
_PAGE_SHIFT = _PAGE.bit_length() - 1  # a power of two
_first = operator.itemgetter(0)
_FOURS, _HEADERS, _PAGE_SHIFTS = repeat(SLOT_SIZE), repeat(HEADER_SIZE), repeat(_PAGE_SHIFT)
ENTRY_RESERVE_STEP: Final = 256 * 1024
"""Bytes of entries reserved ahead at a time (13,107 entries): one ``posix_fallocate`` per
step, none for the batches in between."""
FULL_SLOTS_AFTER: Final = 1 / 64
"""Entries per slot after which a file's whole slot table is reserved: tracking the pages
keys touch costs a few hundred instructions per key, and by then most are touched."""


def index_key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: ``abs(key.hashCode())``, with ``abs(MIN)`` as 0."""
    h = abs(java_string_hash(key))
    return 0 if h > _INT_MAX else h


def index_key(topic: str, key: str) -> str:
    """``IndexService.buildKey``."""
    return f"{topic}#{key}"


def file_name_for(ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: local time as ``yyyyMMddHHmmssSSS``."""
    stamp = datetime.datetime.fromtimestamp(ms / 1000)
    return stamp.strftime("%Y%m%d%H%M%S") + f"{ms % 1000:03d}"


class IndexFile:
    """One index file, mapped read-write; see the module docstring for the layout and for
    how space is reserved before the mapping writes it."""

    def __init__(
        self,
        path: Path,
        *,
        slots: int,
        max_index: int,
        end_phy_offset: int = 0,
        end_timestamp: int = 0,
    ) -> None:
        if slots <= 0 or max_index <= 1:
            raise ValueError(f"index sizes must be positive: {slots} slots, {max_index} entries")
        self.path = path
        self.slots = slots
        self.max_index = max_index
        self.size = HEADER_SIZE + SLOT_SIZE * slots + ENTRY_SIZE * max_index
        self._entries_at = HEADER_SIZE + SLOT_SIZE * slots
        new = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < self.size:
                os.ftruncate(fd, self.size)  # sparse: untouched pages take no space
            # Read, not mapped: the header page may be a hole (a crash before its first write).
            header: tuple[int, int, int, int, int, int] = _HEADER.unpack(
                os.pread(fd, HEADER_SIZE, 0).ljust(HEADER_SIZE, b"\0")
            )
            self._map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            if new:
                path.unlink(missing_ok=True)
            raise
        self._fd = fd
        #: One byte per page of header and slots: 1 once its space is reserved.
        self._reserved = bytearray(-(-self._entries_at // _PAGE))
        self._unreserved = len(self._reserved)
        self.begin_timestamp: int = header[0]
        self.end_timestamp: int = header[1]
        self.begin_phy_offset: int = header[2]
        self.end_phy_offset: int = header[3]
        self.hash_slot_count: int = header[4]
        self.index_count: int = max(header[5], 1)  # IndexHeader.load: a value <= 0 reads as 1
        #: Entries are reserved up to here (page-aligned; those below the count were written).
        self._entries_reserved = self._entry_at(self.index_count) // _PAGE * _PAGE
        if new:
            # IndexFile's constructor: a new file continues where the previous one ended.
            if end_phy_offset > 0:
                self.begin_phy_offset = self.end_phy_offset = end_phy_offset
            if end_timestamp > 0:
                self.begin_timestamp = self.end_timestamp = end_timestamp
            try:
                self._reserve_pages({0})
                self._write_header()
            except BaseException:
                self.destroy()
                raise

    def _entry_at(self, entry: int) -> int:
        return self._entries_at + ENTRY_SIZE * entry

    def _reserve_pages(self, missing: set[int]) -> None:
        """Reserve the header/slot pages ``missing`` (consecutive ones in one call); raises
        the ``OSError`` of a full disk before any is marked."""
        pages = sorted(missing)
        run_start = 0
        for i, page in enumerate(pages):
            if i == 0 or page != pages[i - 1] + 1:
                run_start = page
            if i + 1 == len(pages) or pages[i + 1] != page + 1:
                # Never past the file's end: posix_fallocate would make the file longer.
                end = min(self.size, (page + 1) * _PAGE)
                os.posix_fallocate(self._fd, run_start * _PAGE, end - run_start * _PAGE)
        reserved = self._reserved
        for page in pages:
            reserved[page] = 1
        self._unreserved -= len(pages)

    def _reserve_for(self, hashes: Iterable[int], entries_end: int) -> None:
        """Reserve what writing entries up to ``entries_end`` (an entry number) with these
        key hashes touches: the header page, the hashes' slot pages, the entries."""
        if self._unreserved:
            self._reserve_slots(hashes)
        self._reserve_entries(entries_end)

    def _reserve_slots(self, hashes: Iterable[int]) -> None:
        """The header page and the slot pages of these key hashes (computed by C iterators:
        this runs for every key until the slots are reserved). A file in steady use touches
        most of them: once it holds :data:`FULL_SLOTS_AFTER` of an entry per slot, or seven
        eighths of the pages are reserved, the rest go at once, and nobody calls this any
        more (a file of the default sizes after 78,125 entries: 20 MB of slots)."""
        reserved = self._reserved
        pages = set(
            map(
                operator.rshift,
                map(
                    operator.add,
                    map(operator.mul, map(operator.mod, hashes, repeat(self.slots)), _FOURS),
                    _HEADERS,
                ),
                _PAGE_SHIFTS,
            )
        )
        pages.add(0)
        missing = {page for page in pages if not reserved[page]}
        if (
            self.index_count >= self.slots * FULL_SLOTS_AFTER
            or self._unreserved - len(missing) <= len(reserved) // 8
        ):
            missing = {page for page, done in enumerate(reserved) if not done}
        if missing:
            self._reserve_pages(missing)

    def _reserve_entries(self, entries_end: int) -> None:
        """The entries up to ``entries_end`` (an entry number), a step ahead."""
        end = self._entry_at(entries_end)
        if end > self._entries_reserved:
            upto = min(self.size, end + ENTRY_RESERVE_STEP)
            os.posix_fallocate(self._fd, self._entries_reserved, upto - self._entries_reserved)
            self._entries_reserved = upto

    def _read_slot(self, slot_at: int) -> int:
        """A slot's value; read with ``pread`` while its page is not reserved (a hole there
        read through the mapping could fault on a full filesystem)."""
        if self._reserved[slot_at // _PAGE]:
            value: int = _SLOT.unpack_from(self._map, slot_at)[0]
            return value
        data = os.pread(self._fd, SLOT_SIZE, slot_at)
        return int(_SLOT.unpack(data)[0]) if len(data) == SLOT_SIZE else 0

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._map,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    @property
    def is_full(self) -> bool:
        """``isWriteFull``."""
        return self.index_count >= self.max_index

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """``IndexFile.putKey``; False when the file is full."""
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """:meth:`put_key` with the key's :func:`index_key_hash` already computed."""
        if self.index_count >= self.max_index:
            return False
        self._reserve_for((key_hash,), self.index_count + 1)
        slot_at = HEADER_SIZE + (key_hash % self.slots) * SLOT_SIZE
        previous = _SLOT.unpack_from(self._map, slot_at)[0]
        if previous <= 0 or previous > self.index_count:
            previous = 0
        if self.begin_timestamp <= 0:
            time_diff = 0
        else:
            # Seconds, clamped to [0, Integer.MAX_VALUE] (a negative difference counts as 0).
            time_diff = min(max((store_timestamp - self.begin_timestamp) // 1000, 0), _INT_MAX)
        entry = self.index_count
        _ENTRY.pack_into(
            self._map,
            HEADER_SIZE + SLOT_SIZE * self.slots + ENTRY_SIZE * entry,
            key_hash,
            phy_offset,
            time_diff,
            previous,
        )
        _SLOT.pack_into(self._map, slot_at, entry)
        if self.index_count <= 1:
            self.begin_phy_offset = phy_offset
            self.begin_timestamp = store_timestamp
        if previous == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_phy_offset = phy_offset
        self.end_timestamp = store_timestamp
        self._write_header()
        return True

    def put_hashes(self, entries: list[tuple[int, int, int]], start: int) -> int:
        """:meth:`put_hash` for ``entries[start:]`` (key hash, offset, store time) until the
        file is full; returns how many were put. The header is written once, at the end:
        the bytes are those of as many :meth:`put_hash` calls (the dispatcher's batch).

        Raises the ``OSError`` of a full disk when the space cannot be reserved, before any
        of the entries is written."""
        slots, max_index = self.slots, self.max_index
        entries_at = HEADER_SIZE + SLOT_SIZE * slots
        mapped = self._map
        slot_unpack, slot_pack, entry_pack = _SLOT.unpack_from, _SLOT.pack_into, _ENTRY.pack_into
        count, used = self.index_count, self.hash_slot_count
        begin_ts, begin_phy = self.begin_timestamp, self.begin_phy_offset
        end_ts, end_phy = self.end_timestamp, self.end_phy_offset
        stop = min(len(entries), start + max(0, max_index - count))
        if stop > start:
            if self._unreserved:
                self._reserve_slots(map(_first, islice(entries, start, stop)))
            self._reserve_entries(count + stop - start)
        for key_hash, phy_offset, store_timestamp in entries[start:stop]:
            slot_at = HEADER_SIZE + (key_hash % slots) * SLOT_SIZE
            previous = slot_unpack(mapped, slot_at)[0]
            if previous <= 0 or previous > count:
                previous = 0
            time_diff = (store_timestamp - begin_ts) // 1000 if begin_ts > 0 else 0
            if time_diff < 0:  # clamped as in put_hash
                time_diff = 0
            elif time_diff > _INT_MAX:
                time_diff = _INT_MAX
            entry_pack(
                mapped, entries_at + ENTRY_SIZE * count, key_hash, phy_offset, time_diff, previous
            )
            slot_pack(mapped, slot_at, count)
            if count <= 1:
                begin_phy, begin_ts = phy_offset, store_timestamp
            if previous == 0:
                used += 1
            count += 1
            end_phy, end_ts = phy_offset, store_timestamp
        if stop > start:
            self.index_count, self.hash_slot_count = count, used
            self.begin_timestamp, self.begin_phy_offset = begin_ts, begin_phy
            self.end_timestamp, self.end_phy_offset = end_ts, end_phy
            self._write_header()
        return stop - start

    def is_time_matched(self, begin: int, end: int) -> bool:
        """``isTimeMatched``: whether [begin, end] overlaps this file's time range."""
        return (
            (begin < self.begin_timestamp and end > self.end_timestamp)
            or self.begin_timestamp <= begin <= self.end_timestamp
            or self.begin_timestamp <= end <= self.end_timestamp
        )

    def select_phy_offsets(
        self, key: str, max_num: int, begin: int, end: int, into: list[int]
    ) -> None:
        """``selectPhyOffset``: walk the key's chain, newest first, collecting offsets."""
        key_hash = index_key_hash(key)
        slot_at = HEADER_SIZE + (key_hash % self.slots) * SLOT_SIZE
        entry = self._read_slot(slot_at)
        if entry <= 0 or entry > self.index_count or self.index_count <= 1:
            return
        entries_at = HEADER_SIZE + SLOT_SIZE * self.slots
        for _ in range(self.index_count):  # a chain never has more links than entries
            if len(into) >= max_num:
                return
            hash_read, offset, time_diff, previous = _ENTRY.unpack_from(
                self._map, entries_at + ENTRY_SIZE * entry
            )
            if time_diff < 0:
                return
            time_read = self.begin_timestamp + time_diff * 1000
            if hash_read == key_hash and begin <= time_read <= end:
                into.append(offset)
            if previous <= 0 or previous > self.index_count or previous == entry:
                return
            if time_read < begin:
                return
            entry = previous

    def entry_offset(self, entry: int) -> int:
        """The commit log offset entry number ``entry`` (below the count) points at."""
        offset: int = _ENTRY.unpack_from(self._map, self._entry_at(entry))[1]
        return offset

    def cut_to(self, count: int) -> int:
        """Remove the entries numbered ``count`` and up, newest first; returns how many.

        Each removed entry gives its slot back the entry it had replaced there (its link),
        so the file reads as it did before they were put. The header's end becomes that of
        the newest entry left, its time to the second (entries keep no milliseconds).
        """
        count = max(count, 1)
        n = self.index_count
        if count >= n:
            return 0
        entries_at, slots, mapped = self._entries_at, self.slots, self._map
        # Pages written before, hence allocated; reserved anyway, as every write here is.
        hashes = [
            _ENTRY.unpack_from(mapped, entries_at + ENTRY_SIZE * e)[0] for e in range(count, n)
        ]
        self._reserve_for(hashes, n)
        for entry in range(n - 1, count - 1, -1):
            key_hash, _, _, previous = _ENTRY.unpack_from(mapped, entries_at + ENTRY_SIZE * entry)
            slot_at = HEADER_SIZE + (key_hash % slots) * SLOT_SIZE
            if _SLOT.unpack_from(mapped, slot_at)[0] == entry:
                restored = previous if 0 < previous < entry else 0
                _SLOT.pack_into(mapped, slot_at, restored)
                if restored == 0 and self.hash_slot_count > 0:
                    self.hash_slot_count -= 1
            _ENTRY.pack_into(mapped, entries_at + ENTRY_SIZE * entry, 0, 0, 0, 0)
        self.index_count = count
        if count > 1:
            _, phy, time_diff, _ = _ENTRY.unpack_from(mapped, entries_at + ENTRY_SIZE * (count - 1))
            self.end_phy_offset = phy
            self.end_timestamp = self.begin_timestamp + time_diff * 1000
        else:
            self.end_phy_offset, self.end_timestamp = self.begin_phy_offset, self.begin_timestamp
        self._write_header()
        self.flush()
        return n - count

    def flush(self) -> None:
        self._map.flush()

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


@attrs.frozen
class QueryOffsetResult:
    """``QueryOffsetResult``: offsets found, and where the newest file ends."""

    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


@attrs.frozen
class IndexedMessage:
    """What the dispatcher hands the index for one message (``DispatchRequest``'s part)."""

    topic: str
    phy_offset: int
    store_timestamp: int
    uniq_key: str | None
    keys: str | None


class IndexService:
    """``IndexService``: the files of ``<root>/index``, oldest first."""

    def __init__(
        self,
        root: Path,
        *,
        slots: int = DEFAULT_MAX_HASH_SLOT_NUM,
        max_index: int = DEFAULT_MAX_INDEX_NUM,
        max_msgs_num_batch: int = DEFAULT_MAX_MSGS_NUM_BATCH,
    ) -> None:
        self.directory = root / "index"
        self.slots = slots
        self.max_index = max_index
        self.max_msgs_num_batch = max_msgs_num_batch
        self.files: list[IndexFile] = []
        #: Unsigned ``hashCode`` of ``topic + "#"``, per topic.
        self._prefix_hashes: dict[str, int] = {}
        #: Entries (key hash, offset, store time) a full disk refused, written first next time.
        self._pending: list[tuple[int, int, int]] = []

    # --- start and stop ---------------------------------------------------------------------
    def load(self, *, flushed_up_to: int | None) -> None:
        """Map the files (``IndexService.load``), dropping any that may hold entries the last
        flush did not cover: those whose end is past ``flushed_up_to`` (None: keep all)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in self.directory.iterdir() if p.is_file()):
            if not path.name.isdigit():
                log.warning("ignoring %s: not an index file name", path)
                continue
            index_file = IndexFile(path, slots=self.slots, max_index=self.max_index)
            if flushed_up_to is not None and index_file.end_phy_offset > flushed_up_to:
                log.warning(
                    "dropping index file %s: it ends at %d, past the last flush (%d)",
                    path,
                    index_file.end_phy_offset,
                    flushed_up_to,
                )
                index_file.destroy()
                continue
            self.files.append(index_file)
        log.info("message index: %d file(s) in %s", len(self.files), self.directory)

    @property
    def end_phy_offset(self) -> int:
        """Where indexing stands: the newest file's last indexed offset (0 without files)."""
        return self.files[-1].end_phy_offset if self.files else 0

    def flush(self) -> None:
        for index_file in self.files[-2:]:  # older ones were flushed when they filled up
            index_file.flush()

    def close(self) -> None:
        for index_file in self.files:
            index_file.close()
        self.files.clear()

    @property
    def pending(self) -> int:
        """Entries kept in memory because the disk refused them (written by the next build)."""
        return len(self._pending)

    def cut_tail(self, drop: Callable[[int], bool]) -> int:
        """Remove the newest entries whose commit log offset ``drop`` says is gone, newest
        first, stopping at the first one kept; returns how many were removed.

        A newest file left without entries goes too, as does an empty one whose end
        (inherited from the file before) is gone: the next file then continues from the
        file that is left, and what was removed is indexed again when dispatched again.
        """
        removed = 0
        self._pending = [e for e in self._pending if not drop(e[1])]
        while self.files:
            last = self.files[-1]
            keep = last.index_count
            while keep > 1 and drop(last.entry_offset(keep - 1)):
                keep -= 1
            cut = last.cut_to(keep)
            removed += cut
            if keep > 1 or not (cut or drop(last.end_phy_offset)):
                break
            self.files.pop().destroy()
            log.info("removed index file %s: none of its entries is left", last.path)
        return removed

    def truncate(self, offset: int) -> int:
        """Remove the entries of messages at or past commit log ``offset`` (a replica cut back
        there); returns how many."""
        removed = self.cut_tail(lambda phy: phy >= offset)
        if removed:
            log.info(
                "message index: %d entries at or past commit log offset %d removed", removed, offset
            )
        return removed

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """``deleteExpiredFile``: files wholly below the commit log's start, never the last."""
        removed = 0
        while len(self.files) > 1 and self.files[0].end_phy_offset < commitlog_min_offset:
            gone = self.files.pop(0)
            gone.destroy()
            removed += 1
            log.info(
                "deleted index file %s: its last entry (commit log offset %d) is below the "
                "log's start %d",
                gone.path.name,
                gone.end_phy_offset,
                commitlog_min_offset,
            )
        return removed

    # --- building ---------------------------------------------------------------------------
    def _writable(self, now_ms: int) -> IndexFile:
        """``getAndCreateLastIndexFile``: the newest file, or a new one after a full one."""
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full:
            return last
        if last is not None:
            last.flush()
        name = file_name_for(now_ms)
        while (self.directory / name).exists():  # two files within one millisecond
            now_ms += 1
            name = file_name_for(now_ms)
        self.directory.mkdir(parents=True, exist_ok=True)
        created = IndexFile(
            self.directory / name,
            slots=self.slots,
            max_index=self.max_index,
            end_phy_offset=last.end_phy_offset if last else 0,
            end_timestamp=last.end_timestamp if last else 0,
        )
        self.files.append(created)
        return created

    def _put(self, key_hash: int, phy_offset: int, store_timestamp: int, now_ms: int) -> None:
        # ``_writable`` never returns a full file, and only a full file refuses a key.
        self._writable(now_ms).put_hash(key_hash, phy_offset, store_timestamp)

    def _prefix_hash(self, topic: str) -> int:
        """The unsigned hash of ``topic#``, remembered for a bounded number of topics."""
        prefix = java_string_hash(topic + "#") & 0xFFFFFFFF
        if len(self._prefix_hashes) < _MAX_CACHED_TOPICS:
            self._prefix_hashes[topic] = prefix
        return prefix

    def _key_hash(self, topic: str, key: bytes) -> int:
        """:func:`index_key_hash` of ``topic#key``, the topic's part computed once."""
        if not key.isascii():
            return index_key_hash(index_key(topic, key.decode("utf-8", "replace")))
        prefix = self._prefix_hashes.get(topic)
        if prefix is None:
            prefix = self._prefix_hash(topic)
        h = java_string_hash_extend(prefix, key)
        if h >= 1 << 31:  # negative as an int: abs(), and abs(Integer.MIN_VALUE) counts as 0
            h = (1 << 32) - h if h != 1 << 31 else 0
        return h

    def build_raw(
        self,
        topic: str,
        phy_offset: int,
        store_timestamp: int,
        uniq_key: bytes | None,
        keys: bytes | None,
        *,
        now_ms: int,
    ) -> None:
        """``buildIndex`` from a record's raw ``UNIQ_KEY`` and ``KEYS`` values: the unique key,
        then each non-empty ``KEYS`` token (split on single spaces)."""
        last = self.files[-1] if self.files else None
        if last is not None and (
            phy_offset < last.end_phy_offset
            # RocketMQ indexes the message at endPhyOffset again after a restart; trioha
            # knows it is there when the file holds entries.
            or (phy_offset == last.end_phy_offset and last.index_count > 1)
        ):
            return  # indexed before this restart
        if uniq_key is not None:
            self._put(self._key_hash(topic, uniq_key), phy_offset, store_timestamp, now_ms)
        if keys:
            for key in keys.split(b" "):
                if key:
                    self._put(self._key_hash(topic, key), phy_offset, store_timestamp, now_ms)

    def build_batch(
        self,
        messages: Iterable[tuple[str, int, int, bytes | None, bytes | None]],
        *,
        now_ms: int,
    ) -> None:
        """:meth:`build_raw` for each of ``messages`` (topic, offset, store time, raw
        ``UNIQ_KEY``, raw ``KEYS``), in increasing offset order as the dispatcher reads them.

        The same entries, in the same order, as one :meth:`build_raw` per message: the keys
        are hashed first, then written with one header update per file touched.

        A full disk (the ``OSError`` raised) leaves the entries not written yet in memory;
        the next call writes them first and skips the messages they cover, so a dispatcher
        that hands the same messages again after a failure indexes each key exactly once.
        """
        last = self.files[-1] if self.files else None
        hashes = self._pending
        self._pending = []
        # build_raw's skip rule, followed as the entries would move the newest file's end.
        if hashes:
            floor, holds = hashes[-1][1], True
        else:
            floor = last.end_phy_offset if last is not None else -1
            holds = last is not None and last.index_count > 1
        add = hashes.append
        prefixes, extensions, mul = self._prefix_hashes, _EXTENSIONS, operator.mul
        for topic, phy_offset, stamp, uniq_key, keys in messages:
            if phy_offset < floor or (phy_offset == floor and holds):
                continue
            if uniq_key is None and not keys:
                continue
            if uniq_key == b"":  # indexed as it is, unlike an empty token of KEYS
                add((self._key_hash(topic, uniq_key), phy_offset, stamp))
                floor, holds = phy_offset, True
            prefix = prefixes.get(topic)
            if prefix is None:
                prefix = self._prefix_hash(topic)
            for key in (uniq_key, *keys.split(b" ")) if keys else (uniq_key,):
                if not key:  # no unique key, or an empty token (two spaces, say)
                    continue
                if key.isascii():  # _key_hash, inlined: it runs for every key
                    power, weights = extensions.get(len(key)) or extension_weights(len(key))
                    h = (prefix * power + sum(map(mul, key, weights))) & 0xFFFFFFFF
                    if h >= 1 << 31:
                        h = (1 << 32) - h if h != 1 << 31 else 0
                else:
                    h = self._key_hash(topic, key)
                add((h, phy_offset, stamp))
                floor, holds = phy_offset, True
        done = 0
        try:
            while done < len(hashes):
                done += self._writable(now_ms).put_hashes(hashes, done)
        except OSError:
            self._pending = hashes[done:]
            raise

    def build(self, message: IndexedMessage, now_ms: int) -> None:
        """:meth:`build_raw` for one message."""
        self.build_raw(
            message.topic,
            message.phy_offset,
            message.store_timestamp,
            message.uniq_key.encode() if message.uniq_key is not None else None,
            message.keys.encode() if message.keys else None,
            now_ms=now_ms,
        )

    def build_all(self, messages: Iterable[IndexedMessage], now_ms: int) -> None:
        for message in messages:
            self.build(message, now_ms)

    # --- lookup -----------------------------------------------------------------------------
    def query_offsets(
        self, topic: str, key: str, max_num: int, begin: int, end: int
    ) -> QueryOffsetResult:
        """``IndexService.queryOffset``: newest files first, at most ``maxMsgsNumBatch``."""
        max_num = min(max_num, self.max_msgs_num_batch)
        found: list[int] = []
        last_ts = last_offset = 0
        full_key = index_key(topic, key)
        for position in range(len(self.files) - 1, -1, -1):
            index_file = self.files[position]
            if position == len(self.files) - 1:
                last_ts, last_offset = index_file.end_timestamp, index_file.end_phy_offset
            if index_file.is_time_matched(begin, end):
                index_file.select_phy_offsets(full_key, max_num, begin, end, found)
            if index_file.begin_timestamp < begin or len(found) >= max_num:
                break
        return QueryOffsetResult(found, last_ts, last_offset)
