"""``spark.readStream.format("commitlog")``: tail a live commit log.

Offsets are commit log offsets: ``{"offset": N}`` means "every record starting below N has
been read", and N is always a *walk position* (a record start, or the start of a segment
after an end-of-file marker), so a micro-batch ``[start, end)`` is cut exactly where records
begin and a restart from a checkpoint reads exactly the records after the last committed
batch: the same bytes give the same rows, so with a sink that commits per batch (Parquet's
file sink, ``foreachBatch`` with the batch id) every message lands once.

The end of each micro-batch is where the log's written data ends as recovery finds it
(:func:`trioha.pipeline._decode.written_end`): after the last complete record of the last
segment, so a record still being written, or torn, is never emitted. The reader remembers how
far it walked the last segment and continues from there on the next trigger, so tailing costs
one hop per new record; a new segment file is picked up when it appears.

A micro-batch becomes one Spark partition per segment piece it covers (a piece begins at the
previous end or at a segment's start, both walk positions, so no walk is needed to plan it).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from trioha.pipeline._decode import align_starts, open_segment, written_end
from trioha.pipeline._layout import LogLayout, read_layout
from trioha.pipeline._options import ReadOptions
from trioha.pipeline._plan import ScanPartition, ScanRange


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
        return [_StreamPartition(ScanPartition(i, (p,))) for i, p in enumerate(pieces)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from trioha.pipeline._read import read_messages
        from trioha.pipeline._source import arrow_schema

        assert isinstance(partition, _StreamPartition)
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


class _StreamPartition(InputPartition):
    def __init__(self, plan: ScanPartition) -> None:
        super().__init__(plan)
        self.plan = plan
