"""Walking stored records: the loop recovery, reput, HA serving and queue counting share.

:class:`RecordScan` mirrors ``CommitLog.checkMessageAndReturnSize`` called in a loop across
segments; :class:`PageBudget` keeps what a long walk maps from growing the process's RSS.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from trioha.store._contract import SegmentLike
from trioha.store._message import (
    DecodedBlank,
    DecodedIncomplete,
    DecodedInvalid,
    ReadableBuffer,
    RecordLayout,
    _decode_topic,
    parse_before_hole,
    parse_record,
)

RecordEvent = tuple[ReadableBuffer, int, int, RecordLayout]  # buffer, pos, segment start, layout

DROP_PAGES_EVERY: Final = 16 << 20
"""Bytes read through segment mappings between two ``drop_pages``: what reading adds to RSS."""


class PageBudget:
    """Give back mapped pages every :data:`DROP_PAGES_EVERY` bytes read through them.

    A reader streaming the log (a slave's consume-queue builder, the master's HA writer, a
    recovery scan) would otherwise grow the process's RSS to the size of the log: the pages are
    the kernel's page cache and cost nothing to drop, but they count as ours while mapped.
    Counting is best effort when several threads read (a lost count only delays a drop).
    """

    __slots__ = ("_read", "_touched")

    def __init__(self) -> None:
        self._read = 0
        self._touched: set[SegmentLike] = set()

    def note(self, segment: SegmentLike, nbytes: int) -> None:
        self._touched.add(segment)
        self._read += nbytes
        if self._read >= DROP_PAGES_EVERY:
            self._read = 0
            touched = list(self._touched)  # one step under the GIL, unlike iterating the set
            self._touched.clear()
            for seg in touched:
                seg.drop_pages()


class RecordScan:
    """Walk records from an offset across segments (``checkMessageAndReturnSize`` loop).

    Iterating yields ``(buffer, pos, segment_start, layout)`` for each valid message; blank
    records move to the next segment. When iteration ends, ``end`` is the offset where the
    walk stopped (just after the last good record, or a segment end after a blank) and
    ``problem`` says why it stopped early (``None``: it reached the written end).
    ``check_crc_from`` turns CRC checks on for segments starting at or after that offset.
    """

    __slots__ = (
        "check_crc_from",
        "end",
        "on_segment",
        "pages",
        "problem",
        "segment_size",
        "segments",
        "start",
    )

    def __init__(
        self,
        segments: Sequence[SegmentLike],
        start: int,
        segment_size: int,
        *,
        check_crc_from: int = 0,
        pages: PageBudget | None = None,
        on_segment: Callable[[int, int], None] | None = None,
    ) -> None:
        self.segments = segments
        #: Told ``(segments scanned, segments to scan)`` as each segment is done (progress).
        self.on_segment = on_segment
        self.pages = pages if pages is not None else PageBudget()
        self.start = start
        self.segment_size = segment_size
        self.check_crc_from = check_crc_from
        self.end = start
        self.problem: DecodedIncomplete | DecodedInvalid | None = None

    def __iter__(self) -> Iterator[RecordEvent]:
        segments = self.segments
        size = self.segment_size
        offset = self.start
        starts = [s.start for s in segments]
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            return
        first = i
        while i < len(segments):
            seg = segments[i]
            buf = seg.buffer()
            base = seg.start
            pos = offset - base
            end = seg.wrote
            backed = seg.backed
            check_crc = base >= self.check_crc_from
            noted = pos
            while pos < end:
                if end <= backed:  # (the common case: the hole check costs a call per record)
                    r = parse_record(buf, pos, end, check_crc, base)
                else:
                    r = parse_before_hole(buf, pos, end, backed, check_crc, base)
                if type(r) is RecordLayout:
                    yield buf, pos, base, r
                    pos += r.fields[0]
                    self.end = base + pos
                    if pos - noted >= DROP_PAGES_EVERY:
                        self.pages.note(seg, pos - noted)
                        noted = pos
                elif type(r) is DecodedBlank:
                    pos = size
                    break
                else:
                    self.end = base + pos
                    self.problem = r  # type: ignore[assignment]
                    self.pages.note(seg, pos - noted)
                    if self.on_segment is not None:  # the end of the log: the scan is done
                        self.on_segment(len(segments) - first, len(segments) - first)
                    return
            self.pages.note(seg, min(pos, end) - noted)
            offset = base + max(pos, end)
            self.end = offset
            i += 1
            if self.on_segment is not None:
                self.on_segment(i - first, len(segments) - first)


class QueueOffsets:
    """Next queue offset per (topic, queue id), rebuilt by scanning (no ConsumeQueue yet).

    ``cursor`` is the physical offset up to which records have been counted; replicated
    bytes are counted lazily (only a promoted slave appends and needs them).
    """

    __slots__ = ("cursor", "last_store_timestamp", "next")

    def __init__(self, cursor: int) -> None:
        self.next: dict[tuple[str, int], int] = {}
        self.cursor = cursor
        self.last_store_timestamp = 0

    def count(self, scan: RecordScan) -> int:
        """Count every record ``scan`` yields; returns how many."""
        nxt = self.next
        n = 0
        ts = self.last_store_timestamp
        for buf, _pos, _base, layout in scan:
            f = layout.fields
            nxt[(_decode_topic(bytes(buf[layout.topic_start : layout.topic_end])), f[3])] = f[5] + 1
            ts = f[11]
            n += 1
        self.last_store_timestamp = ts
        self.cursor = scan.end
        return n
