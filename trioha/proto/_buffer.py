"""Byte buffering for the two receive sides, kept apart from the logical state.

The protocol state in ``_state.py`` stays small and hashable (what ``model/`` explores); the
bytes in flight live here.

Both buffers cost O(bytes received). The slave's keeps the chunks it was fed as they are and
copies each byte out at most once: a frame body comes back as one slice of the chunk holding it
(or the chunk itself when they coincide), and only a body split across reads is joined. At
hundreds of MiB/s every extra pass over the bytes shows: appending to one ``bytearray`` and
slicing it copied each body three times.
"""

from __future__ import annotations

from collections import deque

from trioha.proto._frames import REPORT_SIZE


class ReceiveBuffer:
    """Bytes received and not yet consumed (the slave's ``byteBufferRead``)."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._start = 0  # bytes of the first chunk already consumed
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        # A caller may reuse a bytearray or the memory under a view: keep only bytes.
        chunk = data if isinstance(data, bytes) else bytes(data)
        if chunk:
            self._chunks.append(chunk)
            self._len += len(chunk)

    def peek(self, n: int) -> bytes:
        """A copy of the first *n* unconsumed bytes, not consumed (the caller checks ``len``).

        Always bytes, never a view, so nothing received stays pinned; *n* is a header's 12.
        """
        return self._copy(n, consume=False)

    def take(self, n: int) -> bytes:
        """Consume and return the first *n* bytes as an independent copy."""
        return self._copy(n, consume=True)

    def skip(self, n: int) -> None:
        self._advance(n)

    def clear(self) -> None:
        self._chunks.clear()
        self._start = 0
        self._len = 0

    def _copy(self, n: int, *, consume: bool) -> bytes:
        first = self._chunks[0] if self._chunks else b""
        start = self._start
        if start + n <= len(first):
            out = first if start == 0 and n == len(first) else first[start : start + n]
        else:
            parts: list[memoryview] = []
            need, offset = n, start
            for chunk in self._chunks:
                piece = memoryview(chunk)[offset : offset + need]
                parts.append(piece)
                need -= len(piece)
                offset = 0
                if not need:
                    break
            out = b"".join(parts)
            for piece in parts:
                piece.release()
        if consume:
            self._advance(n)
        return out

    def _advance(self, n: int) -> None:
        self._len -= n
        start = self._start + n
        chunks = self._chunks
        while chunks and start >= len(chunks[0]):
            start -= len(chunks.popleft())
        self._start = start if chunks else 0


class ReportWords:
    """The master's read side: only the last complete 8-byte word of what has arrived counts.

    Mirrors ``HAConnection.ReadSocketService.processReadEvent`` (docs/rocketmq-protocol.md §1.4):
    reports are always 8 bytes, the Java buffer is a multiple of 8, and after each read only the
    newest complete word is taken; earlier complete words are ignored and a trailing partial word
    waits. Keeping at most 7 bytes between reads gives the same answer with O(1) memory.
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
