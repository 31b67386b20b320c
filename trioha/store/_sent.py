"""``<root>/haSentOffset``: what a master may have sent and acknowledged (trioha's own).

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
only widens the refused range (never narrows it). A clean stop writes the exact figure, and
so does a master whose marks have stopped moving for a moment (:meth:`SentOffsets.settle`):
a crash while it is quiet finds exact marks, and loses nothing it could report.

The same way, the *acknowledged* mark covers the end of every put answered PUT_OK before
the answer goes out: a master that recovers below it discarded messages it had promised to
keep, and says so, or refuses to start while a slave may still hold them
(``trioha.net._divergence``).

The file also keeps every *lost range* ``[recovered_end, mark)`` found at a start: slaves
whose first report lies inside one are refused for good (docs/replication.md); a lower
bound of the log's *flushed* end, written at most once per :data:`FLUSHED_EVERY` seconds by
the flushers and exactly at a clean stop: a power cut never loses flushed bytes, so a
recovery that ends below it found damage, not a lost tail; and the slaves this master served
(their host and, as of the last write, the highest offset each acknowledged), so that an
operator can be told which slave holds what this master lost.

Its existence says that the store last ran as a trioha master: a slave deletes it before it
appends the first byte it replicates (:func:`forget_master_marks`), so a store without it
that holds data and starts as master is a promoted slave (or a store written by another
broker), which the start-up check treats as such.

The format is plain text, written to a temporary file, fsynced and renamed::

    sent <offset>
    acked <offset>          (only once a put was acknowledged)
    flushed <offset>
    lost <from> <to>
    ...
    slave <host> <acked>
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

__all__ = [
    "DEFAULT_RESERVE_STEP",
    "FLUSHED_EVERY",
    "SENT_OFFSET_FILE",
    "SentOffsets",
    "forget_master_marks",
]

log = logging.getLogger("trioha.store")

SENT_OFFSET_FILE: Final = "haSentOffset"
DEFAULT_RESERVE_STEP: Final = 4 << 20
"""Bytes reserved per fsync of a mark: at most one fsync per 4 MiB of new data sent (data
below the mark, such as a slave catching up on old segments, costs none), and one per 4 MiB
acknowledged."""
FLUSHED_EVERY: Final = 1.0
"""Seconds between two writes of the flushed lower bound."""
MAX_SLAVES: Final = 64
"""Slave hosts remembered at most (the most recently seen are kept)."""


class SentOffsets:
    """The durable "highest offset sent" and "highest offset acknowledged" marks, the lost
    ranges and the slaves served; see the module docstring.

    Thread safety: the blocking writers (:meth:`reserve`, :meth:`reserve_acked`,
    :meth:`note_flushed`, :meth:`write_settled`) may run in worker threads at once; a lock
    orders their writes. The in-memory figures a caller compares against (``reserved``,
    ``acked_reserved``) only ever rise outside :meth:`settle`, which the caller must run
    where no claim (:meth:`note_sent`, :meth:`note_acked`) can interleave with it
    (``trioha.net._marks.MarkKeeper`` runs it in the Trio thread).
    """

    def __init__(self, path: Path, *, step: int = DEFAULT_RESERVE_STEP) -> None:
        if step <= 0:
            raise ValueError(f"the reserve step must be positive, got {step}")
        self.path = path
        self.step = step
        self.reserved = 0
        """The durable mark: no byte at or past it was ever sent."""
        self.sent = 0
        """The highest end handed (or about to be handed) to the network by this process."""
        self.acked_reserved = 0
        """The durable acknowledged mark: no put ending past it was ever answered PUT_OK."""
        self.acked = 0
        """The highest end answered PUT_OK (or about to be) by this process."""
        self.lost: tuple[tuple[int, int], ...] = ()
        self.flushed = 0
        """A durable lower bound of the commit log's flushed end."""
        self.slaves: dict[str, int] = {}
        """Slave host -> the highest offset it acknowledged, as far as this file knows."""
        #: Whether the file exists: when opened, the store last ran as a trioha master.
        self.existed = False
        self._slaves_written: dict[str, int] = {}
        self._flushed_at = -FLUSHED_EVERY
        self._flushed_failing = False
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
        self.existed = True
        lost: list[tuple[int, int]] = []
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split()
            try:
                if words and words[0] == "sent" and len(words) == 2:
                    self.reserved = int(words[1])
                elif words and words[0] == "acked" and len(words) == 2:
                    self.acked_reserved = int(words[1])
                elif words and words[0] == "flushed" and len(words) == 2:
                    self.flushed = int(words[1])
                elif words and words[0] == "lost" and len(words) == 3:
                    lo, hi = int(words[1]), int(words[2])
                    if not 0 <= lo < hi:
                        raise ValueError(f"empty range {lo}..{hi}")
                    lost.append((lo, hi))
                elif words and words[0] == "slave" and len(words) == 3:
                    self.slaves[words[1]] = int(words[2])
                elif words:
                    raise ValueError(f"unknown entry {words[0]!r}")
            except ValueError as exc:
                raise StoreLayoutError(
                    f"{self.path} line {number} ({line[:60]!r}) is not understood: {exc}; "
                    "it records what a master sent to its slaves, so it is not ignored"
                ) from None
        self.sent = self.reserved
        self.acked = self.acked_reserved
        self.lost = tuple(lost)
        self._slaves_written = dict(self.slaves)
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

    def note_promoted(self, end: int, upto: int) -> None:
        """A store that did not last run as a trioha master starts as one at ``end``: a
        history it never had may hold bytes ``[end, upto)`` (a former master's, a sibling
        slave's), so the range is recorded as lost, and the marks start at ``upto``."""
        with self._guard:
            self.lost = (*self.lost, (end, upto))
            self.sent = self.reserved = upto
            self._write()

    def restart_at(self, end: int) -> None:
        """Epoch mode: the epochs, not these marks, tell slaves where histories part; start
        the marks afresh at the recovered ``end``, with no lost ranges to refuse."""
        with self._guard:
            self.sent = self.reserved = end
            self.flushed = min(self.flushed, end)
            self.lost = ()
            self._write()

    def accept_acked(self, end: int) -> None:
        """The start-up check has dealt with acknowledged bytes past ``end`` (none, or
        reported or accepted as lost): the acknowledged mark starts again at ``end``."""
        if self.acked_reserved > end:
            with self._guard:
                self.acked = self.acked_reserved = end
                self._write()

    # --- while serving ------------------------------------------------------------------

    def needs_reserve(self, end: int) -> bool:
        """True when bytes up to ``end`` may not be sent before :meth:`reserve`."""
        return end > self.reserved

    def reserve(self, end: int) -> None:
        """Make the durable mark at least ``end`` (blocking: call from a worker thread); it
        moves to ``end + step``."""
        with self._guard:
            if end <= self.reserved:
                return
            target = end + self.step
            self._write(target)
            self.reserved = target

    def note_sent(self, end: int) -> None:
        """Bytes up to ``end`` are handed to the network (call it before the send; they
        must be reserved)."""
        self.sent = max(self.sent, end)

    def needs_acked_reserve(self, end: int) -> bool:
        """True when a put ending at ``end`` may not be answered PUT_OK before
        :meth:`reserve_acked`."""
        return end > self.acked_reserved

    def reserve_acked(self, end: int) -> None:
        """Make the durable acknowledged mark at least ``end`` (blocking); it moves to
        ``end + step``."""
        with self._guard:
            if end <= self.acked_reserved:
                return
            target = end + self.step
            self._write(acked=target)
            self.acked_reserved = target

    def reserve_ahead(self, sent: int | None, acked: int | None) -> None:
        """Reserve the next step past ``sent`` and ``acked`` (None: leave that mark) in one
        write (blocking): what a master in steady traffic does before anyone has to wait."""
        with self._guard:
            sent_target = self.reserved if sent is None else max(self.reserved, sent + self.step)
            acked_target = self.acked_reserved
            if acked is not None:
                acked_target = max(acked_target, acked + self.step)
            if (sent_target, acked_target) == (self.reserved, self.acked_reserved):
                return
            self._write(sent_target, acked=acked_target)
            self.reserved, self.acked_reserved = sent_target, acked_target

    def note_acked(self, end: int) -> None:
        """A put ending at ``end`` is answered PUT_OK (it must be covered by the mark)."""
        self.acked = max(self.acked, end)

    def note_slave(self, host: str, acked: int) -> bool:
        """Slave ``host`` acknowledged ``acked``; True when the host is new to the file
        (worth writing soon: the start-up check names it)."""
        slaves = self.slaves
        if slaves.get(host, -1) >= acked:
            return False
        new = host not in slaves
        slaves[host] = acked
        if new and len(slaves) > MAX_SLAVES:
            del slaves[next(iter(slaves))]
        return new and host not in self._slaves_written

    def slaves_changed(self) -> bool:
        """True when a slave host is known that the file does not name yet (how far each
        acknowledged is written with whatever is written next)."""
        return self.slaves.keys() != self._slaves_written.keys()

    def settle(self) -> bool:
        """Lower the in-memory marks to what was really sent and acknowledged.

        Returns True when there is something to write (:meth:`write_settled`, blocking).
        The durable marks stay higher until then, which is safe; from now on a send or an
        answer past the exact figures needs a reservation again. Never call it where a
        claim could come between a check and its :meth:`note_sent`/:meth:`note_acked`.
        """
        if self.sent >= self.reserved and self.acked >= self.acked_reserved:
            return False
        self.reserved = max(self.sent, 0)
        self.acked_reserved = self.acked
        return True

    def write_settled(self) -> None:
        """Write the marks as they stand (blocking); a failure is only logged: the file
        then keeps higher marks, the careful side."""
        with self._guard:
            try:
                self._write()
            except StorageError as exc:
                log.warning("%s; the marks on disk stay reserved ahead for now", exc)

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
                # is the cautious side of it: keep serving, try again on a later flush
                # (said once per spell: a full disk would repeat it every second).
                self.flushed = previous
                if not self._flushed_failing:
                    log.warning("%s; the flushed mark stays at %d for now", exc, previous)
                self._flushed_failing = True
                return
            if self._flushed_failing:
                log.info("%s written again (flushed mark %d)", self.path, flushed)
                self._flushed_failing = False

    def cut_to(self, end: int) -> None:
        """The log was cut back to ``end`` on purpose (a truncation): lower the flushed mark."""
        with self._guard:
            if self.flushed > end:
                self.flushed = end
                self._write()

    def close(self, flushed: int | None = None) -> None:
        """A clean stop: the marks become exactly what was sent and acknowledged, and the
        flushed mark ``flushed`` (the log's end, flushed by the stop) when given.

        When it cannot be written (a full disk) the reserved marks on disk stay: they are
        at least what was sent, so the next start is only more careful, never less.
        """
        with self._guard:
            new_flushed = self.flushed if flushed is None else max(self.flushed, flushed)
            if (
                self.sent == self.reserved
                and self.acked == self.acked_reserved
                and new_flushed == self.flushed
                and self.slaves == self._slaves_written
            ):
                return
            previous = self.flushed
            self.flushed = new_flushed
            try:
                self._write(self.sent, acked=self.acked)
            except StorageError as exc:
                self.flushed = previous
                log.warning("%s; keeping the reserved mark %d", exc, self.reserved)
                return
            self.reserved = self.sent
            self.acked_reserved = self.acked

    def _write(self, reserved: int | None = None, *, acked: int | None = None) -> None:
        mark = self.reserved if reserved is None else reserved
        acked_mark = self.acked_reserved if acked is None else acked
        slaves = dict(self.slaves)
        lines = [f"sent {mark}"]
        if acked_mark:
            lines.append(f"acked {acked_mark}")
        lines.append(f"flushed {self.flushed}")
        lines += [f"lost {lo} {hi}" for lo, hi in self.lost]
        lines += [f"slave {host} {offset}" for host, offset in slaves.items()]
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
            raise StorageError(f"cannot write {self.path}: {exc}") from exc
        self._slaves_written = slaves
        self.existed = True


def forget_master_marks(root: Path) -> bool:
    """The store becomes a replica of another master: remove its master marks (blocking).

    Called before a slave appends the first byte it replicates, so that the file's
    existence keeps meaning "last ran as a trioha master". True when there was a file.
    """
    path = root / SENT_OFFSET_FILE
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot remove {path}: {exc}") from exc
    fsync_directory(root)
    return True
