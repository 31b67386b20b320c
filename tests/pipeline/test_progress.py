"""Progress of the pipeline's commands: which Spark jobs read, and what an operator sees."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.pipeline._logs import copy_log
from tests.pipeline.conftest import Log
from trioha.pipeline._cli import main
from trioha.pipeline._jobprogress import JobProgress, JobView, StageView, reading_jobs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _job(job_id: int, status: str, *stages: tuple[int, int, int, int]) -> JobView:
    return JobView(job_id, status, tuple(StageView(*s) for s in stages))


def test_the_first_stage_of_each_job_is_what_reads() -> None:
    jobs = [
        _job(0, "SUCCEEDED", (0, 4, 4, 0)),  # a damage check: one stage, done
        # a count under adaptive execution: the map stage runs as a job of its own ...
        _job(1, "RUNNING", (1, 8, 3, 2)),
        # ... and the next job lists it again (a new id), never to run it
        _job(2, "RUNNING", (2, 8, 0, 0), (3, 2, 0, 1)),
    ]
    found = [(r.job.id, r.done, r.tasks) for r in reading_jobs(jobs)]
    assert found == [(0, 4, 4), (1, 3, 8)]


def test_a_finished_job_counts_every_task_and_a_stage_listed_before_counts_once() -> None:
    jobs = [
        _job(5, "SUCCEEDED", (7, 3, 2, 0), (8, 1, 1, 0)),  # a task retried: the job is done
        _job(6, "SUCCEEDED", (7, 3, 3, 0), (9, 1, 1, 0)),  # reuses stage 7's output
        _job(7, "RUNNING", (10, 5, 0, 0)),  # not begun yet: reported once it does
        _job(8, "FAILED", (11, 6, 2, 0)),
        _job(9, "RUNNING"),  # no stage known yet
    ]
    found = [(r.job.id, r.done, r.tasks) for r in reading_jobs(jobs)]
    assert found == [(5, 3, 3), (8, 2, 6)]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trioha.progress"]


@pytest.mark.spark
def test_export_logs_a_line_per_job_with_bytes_rate_and_time(
    spark: SparkSession, varied_log: Log, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioha.progress")
    assert main(["export", str(varied_log.root), str(tmp_path / "pq")]) == 0
    # A job slower than the interval (10 s) on a busy machine also logs a line on its way.
    lines = [line for line in _lines(caplog) if "(done in" in line]
    size = r"256\.0 KiB"  # the four 64 KiB files
    assert len(lines) == 2, lines
    for line, job in zip(lines, ("damage check", "write"), strict=True):
        pattern = rf"export {job}: {size} of {size} \(100%\), [\d.]+ \S+/s \(done in [\d.]+ s\)"
        assert re.fullmatch(pattern, line), line
    assert spark.sparkContext.getLocalProperty("spark.jobGroup.id") is None


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.spark
def test_audit_on_a_terminal_draws_a_bar_per_job(
    spark: SparkSession,
    varied_log: Log,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    slave = copy_log(varied_log.root, tmp_path / "slave")
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(["audit", str(varied_log.root), str(slave), "--verify-records"])
    assert code == 0
    bars = terminal.getvalue()
    # tqdm redraws in place: the last state of each bar is complete
    assert re.search(r"audit compare: 100%\|[^|]*\| [\d.]+k/[\d.]+k", bars), bars
    assert re.search(r"audit verify records: 100%\|[^|]*\| 512k/512k", bars), bars
    assert capsys.readouterr().out.rstrip().endswith("result: OK")


class _Context:
    """What :class:`JobProgress` uses of a SparkContext."""

    def __init__(self) -> None:
        self.properties: dict[str, str | None] = {}

    def setJobGroup(self, group: str, description: str) -> None:
        self.properties["spark.jobGroup.id"] = group

    def setLocalProperty(self, key: str, value: str | None) -> None:
        self.properties[key] = value


def test_an_interrupted_command_stops_reporting_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioha.progress")
    now = [100.0]
    running = [_job(3, "RUNNING", (4, 10, 4, 2))]
    monkeypatch.setattr("trioha.pipeline._jobprogress._snapshot", lambda sc, group: running)
    sc = _Context()
    progress = JobProgress(
        sc,  # type: ignore[arg-type]
        "export",
        lambda d: ("write", 10 * 1024 * 1024),
        poll=3600,
        clock=lambda: now[0],
    )

    def interrupted_command() -> None:
        with progress:
            assert sc.properties["spark.jobGroup.id"] == progress.group
            now[0] += 2.0
            progress.update()
            now[0] += 2.0
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_command()
    assert progress._thread is not None and not progress._thread.is_alive()
    assert sc.properties["spark.jobGroup.id"] is None
    (line,) = _lines(caplog)
    assert (
        line
        == "export write: 4.0 MiB of 10.0 MiB (40%), 1.0 MiB/s, ETA 6.0 s (stopped after 4.0 s)"
    )


def test_a_job_logs_a_line_per_interval_and_one_when_it_ends(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trioha.progress")
    now = [0.0]
    jobs = [_job(1, "RUNNING", (2, 4, 1, 1))]
    monkeypatch.setattr("trioha.pipeline._jobprogress._snapshot", lambda sc, group: jobs)
    progress = JobProgress(
        _Context(),  # type: ignore[arg-type]
        "stats",
        lambda d: ("count", 4096),
        poll=3600,
        interval=10,
        clock=lambda: now[0],
    )
    with progress:
        now[0] = 1.0
        progress.update()  # the job is first seen: no line before the interval
        now[0] = 11.0
        progress.update()
        jobs[0] = _job(1, "SUCCEEDED", (2, 4, 4, 0))
        now[0] = 21.0
        progress.update()  # ended after the interval: one final line, not two
    assert _lines(caplog) == [
        "stats count: 1.0 KiB of 4.0 KiB (25%), 93 B/s, ETA 33.0 s",
        "stats count: 4.0 KiB of 4.0 KiB (100%), 195 B/s (done in 21.0 s)",
    ]
