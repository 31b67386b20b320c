"""A data source that pushes down ``x >= a`` and ``x < b``: the smallest reader with which
to watch what pyspark does with pushed filters (see tests/pipeline/test_pushdown.py).

It lives in a module of its own because Spark's Python workers import the data source by
reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    Filter,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
)
from pyspark.sql.types import LongType, StructField, StructType

ROWS = 100


class ProbeReader(DataSourceReader):
    """Rows ``x`` in ``[0, ROWS)``; keeps the bounds of the filters it accepts."""

    def __init__(self) -> None:
        self.lo, self.hi = 0, ROWS

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        self.lo, self.hi = 0, ROWS
        for f in filters:
            if isinstance(f, GreaterThanOrEqual) and f.attribute == ("x",):
                self.lo = max(self.lo, int(f.value))
            elif isinstance(f, LessThan) and f.attribute == ("x",):
                self.hi = min(self.hi, int(f.value))
            else:
                yield f

    def partitions(self) -> list[InputPartition]:
        return [InputPartition((self.lo, self.hi))]

    def read(self, partition: InputPartition) -> Iterator[tuple[int]]:
        lo, hi = partition.value
        for x in range(lo, hi):
            yield (x,)


class ProbeSource(DataSource):
    """``spark.read.format("pushdown_probe")``."""

    @classmethod
    def name(cls) -> str:
        return "pushdown_probe"

    def schema(self) -> StructType:
        return StructType([StructField("x", LongType(), nullable=False)])

    def reader(self, schema: StructType) -> DataSourceReader:
        return ProbeReader()
