"""The ``commitlog`` data source in Spark: every field as the store reads it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.pipeline._logs import SEGMENT, copy_log, expected_row, segments
from tests.pipeline.conftest import Log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

DOC = Path(__file__).resolve().parents[2] / "docs" / "pipeline.md"


def collect(df: DataFrame) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    cols = [F.unix_millis(c).alias(c) if c.endswith("_timestamp") else F.col(c) for c in df.columns]
    out = []
    for row in df.select(*cols).orderBy("physical_offset").collect():
        d = row.asDict()
        d["body"] = bytes(d["body"])
        out.append(d)
    return out


def test_dataframe_equals_the_store_field_by_field(spark: SparkSession, varied_log: Log) -> None:
    df = spark.read.format("commitlog").option("partitionBytes", "20000").load(str(varied_log.root))
    assert df.rdd.getNumPartitions() == 16  # each 64 KiB segment cut into 4 ranges
    assert collect(df) == [expected_row(m) for m in varied_log.messages]


def test_the_commitlog_directory_itself_reads_the_same(
    spark: SparkSession, varied_log: Log
) -> None:
    df = spark.read.format("commitlog").load(str(varied_log.root / "commitlog"))
    assert df.rdd.getNumPartitions() == 1  # small segments are packed together
    got = df.select("physical_offset", "topic", "tags", "keys").orderBy("physical_offset")
    assert [tuple(r) for r in got.collect()] == [
        (m.physical_offset, m.topic, m.tags, m.keys) for m in varied_log.messages
    ]


def test_rows_instead_of_arrow_batches_give_the_same_frame(
    spark: SparkSession, varied_log: Log
) -> None:
    df = spark.read.format("commitlog").option("arrow", "false").load(str(varied_log.root))
    assert collect(df) == [expected_row(m) for m in varied_log.messages]


def test_offset_range_options(spark: SparkSession, varied_log: Log) -> None:
    ms = varied_log.messages
    df = (
        spark.read.format("commitlog")
        .option("startOffset", str(ms[10].physical_offset + 1))
        .option("endOffset", str(ms[250].physical_offset))
        .option("partitionBytes", "8192")
        .load(str(varied_log.root))
    )
    got = [r[0] for r in df.select("physical_offset").orderBy("physical_offset").collect()]
    assert got == [m.physical_offset for m in ms[11:250]]


def test_problems_output_of_a_truncated_log(
    spark: SparkSession, varied_log: Log, tmp_path: Path
) -> None:
    root = copy_log(varied_log.root, tmp_path / "cut")
    last = varied_log.messages[-1]
    path = segments(root)[-1]
    path.write_bytes(path.read_bytes()[: last.physical_offset % SEGMENT + 30])
    df = spark.read.format("commitlog").load(str(root))
    assert df.count() == len(varied_log.messages) - 1  # the valid prefix
    for reader in (
        spark.read.format("commitlog_problems"),
        spark.read.format("commitlog").option("output", "problems"),
    ):
        found = reader.load(str(root)).orderBy("offset").collect()
        assert [(r.offset, r.segment, r.kind, r.length) for r in found] == [
            (int(path.name), path.name, "bad_segment", 0),
            (last.physical_offset, path.name, "torn_tail", 30),
        ]
        assert "the log ends inside a record" in found[1].detail


def test_bad_options_and_paths_fail_with_a_clear_message(
    spark: SparkSession, varied_log: Log, tmp_path: Path
) -> None:
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="commit log directory not found"):
        spark.read.format("commitlog").load(str(tmp_path / "nowhere")).count()
    with pytest.raises(PySparkException, match=r"option startoffset='x' is not an integer"):
        spark.read.format("commitlog").option("startOffset", "x").load(str(varied_log.root))
    with pytest.raises(PySparkException, match="unknown commitlog option"):
        spark.read.format("commitlog").option("startOfset", "1").load(str(varied_log.root))


def test_every_column_is_documented() -> None:
    from trioha.pipeline import MESSAGE_SCHEMA, PROBLEM_SCHEMA

    text = DOC.read_text()
    for field in [*MESSAGE_SCHEMA.fields, *PROBLEM_SCHEMA.fields]:
        assert f"| `{field.name}` | {field.dataType.simpleString()} |" in text, field.name
