"""Export a commit log to Parquet, and count what it holds per topic and queue.

Both run on the ``commitlog`` data source, so they scale with the cluster and read a
damaged log as far as it is readable (the audit and ``commitlog_problems`` say what was
skipped).
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def load(
    spark: SparkSession,
    directory: str,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    segment_size: int | None = None,
) -> DataFrame:
    """``spark.read.format("commitlog")`` with the optional offset range."""
    reader = spark.read.format("commitlog")
    for name, value in (
        ("startOffset", start_offset),
        ("endOffset", end_offset),
        ("segmentSize", segment_size),
    ):
        if value is not None:
            reader = reader.option(name, str(value))
    return reader.load(directory)


@attrs.frozen
class ExportSummary:
    """What :func:`export_parquet` wrote."""

    path: str
    messages: int
    topics: int

    def render(self) -> str:
        return f"wrote {self.messages} messages of {self.topics} topic(s) to {self.path}"


def export_parquet(
    spark: SparkSession,
    directory: str,
    out: str,
    *,
    mode: str = "errorifexists",
    start_offset: int | None = None,
    end_offset: int | None = None,
    segment_size: int | None = None,
) -> ExportSummary:
    """Write every message to Parquet under *out*, one ``topic=...`` directory per topic.

    Timestamps are written as Parquet's standard microsecond timestamps (not Spark's legacy
    INT96) so that other readers understand them. *mode* is Spark's save mode.
    """
    from pyspark.sql import functions as F

    df = load(
        spark,
        directory,
        start_offset=start_offset,
        end_offset=end_offset,
        segment_size=segment_size,
    )
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        spark.sparkContext.setJobDescription(f"trioha export {directory} -> {out}")
        df.write.mode(mode).partitionBy("topic").parquet(out)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    written = spark.read.parquet(out)
    row = written.agg(F.count(F.lit(1)).alias("n"), F.countDistinct("topic").alias("t")).first()
    return ExportSummary(out, int(row["n"]) if row else 0, int(row["t"]) if row else 0)


def _when(millis: int | None) -> str:
    if millis is None:
        return "-"
    stamp = dt.datetime.fromtimestamp(millis / 1000, tz=dt.UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@attrs.frozen
class QueueStats:
    """One queue of one topic: message count, bytes, offsets and store-time range (ms)."""

    topic: str
    queue_id: int
    messages: int
    bytes: int
    body_bytes: int
    min_queue_offset: int
    max_queue_offset: int
    first_store_ms: int | None
    last_store_ms: int | None


@attrs.frozen
class TopicStats:
    """One topic over all its queues."""

    topic: str
    queues: int
    messages: int
    bytes: int
    body_bytes: int
    first_store_ms: int | None
    last_store_ms: int | None


@attrs.frozen
class LogStats:
    """What a commit log holds, per topic and per queue (sorted by name and id)."""

    directory: str
    messages: int
    bytes: int
    min_offset: int | None
    end_offset: int | None
    topics: tuple[TopicStats, ...]
    queues: tuple[QueueStats, ...]

    def render(self) -> str:
        lines = [
            f"{self.directory}: {self.messages} messages, {self.bytes} bytes, "
            f"offsets [{self.min_offset}, {self.end_offset})"
            if self.messages
            else f"{self.directory}: no messages"
        ]
        if self.topics:
            width = max(5, *(len(t.topic) for t in self.topics))
            lines.append(
                f"{'topic':<{width}}  {'queues':>6}  {'messages':>10}  {'bytes':>12}  "
                "first stored              last stored"
            )
            for t in self.topics:
                lines.append(
                    f"{t.topic:<{width}}  {t.queues:>6}  {t.messages:>10}  {t.bytes:>12}  "
                    f"{_when(t.first_store_ms):<24}  {_when(t.last_store_ms)}"
                )
            lines.append("")
            lines.append(
                f"{'topic':<{width}}  {'queue':>6}  {'messages':>10}  {'bytes':>12}  "
                "queue offsets"
            )
            for q in self.queues:
                lines.append(
                    f"{q.topic:<{width}}  {q.queue_id:>6}  {q.messages:>10}  {q.bytes:>12}  "
                    f"[{q.min_queue_offset}, {q.max_queue_offset}]"
                )
        return "\n".join(lines)


def _min(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _max(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def log_stats(
    spark: SparkSession,
    directory: str,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    segment_size: int | None = None,
) -> LogStats:
    """Per-topic and per-queue counts, bytes, queue offsets and store-time ranges."""
    from pyspark.sql import functions as F

    df = load(
        spark,
        directory,
        start_offset=start_offset,
        end_offset=end_offset,
        segment_size=segment_size,
    )
    spark.sparkContext.setJobDescription(f"trioha stats {directory}")
    rows = (
        df.groupBy("topic", "queue_id")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum("size").alias("bytes"),
            F.sum(F.length("body")).alias("body_bytes"),
            F.min("queue_offset").alias("min_qo"),
            F.max("queue_offset").alias("max_qo"),
            F.unix_millis(F.min("store_timestamp")).alias("first"),
            F.unix_millis(F.max("store_timestamp")).alias("last"),
            F.min("physical_offset").alias("min_off"),
            F.max(F.col("physical_offset") + F.col("size")).alias("end_off"),
        )
        .collect()
    )
    queues = tuple(
        sorted(
            (
                QueueStats(
                    topic=r["topic"],
                    queue_id=r["queue_id"],
                    messages=r["messages"],
                    bytes=r["bytes"],
                    body_bytes=r["body_bytes"],
                    min_queue_offset=r["min_qo"],
                    max_queue_offset=r["max_qo"],
                    first_store_ms=r["first"],
                    last_store_ms=r["last"],
                )
                for r in rows
            ),
            key=lambda q: (q.topic, q.queue_id),
        )
    )
    by_topic: dict[str, list[QueueStats]] = {}
    for q in queues:
        by_topic.setdefault(q.topic, []).append(q)
    topics = tuple(
        TopicStats(
            topic=name,
            queues=len(qs),
            messages=sum(q.messages for q in qs),
            bytes=sum(q.bytes for q in qs),
            body_bytes=sum(q.body_bytes for q in qs),
            first_store_ms=_min([q.first_store_ms for q in qs]),
            last_store_ms=_max([q.last_store_ms for q in qs]),
        )
        for name, qs in by_topic.items()
    )
    return LogStats(
        directory=directory,
        messages=sum(q.messages for q in queues),
        bytes=sum(q.bytes for q in queues),
        min_offset=_min([r["min_off"] for r in rows]),
        end_offset=_max([r["end_off"] for r in rows]),
        topics=topics,
        queues=queues,
    )
