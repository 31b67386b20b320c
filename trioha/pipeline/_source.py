"""The ``commitlog`` and ``commitlog_problems`` Spark data sources (``pyspark.sql.datasource``).

``spark.read.format("commitlog").load(path)`` plans on the driver (list the segment files,
cut them into byte ranges: :mod:`trioha.pipeline._plan`) and reads each range in a task,
yielding ``pyarrow.RecordBatch`` objects that Spark takes as they are
(:mod:`trioha.pipeline._read`). The option ``arrow=false`` yields plain tuples instead; it
exists to measure what the batches save.

Spark pickles the data source and reader by reference to this module, so every executor
must be able to import ``trioha`` (installed, or shipped with ``--py-files``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from trioha._errors import PipelineError
from trioha.pipeline._options import Engine, Output, ReadOptions
from trioha.pipeline._plan import ScanPartition

#: One row per message. Documented in docs/pipeline.md; keep the two in step.
MESSAGE_SCHEMA = StructType(
    [
        StructField("physical_offset", LongType(), nullable=False),
        StructField("size", IntegerType(), nullable=False),
        StructField("topic", StringType(), nullable=False),
        StructField("queue_id", IntegerType(), nullable=False),
        StructField("queue_offset", LongType(), nullable=False),
        StructField("tags", StringType(), nullable=True),
        StructField("keys", StringType(), nullable=True),
        StructField("born_timestamp", TimestampType(), nullable=True),
        StructField("born_host", StringType(), nullable=False),
        StructField("store_timestamp", TimestampType(), nullable=True),
        StructField("store_host", StringType(), nullable=False),
        StructField("sysflag", IntegerType(), nullable=False),
        StructField("flag", IntegerType(), nullable=False),
        StructField("body_crc", IntegerType(), nullable=False),
        StructField("reconsume_times", IntegerType(), nullable=False),
        StructField("prepared_transaction_offset", LongType(), nullable=False),
        StructField("magic_code", LongType(), nullable=False),
        StructField(
            "properties",
            MapType(StringType(), StringType(), valueContainsNull=True),
            nullable=False,
        ),
        StructField("body", BinaryType(), nullable=False),
        StructField("msg_id", StringType(), nullable=False),
        StructField("compressed", BooleanType(), nullable=False),
        StructField("compression", StringType(), nullable=True),
    ]
)

#: One row per damaged region (or missing segment, or bad CRC).
PROBLEM_SCHEMA = StructType(
    [
        StructField("offset", LongType(), nullable=False),
        StructField("segment", StringType(), nullable=False),
        StructField("kind", StringType(), nullable=False),
        StructField("length", LongType(), nullable=False),
        StructField("detail", StringType(), nullable=False),
    ]
)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects batches of *schema* to have (it checks equality)."""
    result: pa.Schema = to_arrow_schema(schema, timezone="UTC")
    return result


class _Partition(InputPartition):
    """A planned :class:`ScanPartition` in the wrapper Spark requires."""

    def __init__(self, plan: ScanPartition) -> None:
        super().__init__(plan)
        self.plan = plan


class CommitLogReader(DataSourceReader):
    """Plans byte-range partitions on the driver; each task reads one."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [_Partition(p) for p in self.options.plan()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # Imported here: numpy and the decoder load in the executor's Python worker only.
        from trioha.pipeline._read import problems_batch, read_messages, read_problems

        if not isinstance(partition, _Partition):
            return  # Spark's placeholder when there is nothing to read
        opts = self.options
        schema = arrow_schema(self.schema)
        if opts.output is Output.PROBLEMS:
            problems = list(read_problems(partition.plan, verify_crc=opts.verify_crc))
            if not problems:
                return
            if opts.arrow:
                yield problems_batch(problems, schema)
            else:
                yield from (p.as_row() for p in problems)
            return
        batches = read_messages(
            partition.plan,
            schema=schema,
            batch_rows=opts.batch_rows,
            batch_bytes=opts.batch_bytes,
            decompress=opts.decompress,
        )
        if opts.arrow:
            yield from batches
        else:
            for batch in batches:
                yield from _rows(batch)


def _rows(batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
    """The batch as Python tuples (maps as dicts), for the ``arrow=false`` comparison."""
    columns = []
    for field, column in zip(batch.schema, batch.columns, strict=True):
        values = column.to_pylist()
        if pa.types.is_map(field.type):
            values = [None if v is None else dict(v) for v in values]
        columns.append(values)
    return zip(*columns, strict=True)


class CommitLogDataSource(DataSource):
    """``spark.read.format("commitlog")``: messages (or, with ``output=problems``, problems)."""

    @classmethod
    def name(cls) -> str:
        return "commitlog"

    def _read_options(self) -> ReadOptions:
        return ReadOptions.from_options(dict(self.options))

    def schema(self) -> StructType:
        if self._read_options().output is Output.PROBLEMS:
            return PROBLEM_SCHEMA
        return MESSAGE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._read_options()
        if opts.engine is Engine.JVM:
            raise PipelineError(
                'format("commitlog") reads with the Python engine; for the JVM engine use '
                "trioha.pipeline.read_commitlog(spark, path, engine='jvm')"
            )
        return CommitLogReader(opts, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """``spark.readStream.format("commitlog")``: see :mod:`trioha.pipeline._stream`."""
        from trioha.pipeline._stream import CommitLogStreamReader

        opts = self._read_options()
        if opts.output is not Output.MESSAGES:
            raise PipelineError("a stream reads messages; problems are read in batch")
        return CommitLogStreamReader(opts, schema)


class CommitLogProblemsDataSource(CommitLogDataSource):
    """``spark.read.format("commitlog_problems")``: corrupt, torn and missing regions."""

    @classmethod
    def name(cls) -> str:
        return "commitlog_problems"

    def _read_options(self) -> ReadOptions:
        return ReadOptions.from_options(dict(self.options), output=Output.PROBLEMS)


def register(spark: SparkSession) -> None:
    """Make ``format("commitlog")`` and ``format("commitlog_problems")`` available."""
    spark.dataSource.register(CommitLogDataSource)
    spark.dataSource.register(CommitLogProblemsDataSource)
