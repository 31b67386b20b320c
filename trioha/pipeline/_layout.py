"""Finding the segment files of a commit log directory, the way RocketMQ loads them.

Mirrors ``MappedFileQueue.load``/``doLoad`` and ``checkSelf``: every file is
named by its 20-digit start offset, all have the same length, consecutive files differ by
exactly that length. Where RocketMQ refuses to start (a file of another length) or logs
``[BUG]`` (a hole between files), the pipeline notes a :class:`Problem` and reads what is
there, because its job is to show the state of a log, damaged or not.

Pure Python: it runs on the Spark driver while planning and in the CLI.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import attrs

from trioha._errors import PipelineError
from trioha.pipeline._format import Problem, ProblemKind, segment_name

_SEGMENT_NAME = re.compile(r"^[0-9]{20}$")


@attrs.frozen
class Segment:
    """One segment file: its absolute path, the offset it starts at and its byte length."""

    path: str
    start: int
    length: int

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def end(self) -> int:
        return self.start + self.length


@attrs.frozen
class LogLayout:
    """The segment files of one commit log directory, in offset order.

    *segment_size* is ``mappedFileSizeCommitLog``: given, or the length most files have.
    *problems* lists holes between files and files of the wrong length or place.
    *data_start* is set when the data begins inside the first file: a trioha slave that
    started replicating mid-segment notes the offset in ``<root>/commitlog.start``.
    """

    directory: str
    segment_size: int
    segments: tuple[Segment, ...]
    problems: tuple[Problem, ...] = ()
    data_start: int | None = None

    @property
    def min_offset(self) -> int:
        """Where the data begins: ``MappedFileQueue.getMinOffset`` (the first file's start,
        -1 with no files) unless *data_start* says otherwise."""
        if not self.segments:
            return -1
        return self.segments[0].start if self.data_start is None else self.data_start

    @property
    def file_end(self) -> int:
        """Where the last file ends (its start plus its length), 0 with no files.

        This is not the written end: a preallocated last file is mostly zeros.
        """
        return self.segments[-1].end if self.segments else 0

    def holes(self) -> tuple[tuple[int, int], ...]:
        """Offset ranges ``[start, end)`` between the first and last file with no file."""
        return tuple(
            (p.offset, p.offset + p.length)
            for p in self.problems
            if p.kind is ProblemKind.MISSING_SEGMENT
        )

    def segment_at(self, offset: int) -> Segment | None:
        """The segment file holding *offset*, if there is one."""
        for seg in self.segments:
            if seg.start <= offset < seg.end:
                return seg
        return None


def commitlog_directory(path: str | os.PathLike[str]) -> Path:
    """The commitlog directory for *path*: a store root holding ``commitlog/``, or itself."""
    root = Path(path)
    if not root.exists():
        raise PipelineError(f"commit log directory not found: {root}")
    if not root.is_dir():
        raise PipelineError(f"not a directory: {root} (give a store root or its commitlog/)")
    nested = root / "commitlog"
    return nested if nested.is_dir() else root


def read_layout(path: str | os.PathLike[str], *, segment_size: int | None = None) -> LogLayout:
    """List and check the segment files under *path* (a store root or a commitlog dir).

    Files whose names are not 20 digits are ignored, as RocketMQ would fail on them and a
    store directory holds other things (``checkpoint``, ``abort``, ``lock``, ...).
    """
    directory = commitlog_directory(path).resolve()
    found: list[Segment] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if _SEGMENT_NAME.match(entry.name) and entry.is_file():
                found.append(Segment(entry.path, int(entry.name), entry.stat().st_size))
    found.sort(key=lambda s: s.start)
    if segment_size is None:
        segment_size = _common_length(found)
    elif segment_size <= 0:
        raise PipelineError(f"segment size must be positive, got {segment_size}")
    start = _start_marker(directory.parent / START_MARKER)
    if start is not None and not (found and found[0].start <= start < found[0].end):
        start = None
    return LogLayout(str(directory), segment_size, tuple(found), _check(found, segment_size), start)


#: trioha's store notes here where a log that a slave began mid-segment starts.
START_MARKER = "commitlog.start"


def _start_marker(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _common_length(segments: list[Segment]) -> int:
    """The length most files have (RocketMQ requires all to have it); ties take the larger."""
    if not segments:
        return 0
    counts = Counter(s.length for s in segments)
    return max(counts, key=lambda length: (counts[length], length))


def _check(segments: list[Segment], segment_size: int) -> tuple[Problem, ...]:
    problems: list[Problem] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg.length != segment_size:
            if last and seg.length < segment_size:
                detail = (
                    f"the last segment is {seg.length} bytes, shorter than the segment size "
                    f"{segment_size}: a truncated copy; its bytes are read as they are"
                )
            else:
                detail = (
                    f"segment is {seg.length} bytes, not the segment size {segment_size} "
                    "(RocketMQ refuses to load it); its bytes are read as they are"
                )
            problems.append(Problem(seg.start, seg.name, ProblemKind.BAD_SEGMENT, 0, detail))
        if segment_size and seg.start % segment_size:
            problems.append(
                Problem(
                    seg.start,
                    seg.name,
                    ProblemKind.BAD_SEGMENT,
                    0,
                    f"start offset {seg.start} is not a multiple of the segment size "
                    f"{segment_size}",
                )
            )
        if i == 0:
            continue
        prev = segments[i - 1]
        expected = prev.start + segment_size
        if seg.start > expected:
            count = (seg.start - expected) // segment_size if segment_size else 0
            missing = f"{count} file(s) missing" if count else "a partial hole"
            problems.append(
                Problem(
                    expected,
                    segment_name(expected),
                    ProblemKind.MISSING_SEGMENT,
                    seg.start - expected,
                    f"no segment file holds offsets [{expected}, {seg.start}) ({missing} "
                    f"between {prev.name} and {seg.name})",
                )
            )
        elif seg.start < prev.end:
            problems.append(
                Problem(
                    seg.start,
                    seg.name,
                    ProblemKind.BAD_SEGMENT,
                    prev.end - seg.start,
                    f"overlaps the previous segment {prev.name}, which ends at {prev.end}",
                )
            )
    return tuple(problems)
