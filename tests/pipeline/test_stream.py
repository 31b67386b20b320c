"""Structured streaming over a live commit log: exactly once across restarts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.pipeline._logs import SEGMENT, varied_messages
from trioha.store import StoredMessage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def append(root: Path, start: int, count: int) -> list[StoredMessage]:
    """Append messages *start* .. *start* + *count* of the varied set to the store at *root*."""
    from trioha.store._store import open_store

    with open_store(root, segment_size=SEGMENT) as store:
        log = store.commitlog
        for m in varied_messages(start + count)[start:]:
            log.append_batch([m])
        log.flush()
        return list(log.iter_messages())


def run_once(spark: SparkSession, root: Path, out: Path, checkpoint: Path) -> None:
    """Start the stream from its checkpoint, process what is there, stop: a restart."""
    query = (
        spark.readStream.format("commitlog")
        .load(str(root))
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def test_a_parquet_export_of_a_growing_log_is_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    root, out, checkpoint = tmp_path / "store", tmp_path / "out", tmp_path / "checkpoint"
    append(root, 0, 40)
    run_once(spark, root, out, checkpoint)
    stored = append(root, 40, 160)  # into new segment files
    # a record being written: its first bytes are there, the rest not yet
    tail = sorted((root / "commitlog").iterdir())[-1]
    end = stored[-1].end_offset % SEGMENT
    with tail.open("r+b") as f:
        f.seek(end)
        f.write((300).to_bytes(4, "big") + bytes.fromhex("DAA320A7"))
    run_once(spark, root, out, checkpoint)
    got = sorted(r[0] for r in spark.read.parquet(str(out)).select("physical_offset").collect())
    assert got == [m.physical_offset for m in stored]  # none missing, none twice, none torn
    with tail.open("r+b") as f:  # the writer finishes: that record is overwritten for real
        f.seek(end)
        f.write(bytes(8))
    stored = append(root, 200, 60)
    run_once(spark, root, out, checkpoint)
    rows = spark.read.parquet(str(out)).select("physical_offset", "msg_id", "topic").collect()
    assert sorted(r.physical_offset for r in rows) == [m.physical_offset for m in stored]
    assert len({r.msg_id for r in rows}) == len(stored)
