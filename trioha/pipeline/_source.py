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
from pyspark.sql.types import StructType

from trioha._errors import PipelineError
from trioha.pipeline._options import Engine, Output, ReadOptions
from trioha.pipeline._schema import MESSAGE_SCHEMA, PROBLEM_SCHEMA, PlanPartition, arrow_schema


class CommitLogReader(DataSourceReader):
    """Plans byte-range partitions on the driver; each task reads one."""

    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [PlanPartition(p) for p in self.options.plan()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # Imported here: numpy and the decoder load in the executor's Python worker only.
        from trioha.pipeline._read import problems_batch, read_messages, read_problems

        if not isinstance(partition, PlanPartition):
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
