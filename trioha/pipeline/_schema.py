"""What the pipeline's Spark data sources hand Spark: the row schemas and the partition wrapper.

Shared by the batch source (:mod:`trioha.pipeline._source`) and the stream
(:mod:`trioha.pipeline._stream`), so neither imports the other for them. Spark pickles the
partitions by reference to this module.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
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


class PlanPartition(InputPartition):
    """A planned :class:`ScanPartition` in the wrapper Spark requires (batch and stream)."""

    def __init__(self, plan: ScanPartition) -> None:
        super().__init__(plan)
        self.plan = plan
