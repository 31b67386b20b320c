"""Epochs: which master wrote which range of the commit log (RocketMQ 5.x ``EpochFileCache``).

A broker that starts (or becomes) master opens a new *epoch*: a number larger than any it has
used, starting at the end of its log after recovery. The history of a log is the list of
``(epoch, start_offset)`` entries; entry *i* covers ``[start_i, start_{i+1})`` and the last one
runs to the end of the log. Two logs hold the same bytes up to where their histories agree:
an epoch present in both *with the same start offset* was written by the same master from the
same point, so both hold the same bytes of it, up to the shorter one's end. That is
``EpochFileCache.findConsistentPoint``, and it is what makes a slave that holds bytes its
master lost (a power cut took the master's unflushed tail, and the master then wrote new data
at those offsets) truncate instead of splicing two histories together.

Everything here is pure and hashable, so the model checker explores the same code.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import attrs

from trioha._errors import ProtocolError

#: ``Long.MAX_VALUE``: the end of the last entry while it is open-ended.
OPEN_END = (1 << 63) - 1


class EpochError(ProtocolError):
    """An epoch history that cannot be (a non-increasing entry, an unparsable file)."""


@attrs.frozen(order=True)
class EpochEntry:
    """``EpochEntry``: *epoch* began at *start_offset* of the commit log."""

    epoch: int
    start_offset: int

    def to_line(self) -> str:
        """``EpochEntry``'s checkpoint line: ``epoch-startOffset``."""
        return f"{self.epoch}-{self.start_offset}"

    @classmethod
    def from_line(cls, line: str, *, where: str) -> EpochEntry:
        epoch, sep, start = line.partition("-")
        try:
            if not sep:
                raise ValueError
            return cls(int(epoch), int(start))
        except ValueError:
            raise EpochError(f"{where}: {line!r} is not an 'epoch-startOffset' line") from None


def _entries(value: Iterable[EpochEntry]) -> tuple[EpochEntry, ...]:
    return tuple(value)


@attrs.frozen
class EpochHistory:
    """The entries of one log, oldest first; epochs and start offsets strictly increase."""

    entries: tuple[EpochEntry, ...] = attrs.field(default=(), converter=_entries)

    def __attrs_post_init__(self) -> None:
        for before, after in zip(self.entries, self.entries[1:], strict=False):
            if after.epoch <= before.epoch or after.start_offset <= before.start_offset:
                raise EpochError(
                    f"epoch entries out of order: {before.to_line()} then {after.to_line()} "
                    "(epochs and start offsets must both increase)"
                )
        for entry in self.entries:
            if entry.epoch < 0 or entry.start_offset < 0:
                raise EpochError(f"negative epoch entry {entry.to_line()}")

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def last_epoch(self) -> int:
        """``lastEpoch()``: the newest epoch, 0 with no entries."""
        return self.entries[-1].epoch if self.entries else 0

    def end_of(self, index: int, log_end: int = OPEN_END) -> int:
        """Where entry *index* ends: the next one's start, or *log_end* for the last one."""
        if index + 1 < len(self.entries):
            return self.entries[index + 1].start_offset
        return log_end

    def entry(self, epoch: int) -> tuple[int, EpochEntry] | None:
        for i, entry in enumerate(self.entries):
            if entry.epoch == epoch:
                return i, entry
        return None

    def find_by_offset(self, offset: int) -> tuple[int, EpochEntry] | None:
        """``findEpochEntryByOffset``: the entry whose range holds *offset* (the last one is
        open-ended)."""
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i].start_offset <= offset:
                return i, self.entries[i]
        return None

    def append(self, epoch: int, start_offset: int) -> EpochHistory:
        """``appendEntry``: refuse an epoch or a start offset that does not increase."""
        if self.entries:
            last = self.entries[-1]
            if epoch <= last.epoch or start_offset <= last.start_offset:
                raise EpochError(
                    f"epoch entry {epoch}-{start_offset} does not follow {last.to_line()} "
                    "(epochs and start offsets must both increase)"
                )
        return EpochHistory((*self.entries, EpochEntry(epoch, start_offset)))

    def truncate_suffix(self, offset: int) -> EpochHistory:
        """``truncateSuffixByOffset``: drop every entry starting at or after *offset*."""
        kept = tuple(e for e in self.entries if e.start_offset < offset)
        return self if len(kept) == len(self.entries) else EpochHistory(kept)

    def begin_epoch(self, log_end: int, epoch: int | None = None) -> EpochHistory:
        """A broker starts (or becomes) master with its log ending at *log_end*.

        Entries starting at or after *log_end* describe bytes this log no longer holds (lost
        with an unflushed tail, or cut by recovery) and are dropped (``changeToMaster`` steps
        4-5); the new epoch is one more than any epoch ever recorded here, so an epoch number
        is never reused for a different history even when its entry was dropped.

        With failover (docs/failover.md) etcd hands out the *epoch*; it must be greater than
        every epoch recorded here (``changeToMaster`` refuses a lower one too): an epoch file
        never goes backwards.
        """
        if epoch is None:
            epoch = self.last_epoch + 1
        elif epoch <= self.last_epoch:
            raise EpochError(
                f"cannot begin epoch {epoch}: this log already recorded epoch {self.last_epoch}"
                " (an epoch file never goes backwards)"
            )
        return self.truncate_suffix(log_end).append(epoch, log_end)


def find_consistent_point(
    local: EpochHistory, local_end: int, other: EpochHistory, other_end: int
) -> int:
    """``EpochFileCache.findConsistentPoint``: how far two logs are known to hold the same bytes.

    Walks the local epochs from the newest down; the first one the other history has *with the
    same start offset* gives ``min(its local end, its end there)``. -1 when none matches (no
    common history: the slave must be re-seeded). *local_end* and *other_end* are the ends of
    the two logs (the last entries' ends, ``setLastEpochEntryEndOffset``).
    """
    others = {e.epoch: (i, e) for i, e in enumerate(other.entries)}
    for i in range(len(local.entries) - 1, -1, -1):
        mine = local.entries[i]
        found = others.get(mine.epoch)
        if found is not None and found[1].start_offset == mine.start_offset:
            return min(local.end_of(i, local_end), other.end_of(found[0], other_end))
    return -1


# --- the epochFileCheckpoint text format (``CheckpointFile``) ----------------------------------

#: ``CheckpointFile.NOT_CHECK_CRC_MAGIC_CODE``: a stored CRC of 0 turns the check off.
NO_CRC = 0


def _crc(text: str) -> int:
    """``UtilAll.crc32``: CRC32 of the UTF-8 bytes, as a non-negative Java int."""
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def format_epoch_file(entries: Iterable[EpochEntry]) -> str:
    """``CheckpointFile.write``: count line, CRC line, one ``epoch-startOffset`` line each."""
    lines = [entry.to_line() for entry in entries]
    body = "".join(f"{line}\n" for line in lines)
    return f"{len(lines)}\n{_crc(body)}\n{body}"


def parse_epoch_file(text: str, *, where: str = "epoch file") -> EpochHistory:
    """``CheckpointFile.read``: the entries of *text*, checked against its count and CRC.

    Anything wrong raises :class:`EpochError` naming *where* and what was wrong.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]  # a file written on Windows
    if len(lines) < 2:
        raise EpochError(f"{where}: missing the entry count and CRC lines")
    try:
        count, crc = int(lines[0]), int(lines[1])
    except ValueError:
        raise EpochError(
            f"{where}: the first two lines must be the entry count and the CRC, got "
            f"{lines[0]!r} and {lines[1]!r}"
        ) from None
    body = lines[2:]
    entries = [EpochEntry.from_line(line, where=where) for line in body if line]
    if len(entries) != count:
        raise EpochError(f"{where}: expects {count} entries, found {len(entries)}")
    actual = _crc("".join(f"{line}\n" for line in body))
    if crc not in (NO_CRC, actual):
        raise EpochError(f"{where}: CRC {crc} does not match the entries' CRC {actual}")
    try:
        return EpochHistory(entries)
    except EpochError as exc:  # entries out of order or negative: say which file holds them
        raise EpochError(f"{where}: {exc}") from None


def entries_of(history: EpochHistory | Sequence[tuple[int, int]]) -> EpochHistory:
    """A history from ``(epoch, start)`` pairs (tests and the model spell them this way)."""
    if isinstance(history, EpochHistory):
        return history
    return EpochHistory(EpochEntry(e, s) for e, s in history)
