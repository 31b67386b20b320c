"""A running master's durable marks: reserved before bytes go out or puts are answered.

:class:`~trioha.store._sent.SentOffsets` holds the marks and writes them (blocking); this is
the Trio side that the HA writers and the put path share:

* **the sent mark** (classic divergence check): an HA writer never sends past the durable
  mark. When a frame would go past it, the writer reserves further first (one fsync per
  step, in a worker thread). When that write fails (a full or broken disk), sending past the
  mark *pauses*: one ERROR (through the broker's :class:`~trioha.store.DiskGuard`, which also
  shows it in ``status``), heartbeats and acks go on so the slaves stay connected, and the
  writers try again every ``cleanResourceInterval``, like every other background writer,
  until the write works; then they resume by themselves with one line saying so;
* **the acknowledged mark**: a put is answered PUT_OK only once the durable mark covers its
  end (:meth:`MarkKeeper.cover_acked`). When that write fails the put is answered
  FLUSH_DISK_TIMEOUT (stored, but the promise cannot be kept) and further puts are refused
  until a retry works, as for a consume queue that cannot be written;
* **refilling**: a reservation costs a file write and two fsyncs (about 3 ms on a virtual
  disk). So that no put and no frame waits for one in steady traffic, the keeper reserves the
  next step in the background as soon as a mark is used past half of the current one
  (:meth:`MarkKeeper.run`); only a burst that outruns it waits;
* **settling**: once neither mark has moved for a moment, they are written down to the exact
  figures (:meth:`MarkKeeper.run`), so that a crash while the master is quiet finds nothing
  it could have lost, and the start-up check says nothing (it warned at every crash before);
* the **slaves served**: each host that acknowledges is remembered, and a new one is written
  within a second, so that the start-up check can name the slave holding what it lost.

Every reservation and settle runs under one Trio lock, and the claims (``note_sent``,
``note_acked``) happen in the Trio thread right after the check they depend on, with no
checkpoint between: a settle can never lower a mark below bytes already handed out.
"""

from __future__ import annotations

import logging
import math
from typing import Final

import trio

from trioha._errors import StorageError
from trioha.net._wakeup import Wakeup
from trioha.store import ACKED_MARK, SENT_MARK, DiskGuard, SentOffsets

__all__ = ["SETTLE_INTERVAL", "MarkKeeper"]

log = logging.getLogger("trioha.ha")

SETTLE_INTERVAL: Final = 0.25
"""Seconds between two looks at the marks; they are settled when unchanged across one."""


class MarkKeeper:
    """Reservations, pauses and settling of a master's :class:`SentOffsets`."""

    def __init__(
        self,
        sent: SentOffsets,
        *,
        disk: DiskGuard | None = None,
        retry_interval: float = 10.0,
    ) -> None:
        self.sent = sent
        #: Where failures are reported once per spell (and shown in ``status``).
        self.disk = disk if disk is not None else DiskGuard({})
        #: Seconds between two attempts at a mark that cannot be written.
        self.retry_interval = retry_interval
        #: While the sent mark cannot be written: when the next attempt may be made.
        self.sent_retry_at = -math.inf
        self._acked_retry_at = -math.inf
        self._lock = trio.Lock()
        self._seen: tuple[int, int] | None = None
        #: A mark is used past half of its reservation: the next step is reserved ahead.
        self._low = Wakeup()
        self._half = max(1, sent.step // 2)
        self._sent_low = self._acked_low = False
        #: The furthest a writer wanted to send so far (what the sent mark must cover next).
        self._sent_want = 0

    # --- the sent mark (HA writers) -------------------------------------------------------

    @property
    def sending_paused(self) -> bool:
        """True while the sent mark cannot be written: nothing goes out past it."""
        return self.disk.failing(SENT_MARK)

    def covers_sent(self, want: int) -> bool:
        """True when bytes up to ``want`` may be sent now (the writer then claims what it
        sends before any checkpoint); asks for the next step ahead when near the mark."""
        reserved = self.sent.reserved
        self._sent_want = max(self._sent_want, want)
        if want > reserved:
            return False
        if reserved - want < self._half:
            self._sent_low = True
            self._low.notify()
        return True

    async def reserve_sent(self, end: int) -> int:
        """Make the durable sent mark cover ``end`` if it can; returns the mark.

        Below ``end`` when the mark cannot be written now (and ERROR once, see the module
        docstring): the caller sends nothing past it and asks again at
        :attr:`sent_retry_at`.
        """
        sent = self.sent
        async with self._lock:
            if not sent.needs_reserve(end):
                return sent.reserved
            now = trio.current_time()
            if self.sending_paused and now < self.sent_retry_at:
                return sent.reserved
            try:
                await trio.to_thread.run_sync(sent.reserve, end)
            except StorageError as exc:
                self.sent_retry_at = now + self.retry_interval
                self.disk.failed(
                    SENT_MARK,
                    exc,
                    blocks_puts=False,
                    effect=f"replication to slaves is paused at offset {sent.reserved} (the "
                    "slaves stay connected)",
                )
                return sent.reserved
            if self.sending_paused:
                self.disk.succeeded(SENT_MARK, resumed="replication to slaves resumes")
            return sent.reserved

    # --- the acknowledged mark (the put path) -------------------------------------------

    def covers_acked(self, end: int) -> bool:
        """True when a put ending at ``end`` may be answered PUT_OK at once; then it is
        noted as answered (no checkpoint may come between this and the answer). On every
        put: plain attribute reads, and a wakeup when the mark nears its end."""
        sent = self.sent
        reserved = sent.acked_reserved
        if end > reserved:
            return False
        if end > sent.acked:  # noqa: PLR1730 - on every put: max() costs 1.3k instructions more
            sent.acked = end
        if reserved - end < self._half:
            self._acked_low = True
            self._low.notify()
        return True

    async def cover_acked(self, end: int) -> bool:
        """Make the acknowledged mark cover ``end`` and note the put as answered; False when
        the mark cannot be written (the put must not be answered PUT_OK)."""
        if self.covers_acked(end):
            return True
        sent = self.sent
        async with self._lock:
            if sent.needs_acked_reserve(end):
                now = trio.current_time()
                if self.disk.failing(ACKED_MARK) and now < self._acked_retry_at:
                    return False
                try:
                    await trio.to_thread.run_sync(sent.reserve_acked, end)
                except StorageError as exc:
                    self._acked_retry_at = now + self.retry_interval
                    self.disk.failed(ACKED_MARK, exc, blocks_puts=True)
                    return False
                if self.disk.failing(ACKED_MARK):
                    self.disk.succeeded(ACKED_MARK)
            sent.note_acked(end)
            return True

    # --- slaves and settling ------------------------------------------------------------

    def note_slave(self, host: str, acked: int) -> None:
        """The slave on ``host`` acknowledged ``acked``."""
        self.sent.note_slave(host, acked)  # a new host is written at the next look (run)

    async def settle_once(self, *, lower: bool = True) -> bool:
        """Write the marks down to the exact figures (with ``lower``: only while they do not
        move) and any new slave host; True if written."""
        sent = self.sent
        async with self._lock:
            lowered = lower and sent.settle()
            if not lowered and not sent.slaves_changed():
                return False
            await trio.to_thread.run_sync(sent.write_settled)
            return True

    async def run(
        self,
        *,
        interval: float = SETTLE_INTERVAL,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Reserve ahead while the marks are in use; settle them whenever they have not
        moved for ``interval`` seconds."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._refill)
            task_status.started()
            await self._settle_when_quiet(interval)

    async def _refill(self) -> None:
        """Reserve the next step of a mark that is used past half of its reservation."""
        sent = self.sent
        while True:
            await self._low.wait()
            async with self._lock:
                # Only a mark in use (a mark nobody keeps, such as the acknowledged one under
                # SYNC_FLUSH, must not grow by itself).
                acked_low, sent_low = self._acked_low, self._sent_low
                self._acked_low = self._sent_low = False
                half = self._half
                acked: int | None = sent.acked
                if (
                    not acked_low
                    or sent.acked_reserved - sent.acked >= half
                    or self.disk.failing(ACKED_MARK)
                ):
                    acked = None
                want: int | None = self._sent_want
                if not sent_low or sent.reserved - self._sent_want >= half or self.sending_paused:
                    want = None
                if acked is None and want is None:
                    continue
                try:
                    await trio.to_thread.run_sync(sent.reserve_ahead, want, acked)
                except StorageError as exc:
                    # Whoever needs the mark next tries again and reports it (once).
                    log.debug("reserving ahead failed: %s", exc)

    async def _settle_when_quiet(self, interval: float) -> None:
        sent = self.sent
        while True:
            await trio.sleep(interval)
            now = (sent.sent, sent.acked)
            quiet = now == self._seen
            self._seen = now
            due = sent.sent < sent.reserved or sent.acked < sent.acked_reserved
            if (quiet and due) or sent.slaves_changed():
                await self.settle_once(lower=quiet)
