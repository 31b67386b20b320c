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
from trioha.store._diskspace import ACKED_MARK, SENT_MARK, DiskGuard
from trioha.store._sent import SentOffsets

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

    # --- the sent mark (HA writers) -------------------------------------------------------

    @property
    def sending_paused(self) -> bool:
        """True while the sent mark cannot be written: nothing goes out past it."""
        return self.disk.failing(SENT_MARK)

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
        noted as answered (no checkpoint may come between this and the answer)."""
        sent = self.sent
        if sent.needs_acked_reserve(end):
            return False
        sent.note_acked(end)
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

    async def settle_once(self) -> bool:
        """Write the marks down to the exact figures (and new slave hosts); True if written."""
        sent = self.sent
        async with self._lock:
            if not sent.settle() and not sent.slaves_changed():
                return False
            await trio.to_thread.run_sync(sent.write_settled)
            return True

    async def run(
        self,
        *,
        interval: float = SETTLE_INTERVAL,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Settle the marks whenever they have not moved for ``interval`` seconds."""
        task_status.started()
        sent = self.sent
        while True:
            await trio.sleep(interval)
            now = (sent.sent, sent.acked)
            quiet = now == self._seen
            self._seen = now
            due = sent.sent < sent.reserved or sent.acked < sent.acked_reserved
            if (quiet and due) or sent.slaves_changed():
                await self.settle_once()
