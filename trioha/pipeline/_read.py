"""Reading one planned partition: Arrow batches of messages, or the problems found.

This is what a Spark task runs (``DataSourceReader.read``); it needs numpy and pyarrow but
not pyspark, so the tests and the audit call it directly as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from trioha.pipeline._batches import (
    MESSAGE_ARROW_SCHEMA,
    PROBLEM_ARROW_SCHEMA,
    chunks,
    decode_records,
)
from trioha.pipeline._decode import open_segment
from trioha.pipeline._format import Problem
from trioha.pipeline._framing import scan_range, scan_records
from trioha.pipeline._plan import ScanPartition
from trioha.pipeline._validation import crc_problems


def read_messages(
    partition: ScanPartition,
    *,
    schema: pa.Schema = MESSAGE_ARROW_SCHEMA,
    batch_rows: int = 16384,
    batch_bytes: int = 32 << 20,
    decompress: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Every valid message starting in the partition's ranges, in offset order.

    *decompress* replaces compressed bodies by what the producer sent."""
    for rng in partition.ranges:
        with open_segment(rng.segment) as sd:
            records, _ = scan_records(sd, rng.begin, rng.end, rng.last)
            for part in chunks(records.size, max_rows=batch_rows, max_bytes=batch_bytes):
                yield decode_records(sd, records.take(part), schema, decompress_bodies=decompress)


def read_problems(partition: ScanPartition, *, verify_crc: bool = True) -> Iterator[Problem]:
    """The partition's layout problems, then each range's damaged regions and bad CRCs."""
    yield from partition.problems
    for rng in partition.ranges:
        with open_segment(rng.segment) as sd:
            starts, problems = scan_range(sd, rng.begin, rng.end, rng.last)
            found = list(problems)
            if verify_crc:
                found.extend(crc_problems(sd, starts))
        found.sort(key=lambda p: p.offset)
        yield from found


def problems_batch(
    problems: Iterable[Problem], schema: pa.Schema = PROBLEM_ARROW_SCHEMA
) -> pa.RecordBatch:
    """Problems as one Arrow batch in the problems schema."""
    rows = [p.as_row() for p in problems]
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema.names]
    return pa.RecordBatch.from_arrays(
        [pa.array(list(col), type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema,
    )
