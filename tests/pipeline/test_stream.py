"""Structured streaming over a live commit log: exactly once across restarts; a start that
survives a slow Python worker."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

from tests.pipeline._logs import SEGMENT, varied_messages
from tests.pipeline.conftest import MISSING, SKIP_REASON
from trioha._errors import PipelineError
from trioha.store import StoredMessage

if MISSING:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from pyspark.errors import StreamingQueryException

from trioha.pipeline import _stream, start_stream

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

pytestmark = pytest.mark.spark


def append(root: Path, start: int, count: int) -> list[StoredMessage]:
    """Append messages *start* .. *start* + *count* of the varied set to the store at *root*."""
    from trioha.store import open_store

    with open_store(root, segment_size=SEGMENT) as store:
        log = store.commitlog
        for m in varied_messages(start + count)[start:]:
            log.append_batch([m])
        log.flush()
        return list(log.iter_messages())


def parquet_export(
    spark: SparkSession, root: Path, out: Path, checkpoint: Path
) -> DataStreamWriter:
    return (
        spark.readStream.format("commitlog")
        .load(str(root))
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )


def run_once(spark: SparkSession, root: Path, out: Path, checkpoint: Path) -> None:
    """Start the stream from its checkpoint, process what is there, stop: a restart."""
    query = start_stream(parquet_export(spark, root, out, checkpoint))
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


# --- starting: a slow Python worker ---------------------------------------------------------

SLOW = "Python worker failed to connect back."


@attrs.define
class Clock:
    """The time :func:`start_stream` sees; its waits advance it."""

    now: float = 1000.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@attrs.define
class FakeQuery:
    """A query whose sources initialize for *init_s* seconds, then fail with *failure* (or
    are initialized)."""

    clock: Clock
    init_s: float
    failure: str | None
    id: str = "q"
    stopped: bool = False
    started_at: float = 0.0

    def __attrs_post_init__(self) -> None:
        self.started_at = self.clock.now

    def _done(self) -> bool:
        return self.clock.now - self.started_at >= self.init_s

    @property
    def isActive(self) -> bool:
        return not self.stopped and not (self._done() and self.failure is not None)

    @property
    def status(self) -> dict[str, Any]:
        done = self._done() and self.failure is None
        return {"message": "Waiting for data to arrive" if done else "Initializing sources"}

    def exception(self) -> StreamingQueryException | None:
        if self.failure is None or not self._done():
            return None
        return StreamingQueryException(message=f"{self.failure}\n=== Streaming Query ===")

    def stop(self) -> None:
        self.stopped = True


@attrs.define
class FakeWriter:
    """``start()`` hands out the scripted queries in turn."""

    clock: Clock
    script: list[tuple[float, str | None]]
    started: list[FakeQuery] = attrs.Factory(list)

    def start(self) -> FakeQuery:
        init_s, failure = self.script[len(self.started)]
        self.started.append(FakeQuery(self.clock, init_s, failure))
        return self.started[-1]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(_stream, "_now", lambda: clock.now)
    monkeypatch.setattr(_stream, "_sleep", clock.sleep)
    monkeypatch.setattr(_stream, "_POLL_S", 0.5)  # exact in binary: no drift in the sums
    return clock


def start(writer: FakeWriter, **kwargs: Any) -> Any:
    return start_stream(writer, **kwargs)  # type: ignore[arg-type]


def test_a_start_too_slow_for_spark_is_tried_again(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    writer = FakeWriter(clock, [(10, SLOW), (10, SLOW), (3, None)])
    with caplog.at_level(logging.WARNING, logger="trioha.pipeline"):
        query = start(writer, start_timeout=60)
    assert query is writer.started[2] and not query.stopped
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "did not connect back within Spark's 10 s (attempt 2)" in warnings[1]


def test_a_start_still_too_slow_when_the_wait_runs_out_names_the_setting(clock: Clock) -> None:
    writer = FakeWriter(clock, [(10, SLOW)] * 5)
    with pytest.raises(PipelineError) as raised:
        start(writer, start_timeout=30)
    assert len(writer.started) == 3  # failed at 10, 20 and 30 s: the deadline passed
    assert str(raised.value) == (
        "the streaming query did not start within start_timeout=30 s; 3 time(s) its "
        "source's Python process did not connect back to Spark within Spark's 10 s (Python "
        "worker failed to connect back.); a Python interpreter starts this slowly on a "
        "loaded host: give start_stream(..., start_timeout=...) more seconds, or lower the load"
    )
    cut = FakeWriter(clock, [(10, SLOW)] * 5)
    with pytest.raises(
        PipelineError, match=r"10 s \(Python.*; the last attempt was still initializing"
    ):
        start(cut, start_timeout=15)  # the second attempt is stopped at 15 s
    assert len(cut.started) == 2 and cut.started[1].stopped


def test_a_start_that_fails_otherwise_is_not_tried_again(clock: Clock) -> None:
    writer = FakeWriter(clock, [(1, "[PATH_NOT_FOUND] no such directory"), (1, None)])
    with pytest.raises(StreamingQueryException, match="PATH_NOT_FOUND"):
        start(writer)
    assert len(writer.started) == 1


def test_sources_still_initializing_at_the_deadline_stop_the_query(clock: Clock) -> None:
    writer = FakeWriter(clock, [(1e9, None)])
    with pytest.raises(PipelineError, match="start_timeout=30 s; the last attempt was still"):
        start(writer, start_timeout=30)
    assert writer.started[0].stopped
    with pytest.raises(PipelineError, match="start_timeout must be a positive"):
        start(writer, start_timeout=0)


@pytest.mark.slow
def test_a_real_source_worker_slow_to_start_is_started_again(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The source's Python process sleeps past Spark's 10 s the first two times it is
    started (an interpreter on a loaded host). A start with a short start_timeout gives up,
    naming the setting; the next one sees the second attempt fail, starts a third, and the
    export holds every message exactly once."""
    from trioha.pipeline._source import register

    starts, pids = tmp_path / "starts", tmp_path / "pids"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *python_streaming_source_runner*)\n'
        f"  n=$(cat {starts} 2>/dev/null || echo 0); echo $((n + 1)) > {starts}\n"
        f"  if [ $n -lt 2 ]; then echo $$ >> {pids}; exec sleep "
        f"{_stream.SPARK_CONNECT_BACK_S + 2}; fi ;;\n"
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    stored = append(tmp_path / "store", 0, 30)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    sc = spark.sparkContext
    python = sc.pythonExec
    sc.pythonExec = str(wrapper)  # the registered source's Python processes run the wrapper
    try:
        register(spark)
        writer = parquet_export(spark, tmp_path / "store", out, checkpoint)
        with pytest.raises(PipelineError, match="start_timeout=5 s; the last attempt was still"):
            start_stream(writer, start_timeout=5)  # Spark waits 10 s: this one is cut short
        with caplog.at_level(logging.WARNING, logger="trioha.pipeline"):
            query = start_stream(writer, start_timeout=120)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        sc.pythonExec = python
        register(spark)
        for pid in pids.read_text().split() if pids.exists() else []:
            _end_sleeper(int(pid))
    assert starts.read_text().strip() == "3"
    assert len([r for r in caplog.records if "attempt 1" in r.getMessage()]) == 1
    got = sorted(r[0] for r in spark.read.parquet(str(out)).select("physical_offset").collect())
    assert got == [m.physical_offset for m in stored]


def _end_sleeper(pid: int) -> None:
    """End the wrapper's ``sleep`` that Spark gave up on, if it still sleeps (and is it)."""
    try:
        if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"sleep"):
            os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass  # it has ended
