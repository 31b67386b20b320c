"""Parquet export and per-topic/per-queue statistics."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.pipeline.conftest import Log

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_export_writes_every_message_partitioned_by_topic(
    spark: SparkSession, varied_log: Log, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from trioha.pipeline import export_parquet

    out = tmp_path / "parquet"
    summary = export_parquet(spark, str(varied_log.root), str(out))
    assert (summary.messages, summary.topics) == (300, 4)
    assert summary.render() == f"wrote 300 messages of 4 topic(s) to {out}"
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(dirs) == 4
    assert all(d.startswith("topic=") for d in dirs)
    table = pq.read_table(out, partitioning="hive")
    assert table.num_rows == 300
    by_offset = {r["physical_offset"]: r for r in table.to_pylist()}
    for m in varied_log.messages:
        row = by_offset[m.physical_offset]
        assert (row["topic"], row["body"], row["queue_offset"]) == (m.topic, m.body, m.queue_offset)
        assert dict(row["properties"]) == m.properties_dict()
        assert int(row["store_timestamp"].timestamp() * 1000 + 0.5) == m.store_timestamp


def test_stats_count_per_topic_and_queue(spark: SparkSession, varied_log: Log) -> None:
    from trioha.pipeline import log_stats

    stats = log_stats(spark, str(varied_log.root))
    ms = varied_log.messages
    assert stats.messages == len(ms)
    assert stats.bytes == sum(m.total_size for m in ms)
    assert (stats.min_offset, stats.end_offset) == (0, varied_log.end)
    assert {t.topic: t.messages for t in stats.topics} == Counter(m.topic for m in ms)
    assert {(q.topic, q.queue_id): q.messages for q in stats.queues} == Counter(
        (m.topic, m.queue_id) for m in ms
    )
    for t in stats.topics:
        mine = [m for m in ms if m.topic == t.topic]
        assert t.bytes == sum(m.total_size for m in mine)
        assert t.body_bytes == sum(len(m.body) for m in mine)
        assert (t.first_store_ms, t.last_store_ms) == (
            min(m.store_timestamp for m in mine),
            max(m.store_timestamp for m in mine),
        )
    for q in stats.queues:
        offsets = [m.queue_offset for m in ms if (m.topic, m.queue_id) == (q.topic, q.queue_id)]
        assert (q.min_queue_offset, q.max_queue_offset) == (min(offsets), max(offsets))
    text = stats.render()
    assert f"{len(ms)} messages" in text
    assert "2023-11-14T22:13:20.500Z" in text  # the first store time, in UTC


def test_stats_of_an_offset_range(spark: SparkSession, varied_log: Log) -> None:
    from trioha.pipeline import log_stats

    ms = varied_log.messages
    stats = log_stats(
        spark,
        str(varied_log.root),
        start_offset=ms[100].physical_offset,
        end_offset=ms[200].physical_offset,
    )
    assert stats.messages == 100
    assert (stats.min_offset, stats.end_offset) == (ms[100].physical_offset, ms[199].end_offset)


def test_numeric_topic_names_stay_strings(spark: SparkSession, tmp_path: Path) -> None:
    from tests.pipeline._logs import write_log
    from trioha.pipeline import export_parquet, read_export
    from trioha.store import NewMessage

    write_log(tmp_path / "store", [NewMessage(topic=t, body=b"x") for t in ("007", "2024", "a")])
    out = tmp_path / "pq"
    summary = export_parquet(spark, str(tmp_path / "store"), str(out))
    assert (summary.messages, summary.topics, summary.written) == (3, 3, True)
    df = read_export(spark, str(out))
    assert dict(df.dtypes)["topic"] == "string"
    assert sorted(r.topic for r in df.select("topic").collect()) == ["007", "2024", "a"]


def test_stats_of_a_log_whose_head_retention_deleted(spark: SparkSession, tmp_path: Path) -> None:
    """The first files gone (retention): the pipeline reads from the first file left."""
    from tests.pipeline._logs import SEGMENT, varied_messages, write_log
    from trioha.pipeline import log_stats
    from trioha.store import open_store

    root = tmp_path / "store"
    written = write_log(root, varied_messages(300))
    with open_store(root, segment_size=SEGMENT) as store:
        assert store.commitlog.delete_segments_before(2 * SEGMENT) == 2
    kept = [m for m in written if m.physical_offset >= 2 * SEGMENT]
    stats = log_stats(spark, str(root))
    assert (stats.min_offset, stats.messages) == (2 * SEGMENT, len(kept))
    assert stats.bytes == sum(m.total_size for m in kept)
