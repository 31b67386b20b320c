"""``<root>/haSentOffset``: how far a classic master may have sent its log (trioha's own).

Classic HA (RocketMQ 4.x) carries no history identity: a slave reports an offset and the
master streams from it. A master that loses the unflushed tail of its log in a power cut and
then keeps writing gives new bytes the offsets its slaves already hold with the old bytes; a
slave reconnecting past the recovered end would be spliced silently. To notice, the master
must know after a crash how far it had *sent*, and that needs a durable mark written before
the bytes go out.

Writing the exact offset before every frame would cost an fsync per frame, so the master
*reserves* ahead: before sending bytes up to ``end`` it makes sure the durable mark is at
least ``end``, moving it to ``end + step`` when it is not (one fsync per ``step`` bytes sent).
After a crash the mark may therefore exceed what was really sent by up to ``step``, which
only widens the refused range (never narrows it). A clean stop writes the exact figure.

The same file keeps every *lost range* ``[recovered_end, mark)`` found at a start: slaves
whose first report lies inside one are refused for good (docs/replication.md), and a lower
bound of the log's *flushed* end, written at most once per :data:`FLUSHED_EVERY` seconds by
the flushers: a power cut never loses flushed bytes, so a recovery that ends below it found
damage, not a lost tail. The format is plain text, written to a temporary file, fsynced and
renamed::

    sent <offset>
    flushed <offset>
    lost <from> <to>
    ...
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Final

from trioha._errors import StorageError, StoreLayoutError
from trioha.store._segment import fsync_directory

__all__ = ["DEFAULT_RESERVE_STEP", "FLUSHED_EVERY", "SENT_OFFSET_FILE", "SentOffsets"]

log = logging.getLogger("trioha.store")

SENT_OFFSET_FILE: Final = "haSentOffset"
DEFAULT_RESERVE_STEP: Final = 4 << 20
"""Bytes reserved per fsync of the mark: at most one fsync per 4 MiB of new data sent (data
below the mark, such as a slave catching up on old segments, costs none)."""
FLUSHED_EVERY: Final = 1.0
"""Seconds between two writes of the flushed lower bound."""


class SentOffsets:
    """The durable "highest offset sent" mark and the lost ranges; see the module docstring."""

    def __init__(self, path: Path, *, step: int = DEFAULT_RESERVE_STEP) -> None:
        if step <= 0:
            raise ValueError(f"the reserve step must be positive, got {step}")
        self.path = path
        self.step = step
        self.reserved = 0
        """The durable mark: no byte at or past it was ever sent."""
        self.sent = 0
        """The highest end actually handed to the network by this process."""
        self.lost: tuple[tuple[int, int], ...] = ()
        self.flushed = 0
        """A durable lower bound of the commit log's flushed end."""
        self._flushed_at = -FLUSHED_EVERY
        self._guard = threading.Lock()  # several connections may reserve at once

    @classmethod
    def open(cls, root: Path, *, step: int = DEFAULT_RESERVE_STEP) -> SentOffsets:
        """Read ``<root>/haSentOffset`` (none yet: nothing was ever sent)."""
        self = cls(root / SENT_OFFSET_FILE, step=step)
        try:
            text = self.path.read_text(encoding="ascii")
        except FileNotFoundError:
            return self
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreLayoutError(f"cannot read {self.path}: {exc}") from None
        lost: list[tuple[int, int]] = []
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split()
            try:
                if words and words[0] == "sent" and len(words) == 2:
                    self.reserved = int(words[1])
                elif words and words[0] == "flushed" and len(words) == 2:
                    self.flushed = int(words[1])
                elif words and words[0] == "lost" and len(words) == 3:
                    lo, hi = int(words[1]), int(words[2])
                    if not 0 <= lo < hi:
                        raise ValueError(f"empty range {lo}..{hi}")
                    lost.append((lo, hi))
                elif words:
                    raise ValueError(f"unknown entry {words[0]!r}")
            except ValueError as exc:
                raise StoreLayoutError(
                    f"{self.path} line {number} ({line[:60]!r}) is not understood: {exc}; "
                    "it records what a master sent to its slaves, so it is not ignored"
                ) from None
        self.sent = self.reserved
        self.lost = tuple(lost)
        return self

    # --- the master's start -------------------------------------------------------------

    def note_recovered_end(self, end: int) -> tuple[int, int] | None:
        """Compare the mark with the log's recovered ``end``; record and return a new loss.

        Returns ``(end, mark)`` when bytes that may have been sent are gone, else None.
        """
        if self.reserved <= end:
            if self.reserved < end:  # durable bytes: the mark covers them, on disk too
                with self._guard:
                    self._write(end)
            self.sent = self.reserved = end
            return None
        lost = (end, self.reserved)
        with self._guard:
            self.lost = (*self.lost, lost)
            self._write()
        return lost

    def restart_at(self, end: int) -> None:
        """Epoch mode: the epochs, not these marks, tell slaves where histories part; start
        the marks afresh at the recovered ``end``, with no lost ranges to refuse."""
        with self._guard:
            self.sent = self.reserved = end
            self.flushed = min(self.flushed, end)
            self.lost = ()
            self._write()

    # --- while serving ------------------------------------------------------------------

    def needs_reserve(self, end: int) -> bool:
        """True when bytes up to ``end`` may not be sent before :meth:`reserve`."""
        return end > self.reserved

    def reserve(self, end: int) -> None:
        """Make the durable mark at least ``end`` (blocking: call from a worker thread)."""
        with self._guard:
            if end <= self.reserved:
                return
            target = end + self.step
            self._write(target)
            self.reserved = target

    def note_flushed(self, flushed: int, now: float) -> None:
        """The log is durable up to ``flushed``; persisted at most every FLUSHED_EVERY s.

        Blocking when it writes: call from the flusher's worker thread.
        """
        with self._guard:
            if flushed <= self.flushed or now - self._flushed_at < FLUSHED_EVERY:
                return
            self._flushed_at = now
            previous, self.flushed = self.flushed, flushed
            try:
                self._write()
            except StorageError as exc:
                # Only the damage check on the next start reads this mark, and a lower one
                # is the cautious side of it: keep serving, try again on a later flush.
                self.flushed = previous
                log.warning("%s; the flushed mark stays at %d for now", exc, previous)

    def cut_to(self, end: int) -> None:
        """The log was cut back to ``end`` on purpose (a truncation): lower the flushed mark."""
        with self._guard:
            if self.flushed > end:
                self.flushed = end
                self._write()

    def note_sent(self, end: int) -> None:
        self.sent = max(self.sent, end)

    def close(self) -> None:
        """A clean stop: the mark becomes exactly what was sent.

        When it cannot be written (a full disk) the reserved mark on disk stays: it is at
        least what was sent, so the next start is only more careful, never less.
        """
        with self._guard:
            if self.sent != self.reserved:
                try:
                    self._write(self.sent)
                except StorageError as exc:
                    log.warning("%s; keeping the reserved mark %d", exc, self.reserved)
                    return
                self.reserved = self.sent

    def _write(self, reserved: int | None = None) -> None:
        mark = self.reserved if reserved is None else reserved
        lines = [f"sent {mark}", f"flushed {self.flushed}"]
        lines += [f"lost {lo} {hi}" for lo, hi in self.lost]
        temp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, ("\n".join(lines) + "\n").encode("ascii"))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, self.path)
            fsync_directory(self.path.parent)
        except OSError as exc:
            raise StorageError(f"cannot write {self.path}: {exc}") from None
