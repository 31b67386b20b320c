"""What a replica audit found, as frozen values with a plain-text rendering.

Pure Python: the CLI prints these and tests compare them without needing Spark to import.
The computation is in :mod:`trioha.pipeline._audit`.
"""

from __future__ import annotations

import enum

import attrs

from trioha.pipeline._format import Problem, ProblemKind


class Verdict(enum.Enum):
    """One slave's state against the master, worst first when several apply."""

    DIVERGED = "diverged"  # some byte both hold differs
    MISSING = "missing"  # a range the master holds is absent inside the slave's range
    AHEAD = "ahead"  # the slave holds data past the master's end
    BEHIND = "behind"  # the slave is a prefix of the master (normal for async replication)
    IDENTICAL = "identical"


@attrs.frozen
class OffsetRange:
    """Commit log offsets ``[start, end)``."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}) ({self.length} bytes)"


@attrs.frozen
class MessageSide:
    """One replica's record at the divergent offset: its fields as text, or why none.

    *fields* are ``(name, value)`` pairs in schema order; *error* says why the bytes there
    do not decode (a torn or corrupt record) when *fields* is empty.
    """

    fields: tuple[tuple[str, str], ...] = ()
    error: str | None = None
    crc_ok: bool | None = None

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.fields if k == name), None)


@attrs.frozen
class Divergence:
    """Where a slave first differs from the master.

    *offset* is the physical offset of the master's record holding the first differing
    byte (or that byte itself when it is not inside a record); *first_byte* is the byte and
    *field* the master record's field that holds it. *differing* names the fields whose
    decoded values differ.
    """

    offset: int
    first_byte: int
    field: str | None
    master: MessageSide
    slave: MessageSide
    differing: tuple[str, ...]

    def render(self) -> list[str]:
        where = f", in the {self.field}" if self.field else ""
        lines = [
            f"diverges at offset {self.offset} (first differing byte at {self.first_byte}{where})"
        ]
        if self.master.error or self.slave.error:
            lines.append(f"  master: {self.master.error or 'a valid message'}")
            lines.append(f"  slave:  {self.slave.error or 'a valid message'}")
        names = [k for k, _ in self.master.fields] or [k for k, _ in self.slave.fields]
        if names:
            width = max(len(n) for n in names)
            lines.append(f"  {'field':<{width}}  {'master':<40}  slave")
            for name in names:
                a, b = self.master.get(name), self.slave.get(name)
                mark = " *" if name in self.differing else ""
                lines.append(f"  {name:<{width}}  {_cut(a):<40}  {_cut(b)}{mark}")
        for side, label in ((self.master, "master"), (self.slave, "slave")):
            if side.crc_ok is False:
                lines.append(f"  the {label}'s body does not match its stored CRC")
        return lines


def _damage(problems: tuple[Problem, ...]) -> list[Problem]:
    """Problems that are damage; a torn tail is the normal state of a log being written
    (a slave mid-record, a master after a crash) and recovery truncates it."""
    return [p for p in problems if p.kind is not ProblemKind.TORN_TAIL]


def _cut(text: str | None, width: int = 40) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 3] + "..."


@attrs.frozen
class ReplicaInfo:
    """One replica directory as the audit saw it.

    *end_offset* is where its written data ends (after the last complete record, as
    recovery finds it); *problems* are its damaged regions and bad CRCs.
    """

    directory: str
    segment_size: int
    segments: int
    min_offset: int
    end_offset: int
    problems: tuple[Problem, ...] = ()

    @property
    def torn_tail(self) -> Problem | None:
        return next((p for p in self.problems if p.kind is ProblemKind.TORN_TAIL), None)

    def describe(self) -> str:
        if not self.segments:
            return f"{self.directory}: no segment files"
        return (
            f"{self.directory}: {self.segments} segment(s) of {self.segment_size} bytes, "
            f"data [{self.min_offset}, {self.end_offset})"
        )


@attrs.frozen
class SlaveAudit:
    """One slave compared with the master.

    *behind_bytes* is master end minus slave end (negative when the slave is ahead);
    *compared* are the ranges both hold, checked chunk by chunk; *bad_ranges* the chunks
    whose checksums differ, merged; *missing* the ranges inside the slave's span that the
    master holds and the slave does not.
    """

    replica: ReplicaInfo
    verdict: Verdict
    behind_bytes: int
    compared: tuple[OffsetRange, ...]
    missing: tuple[OffsetRange, ...]
    bad_ranges: tuple[OffsetRange, ...]
    divergence: Divergence | None = None
    notes: tuple[str, ...] = ()

    @property
    def compared_bytes(self) -> int:
        return sum(r.length for r in self.compared)

    def headline(self) -> str:
        match self.verdict:
            case Verdict.IDENTICAL:
                return "identical"
            case Verdict.BEHIND:
                return f"slave behind by {self.behind_bytes} bytes"
            case Verdict.AHEAD:
                return f"slave ahead by {-self.behind_bytes} bytes"
            case Verdict.MISSING:
                return "missing range " + ", ".join(str(r) for r in self.missing)
            case Verdict.DIVERGED:
                assert self.divergence is not None
                return f"diverges at offset {self.divergence.offset}"

    def render(self) -> list[str]:
        lines = [f"slave {self.replica.describe()}", f"  verdict: {self.headline()}"]
        if self.compared:
            lines.append(f"  compared {self.compared_bytes} bytes in {len(self.compared)} range(s)")
        if self.verdict is not Verdict.BEHIND and self.behind_bytes > 0:
            lines.append(f"  also behind by {self.behind_bytes} bytes")
        if self.verdict is not Verdict.AHEAD and self.behind_bytes < 0:
            lines.append(f"  also ahead by {-self.behind_bytes} bytes")
        if self.verdict is not Verdict.MISSING:
            lines.extend(f"  missing range {r}" for r in self.missing)
        if self.bad_ranges:
            lines.append("  differing ranges: " + ", ".join(str(r) for r in self.bad_ranges))
        if self.divergence is not None:
            lines.extend("  " + line for line in self.divergence.render())
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(f"  problem: {p.render()}" for p in self.replica.problems)
        return lines


@attrs.frozen
class AuditReport:
    """The master and every slave's comparison with it."""

    master: ReplicaInfo
    slaves: tuple[SlaveAudit, ...]
    chunk_bytes: int

    @property
    def ok(self) -> bool:
        """No divergence, nothing missing, no damaged region or bad CRC anywhere.

        A slave behind the master is fine: asynchronous replication is behind by design; so
        is a torn tail (a partial last record).
        """
        return not _damage(self.master.problems) and all(
            s.verdict in (Verdict.IDENTICAL, Verdict.BEHIND) and not _damage(s.replica.problems)
            for s in self.slaves
        )

    def render(self) -> str:
        lines = [f"master {self.master.describe()}"]
        lines.extend(f"  problem: {p.render()}" for p in self.master.problems)
        for slave in self.slaves:
            lines.extend(slave.render())
        lines.append("result: OK" if self.ok else "result: PROBLEMS FOUND (see the lines above)")
        return "\n".join(lines)
