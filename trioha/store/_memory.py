"""An in-memory commit log: the file log's rules with segments held in ``bytearray``s.

A verified fake for fast protocol and broker tests: it passes the same contract tests as
:class:`~trioha.store.FileCommitLog`. Segments grow as they are written (a 1 GiB segment
costs only what it holds), ``flush`` is immediate, and what a truncate cuts is kept in
:attr:`MemoryCommitLog.set_aside`. :meth:`read` returns a copy, because a ``bytearray`` that
is still viewed cannot grow.
"""

from __future__ import annotations

from collections.abc import Callable

from trioha.store._contract import (
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_STORE_HOST,
    SetAside,
    system_clock_ms,
)
from trioha.store._logcore import LogCore
from trioha.store._message import HostAddress, PropertiesForm
from trioha.store._segment import DEFAULT_SEGMENT_SIZE, MIN_SEGMENT_SIZE

__all__ = ["MemoryCommitLog"]


class MemorySegment:
    """A segment whose written bytes live in a ``bytearray`` (unwritten bytes read as 0)."""

    __slots__ = (
        "_clock_ms",
        "backed",
        "data",
        "data_start",
        "flushed",
        "modified_ms",
        "size",
        "start",
        "wrote",
    )

    def __init__(
        self, start: int, size: int, clock_ms: Callable[[], int] = system_clock_ms
    ) -> None:
        self._clock_ms = clock_ms
        #: When the segment was last written (ms), as a file's mtime would say.
        self.modified_ms = clock_ms()
        self.start = start
        self.size = size
        self.wrote = 0
        self.flushed = 0
        self.data_start = 0
        self.backed = size  # unwritten bytes read as zeros here, whatever reads them
        self.data = bytearray()

    def buffer(self) -> bytearray:
        return self.data

    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        end = pos + len(memoryview(data).cast("B"))
        if len(self.data) < end:
            self.data.extend(bytes(end - len(self.data)))
        self.data[pos:end] = data
        self.modified_ms = self._clock_ms()

    def view(self, pos: int, end: int) -> bytes:
        chunk = bytes(self.data[pos:end])
        return chunk + bytes(end - pos - len(chunk))  # a closed segment's unwritten padding

    def drop_pages(self, pos: int = 0, end: int | None = None) -> None:
        """Nothing is mapped."""

    def zero(self, pos: int, end: int) -> None:
        end = min(end, len(self.data))
        if pos < end:
            self.data[pos:end] = bytes(end - pos)
            self.modified_ms = self._clock_ms()

    def close(self) -> None:
        pass


class MemoryCommitLog(LogCore[MemorySegment]):
    """A commit log in memory; see the module docstring."""

    def __init__(
        self,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        store_host: HostAddress = DEFAULT_STORE_HOST,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        properties_form: PropertiesForm = PropertiesForm.V4_9,
        clock_ms: Callable[[], int] = system_clock_ms,
        mtime_ms: Callable[[], int] = system_clock_ms,
    ) -> None:
        if segment_size < MIN_SEGMENT_SIZE:
            raise ValueError(f"segment_size {segment_size} is below {MIN_SEGMENT_SIZE}")
        super().__init__(
            segment_size=segment_size,
            store_host=store_host,
            max_message_size=max_message_size,
            properties_form=properties_form,
            clock_ms=clock_ms,
        )
        #: What a segment's "last modified" time is read from (a file's mtime is the
        #: kernel's clock, not the log's ``clock_ms`` that stamps messages).
        self._mtime_ms = mtime_ms
        self.kept_bytes: dict[str, bytes] = {}
        """The bytes behind each :attr:`set_aside` entry, by its ``where`` label."""

    def __repr__(self) -> str:
        return f"<MemoryCommitLog [{self.min_offset}, {self.max_offset})>"

    def _create_segment(self, start: int) -> MemorySegment:
        return MemorySegment(start, self._segment_size, self._mtime_ms)

    def _keep_aside(self, seg: MemorySegment, pos: int, end: int, reason: str) -> SetAside:
        data = seg.view(pos, end)
        label = f"memory:{seg.start + pos:020d}-{reason}"
        self.kept_bytes[label] = data
        return SetAside(seg.start + pos, len(data), reason, label)

    def _move_aside(self, seg: MemorySegment, reason: str) -> SetAside:
        label = f"memory:{seg.start:020d}-{reason}.segment"
        self.kept_bytes[label] = bytes(seg.data)
        return SetAside(seg.start, seg.wrote, reason, label)

    def _delete(self, seg: MemorySegment) -> None:
        seg.data = bytearray()

    def _record_start(self, offset: int | None) -> None:
        pass  # nothing outlives the object
