"""``spark.readStream.format("commitlog")``: tail a live commit log.

Offsets are commit log offsets: ``{"offset": N}`` means "every record starting below N has
been read", and N is always a *walk position* (a record start, or the start of a segment
after an end-of-file marker), so a micro-batch ``[start, end)`` is cut exactly where records
begin and a restart from a checkpoint reads exactly the records after the last committed
batch: the same bytes give the same rows, so with a sink that commits per batch (Parquet's
file sink, ``foreachBatch`` with the batch id) every message lands once.

The end of each micro-batch is where the log's written data ends as recovery finds it
(:func:`trioha.pipeline._framing.written_end`): after the last complete record of the last
segment, so a record still being written, or torn, is never emitted. The reader remembers how
far it walked the last segment and continues from there on the next trigger, so tailing costs
one hop per new record; a new segment file is picked up when it appears.

A micro-batch becomes one Spark partition per segment piece it covers (a piece begins at the
previous end or at a segment's start, both walk positions, so no walk is needed to plan it).

Starting a query: where it can die. When a query over a Python source starts, Spark's stream
thread launches one Python process on the driver to run the source
(``pyspark.sql.streaming.python_streaming_source_runner``: ``initialOffset``,
``latestOffset``, ``partitions``, ``commit`` are calls into it) and gives it 10 seconds to
connect back (``PythonWorkerFactory.createSimpleWorker``; a constant, no setting changes it).
Everything else Spark runs in Python here is forked by its daemon, which waits 60 seconds.
On a loaded host a fresh interpreter importing pyspark can take longer than 10 seconds; the
query then dies while its status still says "Initializing sources", with "Python worker failed
to connect back", before reading anything. :func:`start_stream` starts a query, waits until
its sources are initialized, and starts it again after such a failure, until a wait the caller
sets runs out. A restart is safe: the failed attempt wrote no offsets, and with a checkpoint
the next one continues where the last run committed (exactly once, as after any restart).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from trioha._errors import PipelineError
from trioha.pipeline._decode import open_segment
from trioha.pipeline._framing import align_starts, written_end
from trioha.pipeline._layout import LogLayout, read_layout
from trioha.pipeline._options import ReadOptions
from trioha.pipeline._plan import ScanPartition, ScanRange
from trioha.pipeline._schema import PlanPartition, arrow_schema

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger("trioha.pipeline")

#: Seconds Spark gives the source's Python process to connect back (not configurable).
SPARK_CONNECT_BACK_S = 10
#: What the query fails with when that wait ran out (SparkException and its cause).
_SLOW_WORKER = ("failed to connect back", "waiting for the Python worker to connect back")
#: The status messages of a query whose sources are not initialized yet (StreamExecution).
_INITIALIZING = frozenset({"Initializing StreamExecution", "Initializing sources"})
#: How often the start is looked at; the clock and the wait, replaced by tests.
_POLL_S = 0.1
_now = time.monotonic
_sleep = time.sleep


def start_stream(writer: DataStreamWriter, *, start_timeout: float = 120.0) -> StreamingQuery:
    """``writer.start()``, returned once the query's sources are initialized, started again
    when the source's Python process was too slow for Spark (see the module docstring).

    *start_timeout* bounds the whole start, every attempt included: a slow attempt takes
    Spark's 10 seconds, so the default allows about ten. When it runs out, a query still
    initializing is stopped and :class:`PipelineError` names the setting. A query that fails
    at start for any other reason raises that failure (pyspark's
    ``StreamingQueryException``) at once.
    """
    if not start_timeout > 0:
        raise PipelineError(f"start_timeout must be a positive number of seconds: {start_timeout}")
    deadline = _now() + start_timeout
    slow: list[str] = []
    while True:
        query = writer.start()
        outcome = _wait_initialized(query, deadline)
        if outcome is None:
            return query
        if outcome is _STILL_INITIALIZING:
            query.stop()
        elif not any(text in str(outcome) for text in _SLOW_WORKER):
            raise outcome
        else:
            slow.append(_first_line(outcome))
        if outcome is _STILL_INITIALIZING or _now() >= deadline:
            raise PipelineError(_start_failure(start_timeout, slow, outcome is _STILL_INITIALIZING))
        log.warning(
            "streaming query %s: its source's Python process did not connect back within "
            "Spark's %d s (attempt %d); starting it again (%.0f s of start_timeout=%g s left)",
            query.id,
            SPARK_CONNECT_BACK_S,
            len(slow),
            deadline - _now(),
            start_timeout,
        )


#: What :func:`_wait_initialized` returns when the deadline passed first.
_STILL_INITIALIZING = PipelineError("still initializing")


def _wait_initialized(query: StreamingQuery, deadline: float) -> BaseException | None:
    """None once *query* is past initializing its sources (or has ended cleanly), what it
    failed with if it failed, :data:`_STILL_INITIALIZING` if *deadline* passed first."""
    while True:
        if not query.isActive:
            return query.exception()
        if query.status["message"] not in _INITIALIZING:
            return None
        if _now() >= deadline:
            return _STILL_INITIALIZING
        _sleep(_POLL_S)


def _start_failure(start_timeout: float, slow: list[str], initializing: bool) -> str:
    """Why the start gave up, naming the setting that would have let it go on."""
    parts = [f"the streaming query did not start within start_timeout={start_timeout:g} s"]
    if slow:
        parts.append(
            f"{len(slow)} time(s) its source's Python process did not connect back to Spark "
            f"within Spark's {SPARK_CONNECT_BACK_S} s ({slow[-1]})"
        )
    if initializing:
        parts.append("the last attempt was still initializing its sources and is stopped")
    parts.append(
        "a Python interpreter starts this slowly on a loaded host: give "
        "start_stream(..., start_timeout=...) more seconds, or lower the load"
    )
    return "; ".join(parts)


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), repr(exc))


class CommitLogStreamReader(DataSourceStreamReader):
    """Micro-batches of the records a live commit log gains (see the module docstring)."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._walked: tuple[int, int] | None = None  # (last segment's start, written end)

    def _layout(self) -> LogLayout:
        return read_layout(self.options.path, segment_size=self.options.segment_size)

    def initialOffset(self) -> dict[str, int]:
        layout = self._layout()
        if not layout.segments:
            return {"offset": max(self.options.start_offset or 0, 0)}
        start = layout.min_offset
        wanted = self.options.start_offset
        if wanted is not None and wanted > start:
            seg = layout.segment_at(wanted)
            if seg is None:  # past the files, or in a hole: the next file's start
                later = [s.start for s in layout.segments if s.start >= wanted]
                start = later[0] if later else wanted
            else:
                with open_segment(seg) as sd:
                    base = max(seg.start, layout.min_offset)
                    (aligned,) = align_starts(sd, base, [wanted], seg is layout.segments[-1])
                start = seg.end if aligned is None else aligned
        return {"offset": start}

    # The signature without (start, limit) that pyspark 4.1 calls and 4.2+ still accepts.
    def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
        layout = self._layout()
        if not layout.segments:
            return self.initialOffset()
        last = layout.segments[-1]
        begin = max(last.start, layout.min_offset)
        if self._walked is not None and self._walked[0] == last.start:
            begin = max(begin, self._walked[1])
        with open_segment(last) as sd:
            end, _ = written_end(sd, begin)
        self._walked = (last.start, end)
        if self.options.end_offset is not None:
            end = min(end, self.options.end_offset)
        return {"offset": end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        lo, hi = int(start["offset"]), int(end["offset"])
        if hi <= lo:
            return []
        layout = self._layout()
        pieces = [
            ScanRange(seg, max(seg.start, lo), min(seg.end, hi), seg is layout.segments[-1])
            for seg in layout.segments
            if seg.start < hi and seg.end > lo
        ]
        return [PlanPartition(ScanPartition(i, (p,))) for i, p in enumerate(pieces)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from trioha.pipeline._read import read_messages

        assert isinstance(partition, PlanPartition)
        opts = self.options
        yield from read_messages(
            partition.plan,
            schema=arrow_schema(self.schema),
            batch_rows=opts.batch_rows,
            batch_bytes=opts.batch_bytes,
            decompress=opts.decompress,
        )

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the log is read, never consumed."""
