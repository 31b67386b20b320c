"""Byte buffering for the two receive sides, kept apart from the logical state (STYLE §5).

Both buffers cost O(bytes received): data is appended to a ``bytearray`` and consumed from a
moving start index; the consumed prefix is dropped only once it is at least half the buffer,
so a stream of small frames is not copied over and over.
"""

from __future__ import annotations

from trioha.proto._frames import REPORT_SIZE


class ReceiveBuffer:
    """Bytes received and not yet consumed (the slave's ``byteBufferRead``)."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._start = 0

    def __len__(self) -> int:
        return len(self._data) - self._start

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._start and self._start * 2 >= len(self._data):
            del self._data[: self._start]
            self._start = 0
        self._data += data

    def peek(self, n: int) -> bytes:
        """A copy of the first *n* unconsumed bytes, not consumed (the caller checks ``len``).

        A copy, not a view: a live view would pin the ``bytearray`` and make the next
        ``feed`` or ``clear`` fail; *n* is a header's 12 bytes.
        """
        return bytes(self._data[self._start : self._start + n])

    def take(self, n: int) -> bytes:
        """Consume and return the first *n* bytes as an independent copy."""
        out = bytes(self._data[self._start : self._start + n])
        self._start += n
        return out

    def skip(self, n: int) -> None:
        self._start += n

    def clear(self) -> None:
        self._data.clear()
        self._start = 0


class ReportWords:
    """The master's read side: only the last complete 8-byte word of what has arrived counts.

    Mirrors ``HAConnection.ReadSocketService.processReadEvent`` (spec §1.4): reports are always
    8 bytes, the Java buffer is a multiple of 8, and after each read only the newest complete
    word is taken; earlier complete words are ignored and a trailing partial word waits. Keeping
    at most 7 bytes between reads gives the same answer with O(1) memory.
    """

    def __init__(self) -> None:
        self._tail = b""

    @property
    def pending(self) -> int:
        """Bytes of an incomplete report waiting for the rest."""
        return len(self._tail)

    def feed(self, data: bytes | bytearray | memoryview) -> bytes | None:
        """Add *data*; return the newest complete word if this read completed one."""
        buf = self._tail + bytes(data)
        complete = len(buf) - len(buf) % REPORT_SIZE
        self._tail = buf[complete:]
        if complete == 0:
            return None
        return buf[complete - REPORT_SIZE : complete]

    def clear(self) -> None:
        self._tail = b""
