"""A data source that replays decoded batches: what Spark's side of a scan costs alone.

``spark.read.format("commitlog_replay").load(DIR)`` plans ``DIR`` as the ``commitlog``
source does, and each task yields as many rows as its partition holds, in the messages
schema, but every batch is the same one, decoded once per Python worker from the log's
first records. The tasks do no decoding, so a scan of it measures what remains of a real
scan: handing Arrow batches to the JVM and Spark turning them into rows. It lives in a
module of its own because Spark's Python workers import data sources by reference.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from trioha.pipeline import MESSAGE_SCHEMA
from trioha.pipeline._schema import arrow_schema

_BATCH: dict[str, pa.RecordBatch] = {}


class ReplayReader(DataSourceReader):
    """One partition per planned ``commitlog`` partition, holding its row count."""

    def __init__(self, path: str) -> None:
        self.path = path

    def partitions(self) -> list[InputPartition]:
        from trioha.pipeline import plan_partitions, read_layout
        from trioha.pipeline._read import read_messages

        # Rows per partition, counted by reading it once here (the planning is not timed
        # apart: this is a measurement aid, run on a log already in the page cache).
        return [
            InputPartition(sum(b.num_rows for b in read_messages(part)))
            for part in plan_partitions(read_layout(self.path))
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        batch = _BATCH.get(self.path)
        if batch is None:
            from trioha.pipeline import plan_partitions, read_layout
            from trioha.pipeline._read import read_messages

            first = plan_partitions(read_layout(self.path))[0]
            batch = _BATCH[self.path] = next(
                read_messages(first, schema=arrow_schema(MESSAGE_SCHEMA))
            )
        left = int(partition.value)
        while left > 0:
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows


class ReplaySource(DataSource):
    """``spark.read.format("commitlog_replay")``."""

    @classmethod
    def name(cls) -> str:
        return "commitlog_replay"

    def schema(self) -> StructType:
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ReplayReader(str(self.options["path"]))
