"""Progress of a pipeline command's Spark jobs: a bar on a terminal, a log line otherwise.

An audit, an export or a count of a large log runs for minutes in Spark jobs; Spark's own
console bar shows tasks of stages, not how much of the log is read nor when it ends. While a
command runs, :class:`JobProgress` polls Spark's public status tracker
(``SparkContext.statusTracker()``) from a daemon thread on the driver and reports each job
that reads the log as one :class:`trioha._progress.Progress`: bytes read of the bytes the
job reads, rate and ETA.

How much a job has read is estimated from its tasks: the first stage of a job is the one that
reads (the data source's partitions, or the audit's compare tasks; later stages only combine
what it produced), the planner cuts the log into partitions of about equal size, so a job
with ``k`` of ``n`` such tasks done has read about ``k/n`` of its bytes. A stage whose output
an earlier job already computed is skipped by Spark (adaptive execution runs a shuffle's
map stage as a job of its own, and the next job lists it again, never to run it): such a job
reads nothing and is not reported.

The command's jobs are found by a job group set on the calling thread for the duration, so
jobs of other threads of the same session are left out. The caller says, for a job's
description (what ``setJobDescription`` named it), what to call it and how many bytes it
reads (:data:`Describe`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

import attrs

from trioha._progress import Progress

if TYPE_CHECKING:
    from types import TracebackType

    from pyspark import SparkContext

log = logging.getLogger("trioha.pipeline.progress")

#: A job's description -> what to call it in a progress line, and the bytes it reads (None:
#: unknown, the progress is counted in tasks instead).
Describe = Callable[[str], tuple[str, int | None]]

_FINISHED = frozenset({"SUCCEEDED", "FAILED"})
_groups = itertools.count(1)


@attrs.frozen
class StageView:
    """What the status tracker says of one stage."""

    id: int
    tasks: int
    completed: int
    active: int

    @property
    def idle(self) -> bool:
        return self.completed == 0 and self.active == 0


@attrs.frozen
class JobView:
    """What the status tracker says of one job (*status* as Spark spells it)."""

    id: int
    status: str
    stages: tuple[StageView, ...]
    description: str = ""

    @property
    def finished(self) -> bool:
        return self.status in _FINISHED


@attrs.frozen
class Reading:
    """A job that reads: how many of its reading stage's tasks are done."""

    job: JobView
    done: int
    tasks: int


def reading_jobs(jobs: Sequence[JobView]) -> list[Reading]:
    """The jobs of *jobs* (in id order) that read, with their reading stage's progress.

    A job's reading stage is its first stage. It is not one when an earlier job listed the
    same stage. An idle first stage (no task done or running) is left out: either it has
    not begun (it is reported once it does) or Spark skipped it, its output existing (the
    job then ends, or runs its later stages, with that stage still idle).
    """
    seen: set[int] = set()
    out: list[Reading] = []
    for job in sorted(jobs, key=lambda j: j.id):
        if not job.stages:
            continue
        first = min(job.stages, key=lambda s: s.id)
        known = first.id in seen
        seen.update(s.id for s in job.stages)
        if known or first.tasks <= 0 or first.idle:  # listed before, skipped, or not begun
            continue
        done = first.tasks if job.status == "SUCCEEDED" else min(first.completed, first.tasks)
        out.append(Reading(job, done, first.tasks))
    return out


def _snapshot(sc: SparkContext, group: str) -> list[JobView]:
    tracker = sc.statusTracker()
    # The job's description (what names it, and for the audit's comparison its bytes) is
    # not in the public tracker; without it, jobs are reported under the caller's default.
    try:
        store = sc._jsc.sc().statusStore()
    except Exception:
        store = None
    jobs: list[JobView] = []
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        if info is None:
            continue
        stages = []
        for stage_id in info.stageIds:
            s = tracker.getStageInfo(stage_id)
            if s is not None:
                stages.append(
                    StageView(stage_id, s.numTasks, s.numCompletedTasks, s.numActiveTasks)
                )
        description = ""
        if store is not None:
            try:
                option = store.job(job_id).description()
                description = str(option.get()) if option.isDefined() else ""
            except Exception:
                description = ""
        jobs.append(JobView(job_id, str(info.status), tuple(stages), description))
    return jobs


class JobProgress:
    """While the ``with`` block runs, report the progress of the Spark jobs it starts.

    *what* names the command (``export``); *describe* names each reading job and says how
    many bytes it reads. *poll* is how often the status tracker is asked; *interval*,
    *stream* and *terminal* are :class:`Progress`'s (a bar on a terminal, a log line every
    *interval* seconds otherwise, and a final line for each job).
    """

    def __init__(
        self,
        sc: SparkContext,
        what: str,
        describe: Describe,
        *,
        poll: float = 0.5,
        interval: float = 10.0,
        stream: TextIO | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sc = sc
        self.what = what
        self.describe = describe
        self.poll = poll
        self.interval = interval
        self.stream = stream
        self.terminal = terminal
        self.clock = clock
        self.group = f"trioha-{what}-{next(_groups)}"
        #: One Progress per reading job, by job id (closed when the job ended).
        self.bars: dict[int, Progress] = {}
        self._closed: set[int] = set()
        #: When the status tracker was last asked: a job first seen now began after it.
        self._asked = clock()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> JobProgress:
        self.sc.setJobGroup(self.group, f"trioha {self.what}")
        self._thread = threading.Thread(
            target=self._run, name=f"trioha {self.what} progress", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            if kind is None:
                self.update()  # the jobs that started and ended between two polls
        except Exception as error:  # the report is a nicety: never fail the command for it
            log.debug("cannot read the Spark jobs' progress: %s", error)
        finally:
            with self._lock:
                for job_id, bar in self.bars.items():
                    if job_id not in self._closed:
                        bar.close(stopped=kind is not None)
                        self._closed.add(job_id)
            try:
                self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
            except Exception as error:  # a stopped context: nothing to clear
                log.debug("cannot clear the job group: %s", error)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.update()
            except Exception as error:  # e.g. the context stopping under us: stop reporting
                log.debug("cannot read the Spark jobs' progress: %s", error)
                return

    def update(self) -> None:
        """Ask the status tracker once and move the progress of every reading job."""
        readings = reading_jobs(_snapshot(self.sc, self.group))
        with self._lock:
            began, self._asked = self._asked, self.clock()
            for r in readings:
                job_id = r.job.id
                if job_id in self._closed:
                    continue
                bar = self.bars.get(job_id)
                label, nbytes = self.describe(r.job.description)
                if bar is None:
                    bar = self.bars[job_id] = Progress(
                        f"{self.what} {label}",
                        total=nbytes if nbytes is not None else r.tasks,
                        unit="B" if nbytes is not None else "tasks",
                        interval=self.interval,
                        stream=self.stream,
                        terminal=self.terminal,
                        clock=self.clock,
                        start=began,
                    )
                done = nbytes * r.done // r.tasks if nbytes is not None else r.done
                if r.job.finished:
                    bar.finish(done, stopped=r.job.status != "SUCCEEDED")
                    self._closed.add(job_id)
                else:
                    bar.set(done)
