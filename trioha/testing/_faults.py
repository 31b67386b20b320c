"""A Trio stream that misbehaves the way networks do: short writes, odd reads, delays, death.

:class:`FaultyStream` wraps any :class:`trio.abc.HalfCloseableStream` (a memory stream from
:func:`trio.testing.memory_stream_pair` in trioha's tests) and, driven by a seeded
:class:`random.Random` so that a failing case replays exactly:

* cuts every ``send_all`` into pieces of 1..``max_write`` bytes, so the peer sees frames and
  reports arrive in parts (``send_all`` still sends everything or fails, as Trio requires);
* returns 1..``max_read`` bytes from each ``receive_some``;
* sleeps up to ``max_delay`` seconds before each piece and each read (virtual seconds under
  :class:`trio.testing.MockClock`);
* dies when its :class:`FaultyLink` breaks, by time or after a number of bytes, in one of three
  ways (:class:`Breakage`): a reset (both ends raise ``BrokenResourceError``), an orderly close
  (both ends read EOF) or a black hole (bytes vanish and nothing arrives, as when a cable is
  pulled: only a timeout can tell).

Apart from the faults it is a well-behaved Trio stream: it passes
:func:`trio.testing.check_half_closeable_stream` (trioha's tests run it), so a failure seen
through it is the code under test's, not the wrapper's.
"""

from __future__ import annotations

import enum
import math
import operator
import random

import attrs
import trio

__all__ = ["Breakage", "Faults", "FaultyLink", "FaultyStream", "faulty_stream_pair"]


@attrs.frozen
class Faults:
    """How one direction of a connection misbehaves (all off by default)."""

    #: ``send_all`` is cut into pieces of 1..max_write bytes (None: not cut).
    max_write: int | None = None
    #: ``receive_some`` returns at most 1..max_read bytes (None: whatever is asked).
    max_read: int | None = None
    #: Seconds slept, uniformly up to this, before each piece written and each read.
    max_delay: float = 0.0


class Breakage(enum.Enum):
    """How a connection dies."""

    #: Both ends raise ``BrokenResourceError`` (a TCP reset).
    RESET = "reset"
    #: Both ends read EOF and cannot send (each side closed in order).
    EOF = "eof"
    #: Nothing arrives any more and sends vanish without error (a pulled cable); only the
    #: peers' own timeouts notice.
    BLACKHOLE = "blackhole"


@attrs.define(eq=False)
class FaultyLink:
    """The fate shared by both ends of one connection."""

    #: Break after this many bytes have been sent, counting both directions (None: never).
    break_after_bytes: int | None = None
    breakage: Breakage = Breakage.RESET
    bytes_sent: int = 0
    #: How and when (``trio.current_time()``) it broke; None while it works.
    broken: Breakage | None = None
    broken_at: float | None = None
    ends: list[FaultyStream] = attrs.field(factory=list)

    def break_(self, breakage: Breakage | None = None) -> None:
        """Kill the connection now: every operation blocked on either end wakes up."""
        if self.broken is not None:
            return
        self.broken = breakage or self.breakage
        self.broken_at = trio.current_time()
        for end in self.ends:
            end._wake_all()


class FaultyStream(trio.abc.HalfCloseableStream):
    """See the module docstring."""

    def __init__(
        self,
        inner: trio.abc.HalfCloseableStream,
        *,
        faults: Faults = Faults(),
        rng: random.Random | None = None,
        link: FaultyLink | None = None,
        name: str = "",
    ) -> None:
        self.inner = inner
        self.faults = faults
        self.rng = rng or random.Random(0)
        self.link = link or FaultyLink()
        self.link.ends.append(self)
        self.name = name
        self.closed_at: float | None = None
        self.bytes_written = 0
        self.bytes_read = 0
        #: ``send_all`` calls written in more than one piece; reads asked for less than wanted.
        self.writes_cut = 0
        self.reads_cut = 0
        self._closed = False
        self._sending = False
        self._receiving = False
        self._eof_sent = False
        self._scopes: set[trio.CancelScope] = set()

    def __repr__(self) -> str:
        return f"<FaultyStream {self.name or hex(id(self))} broken={self.link.broken}>"

    # --- helpers ------------------------------------------------------------------------------

    def _wake_all(self) -> None:
        for scope in self._scopes:
            scope.cancel()

    def _check(self) -> None:
        """Raise what a closed or dead stream raises."""
        if self._closed:
            raise trio.ClosedResourceError(f"{self!r} was closed")
        if self.link.broken is Breakage.RESET:
            raise trio.BrokenResourceError(f"{self!r}: connection reset")

    async def _blocking(self, afn: object, *args: object) -> object:
        """Run ``await afn(*args)`` so that closing this end or breaking the link wakes it."""
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                return await afn(*args)  # type: ignore[operator]
            except trio.ClosedResourceError:
                self._check()
                if self._eof_sent:
                    raise
                raise trio.BrokenResourceError(f"{self!r}: the peer went away") from None
            finally:
                self._scopes.discard(scope)
        self._check()
        return None  # woken by a break that leaves the stream usable (EOF, black hole)

    async def _delay(self) -> None:
        if self.faults.max_delay > 0:
            await self._blocking(trio.sleep, self.rng.uniform(0, self.faults.max_delay))
        else:
            await trio.lowlevel.checkpoint()
        self._check()

    # --- sending ------------------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            view = memoryview(data).cast("B")
            if not view:
                await self._delay()
                self._after_break()
                return
            pos = 0
            while pos < len(view):
                link = self.link
                k = len(view) - pos
                if self.faults.max_write is not None:
                    k = min(k, self.rng.randint(1, self.faults.max_write))
                if link.broken is None and link.break_after_bytes is not None:
                    k = min(k, max(0, link.break_after_bytes - link.bytes_sent))
                    if k == 0:
                        link.break_()
                await self._delay()
                if self._after_break():
                    return
                await self._blocking(self.inner.send_all, view[pos : pos + k])
                if self._after_break():
                    return
                link.bytes_sent += k
                self.bytes_written += k
                pos += k
                if pos < len(view) and pos == k:
                    self.writes_cut += 1
        finally:
            self._sending = False

    def _after_break(self) -> bool:
        """After a wait: raise if the link broke so that sending fails; True if bytes vanish."""
        self._check()
        if self.link.broken is Breakage.EOF:
            raise trio.BrokenResourceError(f"{self!r}: the peer closed the connection")
        return self.link.broken is Breakage.BLACKHOLE

    async def wait_send_all_might_not_block(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint()
            self._check()
            if self.link.broken is None:
                await self._blocking(self.inner.wait_send_all_might_not_block)
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint()
            self._check()
            if self.link.broken is None:
                await self._blocking(self.inner.send_eof)
            self._eof_sent = True
        finally:
            self._sending = False

    # --- receiving ----------------------------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if max_bytes is not None:
            max_bytes = operator.index(max_bytes)
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        self._receiving = True
        try:
            await self._delay()
            while True:
                broken = self.link.broken
                if broken is Breakage.EOF:
                    return b""
                if broken is Breakage.BLACKHOLE:
                    await self._blocking(trio.sleep, math.inf)
                    continue
                wanted = max_bytes if max_bytes is not None else 64 * 1024
                limit = wanted
                if self.faults.max_read is not None:
                    limit = min(limit, self.rng.randint(1, self.faults.max_read))
                    self.reads_cut += limit < wanted
                data = await self._blocking(self.inner.receive_some, limit)
                if data is None:
                    continue  # the link broke while we waited; see how
                assert isinstance(data, bytes | bytearray)
                self.bytes_read += len(data)
                return data
        finally:
            self._receiving = False

    # --- closing ------------------------------------------------------------------------------

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.closed_at = trio.current_time()
            self._wake_all()
        await trio.aclose_forcefully(self.inner)


def faulty_stream_pair(
    *,
    faults: Faults = Faults(),
    rng: random.Random | None = None,
    link: FaultyLink | None = None,
    lockstep: bool = False,
) -> tuple[FaultyStream, FaultyStream]:
    """Two connected :class:`FaultyStream` ends over a Trio memory (or lockstep) stream pair,
    sharing one :class:`FaultyLink` and one random generator."""
    import trio.testing  # not at import time: it loads pytest when installed

    rng = rng or random.Random(0)
    link = link or FaultyLink()
    maker = trio.testing.lockstep_stream_pair if lockstep else trio.testing.memory_stream_pair
    a, b = maker()
    return (
        FaultyStream(a, faults=faults, rng=rng, link=link, name="a"),
        FaultyStream(b, faults=faults, rng=rng, link=link, name="b"),
    )
