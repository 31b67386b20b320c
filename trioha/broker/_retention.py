"""The retention service: old commit log files, and the consume queue and index files of the
messages in them, deleted as RocketMQ deletes them.

Mirrors RocketMQ 4.9.7's ``DefaultMessageStore.cleanFilesPeriodically`` (docs/rocketmq-protocol.md
§20), on a master and a slave alike: every ``cleanResourceInterval`` (first
:data:`FIRST_RUN_DELAY` after the start)

* ``CleanCommitLogService``: the disk is measured (the disk guard's ``isSpaceFull``, whose
  flags follow), and at a ``deleteWhen`` hour, above ``diskMaxUsedSpaceRatio``, or while a
  manual request lasts (``deleteExpiredCommitLog``: the next 20 runs), the oldest segments
  last written ``fileReservedTime`` hours ago or earlier are deleted, any age above
  ``diskSpaceCleanForciblyRatio`` with ``cleanFileForciblyEnable``; never the segment being
  written, one at a time ``deleteCommitLogFilesInterval`` apart, at most 10 a run. The rule
  itself is pure (``trioha.store._retention``), shared with ``model/``;
* ``CleanConsumeQueueService``: once the commit log's min offset has moved, each consume
  queue's files wholly below it are deleted and its min offset corrected, then the message
  index's files (``IndexService.deleteExpiredFile``).

A segment leaves the log in the event loop (readers see the new min offset at once) and its
file is deleted in a worker thread; a reader holding part of it keeps its mapping until done,
so nothing waits for readers (RocketMQ's ``destroyMapedFileIntervalForcibly``). What a
deletion does to replication and consumers: docs/operations.md, "Retention".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NoReturn

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import StorageError
from trioha.broker._delaylevels import SCHEDULE_TOPIC
from trioha.broker._reput import ReputService
from trioha.store import (
    DELETE_FILES_BATCH_MAX,
    HOUR_MS,
    MANUAL_DELETE_RUNS,
    CommitLog,
    DiskGuard,
    RetentionRun,
    decide_run,
    expired_count,
    is_time_to_delete,
    space_to_delete,
)

log = logging.getLogger("trioha.store.retention")

#: ``cleanFilesPeriodically``'s initial delay: 60 s after the start (a manual request runs at
#: once).
FIRST_RUN_DELAY = 60.0


def local_hour(seconds: float) -> int:
    """The hour of the day, local time, at *seconds* since the epoch (``Calendar.HOUR_OF_DAY``)."""
    return time.localtime(seconds).tm_hour


@attrs.frozen
class RetentionStatistics:
    """What retention has done (``Broker.statistics().retention``, shown by ``status`` as
    ``stats.retention.*``)."""

    #: ``idle``: nothing to delete this run; ``cleaning``: this run deletes (the hour, the
    #: disk or a manual request); ``stuck``: it should delete but nothing may go (the disk is
    #: above ``diskMaxUsedSpaceRatio`` and no file is old enough, or a deletion failed).
    state: str
    #: Why the last run that deleted did (``deleteWhen``, the disk, ``deleteExpiredCommitLog``).
    reason: str
    runs: int
    #: Runs left of a manual request (``deleteExpiredCommitLog``).
    manual_runs_left: int
    segments_deleted: int
    bytes_deleted: int
    consume_queue_files_deleted: int
    index_files_deleted: int
    #: Consume queues destroyed by ``cleanExpiredCQ``.
    consume_queues_destroyed: int
    #: When the last segment was deleted (ms since the epoch; 0: never).
    last_deleted_ms: int
    #: The last deletion that failed, "" if none.
    last_error: str


class RetentionService:
    """Runs retention over a broker's store; see the module docstring."""

    def __init__(
        self,
        config: BrokerConfig,
        commitlog: CommitLog,
        disk: DiskGuard,
        reput: ReputService,
        *,
        wall_clock: Callable[[], float] = time.time,
        hour_of: Callable[[float], int] = local_hour,
    ) -> None:
        #: Read again at every run (``fileReservedTime`` and ``deleteWhen`` change live).
        self.config = config
        self.commitlog = commitlog
        self.disk = disk
        self.reput = reput
        #: Seconds since the epoch: what file times are compared with, and the hour read.
        self.wall_clock = wall_clock
        self.hour_of = hour_of
        self._wake = trio.Event()
        self._manual_runs = 0
        self._last_min = 0
        self._state = "idle"
        self._reason = ""
        self._runs = 0
        self._segments = 0
        self._bytes = 0
        self._queue_files = 0
        self._index_files = 0
        self._queues_destroyed = 0
        self._last_deleted_ms = 0
        self._error = ""
        self._stuck_said = False

    # --- requests ---------------------------------------------------------------------------
    def delete_now(self) -> None:
        """``executeDeleteFilesManually`` (``mqadmin deleteExpiredCommitLog``): the next
        :data:`MANUAL_DELETE_RUNS` runs delete expired files whatever the hour; the first runs
        now."""
        self._manual_runs = MANUAL_DELETE_RUNS
        log.info("executeDeleteFilesManually was invoked")
        self._wake.set()

    def clean_expired_queues(self) -> int:
        """``cleanExpiredConsumerQueue`` (``mqadmin cleanExpiredCQ``): destroy every consume
        queue whose last message lies below the commit log's min offset (the delay levels'
        queues excepted); returns how many."""
        min_offset = self.commitlog.min_offset
        queues = self.reput.queues
        destroyed = 0
        for queue in queues:
            if queue.topic == SCHEDULE_TOPIC:
                continue
            last = queue.max_physical_offset
            if last == -1:
                log.warning(
                    "maybe ConsumeQueue was created just now. topic=%s queueId=%d "
                    "maxPhysicOffset=%d minLogicOffset=%d.",
                    queue.topic,
                    queue.queue_id,
                    last,
                    queue.min_offset,
                )
            elif last < min_offset:
                log.info(
                    "cleanExpiredConsumerQueue: %s %d consumer queue destroyed, "
                    "minCommitLogOffset: %d maxCLOffsetInConsumeQueue: %d",
                    queue.topic,
                    queue.queue_id,
                    min_offset,
                    last,
                )
                self.commitlog.forget_queue(queue.topic, queue.queue_id)
                queues.destroy(queue.topic, queue.queue_id)
                destroyed += 1
        self._queues_destroyed += destroyed
        return destroyed

    # --- running ----------------------------------------------------------------------------
    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Run retention forever: after :data:`FIRST_RUN_DELAY`, then every
        ``cleanResourceInterval`` or at once on a manual request."""
        task_status.started()
        await self._pause(FIRST_RUN_DELAY)
        while True:
            try:
                await self.run_once()
            except (OSError, StorageError) as exc:
                # RocketMQ logs and goes on ("service has exception"); so does this: a disk
                # that cannot be measured or a file that cannot be read is no reason to stop
                # the broker, and the next run tries again.
                self._error = f"retention run failed: {exc}"
                self._state = "stuck"
                log.error("retention run failed, trying again at the next: %s", exc)
            await self._pause(self.config.clean_resource_interval / 1000)

    async def _pause(self, seconds: float) -> None:
        """Sleep *seconds*, or less if a manual request comes."""
        with trio.move_on_after(seconds):
            await self._wake.wait()
        self._wake = trio.Event()

    async def run_once(self) -> None:
        """One ``cleanFilesPeriodically``: the commit log, then the consume queues and index."""
        self._runs += 1
        await self._clean_commitlog()
        await self._clean_queues()

    async def _clean_commitlog(self) -> None:
        config = self.config
        self.disk.check(await trio.to_thread.run_sync(self.disk.measure))
        warning, clean_forcibly, max_used = config.disk_ratios
        ratios = self.disk.ratios
        space = space_to_delete(
            ratios.get("CL", -1.0),
            ratios.get("CQ", ratios.get("CL", -1.0)),
            max_used=max_used,
            clean_forcibly=clean_forcibly,
            warning=warning,
        )
        time_up = is_time_to_delete(config.delete_hours, self.hour_of(self.wall_clock()))
        run = decide_run(
            time_up=time_up,
            space=space,
            manual=self._manual_runs > 0,
            clean_file_forcibly=config.clean_file_forcibly_enable,
        )
        if run is None:
            self._state = "idle"
            self._stuck_said = False
            return
        if run.manual:
            self._manual_runs -= 1
        deleted = await self._delete_expired(run)
        if deleted:
            # Measured again at once: puts refused for a full disk are taken again now, not at
            # the guard's next check.
            self.disk.check(await trio.to_thread.run_sync(self.disk.measure))
            self._state, self._reason, self._stuck_said = "cleaning", run.describe(), False
            log.info(
                "retention (%s): %d commit log file(s) deleted; the log now starts at %d",
                run.describe(),
                deleted,
                self.commitlog.min_offset,
            )
            return
        if space.space_to_delete:
            self._state = "stuck"
            if not self._stuck_said:
                self._stuck_said = True
                log.warning(
                    "disk of the %s is %.2f used, above diskMaxUsedSpaceRatio %.2f, but no "
                    "commit log file may be deleted: none was last written more than "
                    "fileReservedTime (%d h) ago%s; free space or lower fileReservedTime",
                    "commit log" if space.path == "CL" else "store root",
                    space.ratio,
                    max_used,
                    config.file_reserved_time,
                    ""
                    if config.clean_file_forcibly_enable
                    else " (cleanFileForciblyEnable is off)",
                )
        else:
            self._state = "idle"

    async def _delete_expired(self, run: RetentionRun) -> int:
        """``deleteExpiredFile``: the oldest expired segments, one at a time; how many went."""
        commitlog = self.commitlog
        size = commitlog.segment_size
        deleted = 0
        while deleted < DELETE_FILES_BATCH_MAX:
            now = self.wall_clock()
            # Asked again for every file: the log may have changed during the pause.
            count = expired_count(
                commitlog.segment_times(),
                now_ms=int(now * 1000),
                reserved_ms=self.config.file_reserved_time * HOUR_MS,
                at_once=run.at_once,
                batch_max=DELETE_FILES_BATCH_MAX - deleted,
            )
            if count == 0:
                break
            first = commitlog.min_offset - commitlog.min_offset % size
            released = commitlog.release_segments_before(first + size)
            try:
                await trio.to_thread.run_sync(released.destroy)
            except StorageError as exc:
                self._error = str(exc)
                self._state = "stuck"
                log.error(
                    "retention could not delete a commit log file: %s; the log starts at %d "
                    "now, and the files left are part of it again at the next start",
                    exc,
                    released.min_offset,
                )
                return deleted
            deleted += 1
            self._segments += 1
            self._bytes += size
            self._last_deleted_ms = int(now * 1000)
            interval = self.config.delete_commit_log_files_interval / 1000
            if count > 1 and interval > 0:
                await trio.sleep(interval)
        return deleted

    async def _clean_queues(self) -> None:
        """``CleanConsumeQueueService.deleteExpiredFiles``, once the commit log's min moved."""
        min_offset = self.commitlog.min_offset
        if min_offset <= self._last_min:
            return
        self._last_min = min_offset
        interval = self.config.delete_consume_queue_files_interval / 1000
        for queue in self.reput.queues:
            try:
                deleted = queue.delete_expired(min_offset)
            except OSError as exc:
                log.error(
                    "consume queue %s/%d: old files could not be deleted: %s",
                    queue.topic,
                    queue.queue_id,
                    exc,
                )
                self._error = f"consume queue {queue.topic}/{queue.queue_id}: {exc}"
                continue
            self._queue_files += deleted
            if deleted and interval > 0:
                await trio.sleep(interval)
        self._index_files += await self.reput.delete_expired_index(min_offset)

    def statistics(self) -> RetentionStatistics:
        return RetentionStatistics(
            state=self._state,
            reason=self._reason,
            runs=self._runs,
            manual_runs_left=self._manual_runs,
            segments_deleted=self._segments,
            bytes_deleted=self._bytes,
            consume_queue_files_deleted=self._queue_files,
            index_files_deleted=self._index_files,
            consume_queues_destroyed=self._queues_destroyed,
            last_deleted_ms=self._last_deleted_ms,
            last_error=self._error,
        )
