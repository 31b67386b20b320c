"""Export a commit log to Parquet, and count what it holds per topic and queue.

Both run on the ``commitlog`` data source, so they scale with the cluster and read a
damaged log as far as it is readable. Neither is silent about what it could not read: both
also run the ``commitlog_problems`` output over the same range and report the damage it
finds (:class:`Damage`); an export of a damaged log writes nothing unless asked to.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import attrs

from trioha.pipeline._format import Problem, ProblemKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@attrs.frozen
class LogRange:
    """A commit log directory and the offset range to read of it: what ``export``,
    ``stats`` and the damage check share."""

    directory: str
    start_offset: int | None = None
    end_offset: int | None = None
    segment_size: int | None = None
    #: Who decodes the messages (``auto``, ``jvm``, ``python``; docs/pipeline.md, "Engines").
    engine: str = "auto"

    def load(self, spark: SparkSession, *, output: str | None = None) -> DataFrame:
        """The ``commitlog`` read of the range (the JVM engine when the session has it)."""
        from trioha.pipeline._jvm import read_commitlog

        return read_commitlog(
            spark,
            self.directory,
            startOffset=self.start_offset,
            endOffset=self.end_offset,
            segmentSize=self.segment_size,
            output=output,
            engine=self.engine if output is None else "python",
        )

    def damage(self, spark: SparkSession) -> Damage:
        """The problems output over the range, as :class:`Damage`."""
        df = self.load(spark, output="problems")
        spark.sparkContext.setJobDescription(f"trioha: damage in {self.directory}")
        return Damage.of(
            [
                Problem(r["offset"], r["segment"], ProblemKind(r["kind"]), r["length"], r["detail"])
                for r in df.collect()
            ]
        )


@attrs.frozen
class Damage:
    """What a read of a log (or an offset range of it) could not read as messages.

    *problems* are the damaged regions, missing segments and bad CRCs; a partial last record
    is kept apart in *torn_tail*, as it is the normal state of a log being written (a slave
    mid-record, a master after a crash) and recovery truncates it.
    """

    problems: tuple[Problem, ...] = ()
    torn_tail: Problem | None = None

    @classmethod
    def of(cls, problems: list[Problem]) -> Damage:
        found = sorted(problems, key=lambda p: p.offset)
        torn = next((p for p in found if p.kind is ProblemKind.TORN_TAIL), None)
        return cls(tuple(p for p in found if p.kind is not ProblemKind.TORN_TAIL), torn)

    @property
    def count(self) -> int:
        return len(self.problems)

    @property
    def first_offset(self) -> int | None:
        return self.problems[0].offset if self.problems else None

    @property
    def bytes_skipped(self) -> int:
        """Bytes not read as messages (a body with a bad CRC is still read, so not counted)."""
        return sum(p.length for p in self.problems if p.kind is not ProblemKind.CRC_MISMATCH)

    def __bool__(self) -> bool:
        return bool(self.problems)

    def render(self) -> list[str]:
        lines: list[str] = []
        if self.problems:
            kinds = sorted({p.kind.value for p in self.problems})
            lines.append(
                f"DAMAGE: {self.count} damaged region(s) ({', '.join(kinds)}), first at offset "
                f"{self.first_offset}, {self.bytes_skipped} bytes not read as messages"
            )
            lines.extend(f"  {p.render()}" for p in self.problems[:20])
            if self.count > 20:
                lines.append(f"  ... and {self.count - 20} more (see commitlog_problems)")
        if self.torn_tail is not None:
            lines.append(f"note: {self.torn_tail.render()}")
        return lines


def log_damage(
    spark: SparkSession,
    directory: str,
    *,
    start_offset: int | None = None,
    end_offset: int | None = None,
    segment_size: int | None = None,
) -> Damage:
    """The problems output of *directory* over the offset range, as :class:`Damage`."""
    return LogRange(directory, start_offset, end_offset, segment_size).damage(spark)


@attrs.frozen
class ExportSummary:
    """What one :func:`export_parquet` call wrote: counts of this run only, in any mode.

    *written* is False when nothing was written: the log is damaged and damage was not
    allowed, or *mode* is ``ignore`` and the output existed.
    """

    path: str
    messages: int
    topics: int
    mode: str = "errorifexists"
    written: bool = True
    damage: Damage = Damage()

    def render(self) -> str:
        if self.written:
            verb = "appended" if self.mode == "append" else "wrote"
            lines = [f"{verb} {self.messages} messages of {self.topics} topic(s) to {self.path}"]
        elif self.damage:
            lines = [
                f"nothing written to {self.path}: the log is damaged "
                "(allow_damage / --allow-damage exports the messages that are readable)"
            ]
        else:
            lines = [f"nothing written: {self.path} exists and the mode is {self.mode}"]
        lines.extend(self.damage.render())
        return "\n".join(lines)


def export_parquet(
    spark: SparkSession,
    directory: str,
    out: str,
    *,
    mode: str = "errorifexists",
    start_offset: int | None = None,
    end_offset: int | None = None,
    segment_size: int | None = None,
    allow_damage: bool = False,
    engine: str = "auto",
) -> ExportSummary:
    """Write every message to Parquet under *out*, one ``topic=...`` directory per topic.

    Timestamps are written as Parquet's standard microsecond timestamps (not Spark's legacy
    INT96) so that other readers understand them. *mode* is Spark's save mode. The log's
    damage over the range is found first; if there is any, nothing is written unless
    *allow_damage*. The counts are observed while writing, so they are this run's in every
    mode (an append does not count what was there before). *engine* decodes the messages.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    source = LogRange(directory, start_offset, end_offset, segment_size, engine)
    damage = source.damage(spark)
    if damage and not allow_damage:
        return ExportSummary(out, 0, 0, mode, written=False, damage=damage)
    if mode == "ignore" and _exists(spark, out):
        return ExportSummary(out, 0, 0, mode, written=False, damage=damage)
    df = source.load(spark)
    seen = Observation("trioha-export")
    df = df.observe(
        seen,
        F.count(F.lit(1)).alias("messages"),
        F.size(F.collect_set("topic")).alias("topics"),
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
    counts = seen.get
    return ExportSummary(
        out, int(counts["messages"]), int(counts["topics"]), mode, written=True, damage=damage
    )


def _exists(spark: SparkSession, path: str) -> bool:
    """Whether *path* exists, as Spark's writer sees it (through Hadoop's file system)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hpath))


def read_export(spark: SparkSession, path: str) -> DataFrame:
    """Read what :func:`export_parquet` wrote, with ``topic`` as the string it is.

    Spark (like other Parquet readers) guesses the type of a partition column from the
    directory names, so topics such as ``007`` or ``2024`` would come back as numbers;
    this turns the guessing off for the read.
    """
    key = "spark.sql.sources.partitionColumnTypeInference.enabled"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    try:
        df = spark.read.parquet(path)
        df.schema  # noqa: B018 - resolves the partition columns while the setting holds
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    return df


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
    damage: Damage = Damage()

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
                f"{'topic':<{width}}  {'queue':>6}  {'messages':>10}  {'bytes':>12}  queue offsets"
            )
            for q in self.queues:
                lines.append(
                    f"{q.topic:<{width}}  {q.queue_id:>6}  {q.messages:>10}  {q.bytes:>12}  "
                    f"[{q.min_queue_offset}, {q.max_queue_offset}]"
                )
        if self.damage or self.damage.torn_tail is not None:
            lines.append("")
            lines.extend(self.damage.render())
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
    engine: str = "auto",
) -> LogStats:
    """Per-topic and per-queue counts, bytes, queue offsets and store-time ranges, and the
    damage over the same range (what the counts do not include). *engine* decodes the
    messages (the damage is always found by the Python engine's problems output)."""
    from pyspark.sql import functions as F

    source = LogRange(directory, start_offset, end_offset, segment_size, engine)
    damage = source.damage(spark)
    df = source.load(spark)
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
        damage=damage,
    )
