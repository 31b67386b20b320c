"""Retention: when old commit log segments go, and which (docs/rocketmq-protocol.md §20).

Pure rules over plain numbers, no IO and no clock: the broker's retention service
(``trioha.broker._retention``) feeds them file times, the hour and the disk guard's last
measurement, and ``model/`` asks the same :func:`expired_count` which segment its
``DeleteSegment`` step may take, so the model checker explores the rule production runs.

Mirrors RocketMQ 4.9.7's ``DefaultMessageStore.CleanCommitLogService`` and
``MappedFileQueue.deleteExpiredFileByTime``:

* a run deletes when the hour is one of ``deleteWhen``'s (:func:`is_time_to_delete`), when
  the disk is above ``diskMaxUsedSpaceRatio`` (:func:`space_to_delete`), or while a manual
  request (``deleteExpiredCommitLog``) lasts: it lasts :data:`MANUAL_DELETE_RUNS` runs;
* it deletes the oldest segments last modified ``fileReservedTime`` hours ago or earlier,
  oldest first, stopping at the first one kept, never the last segment (the one written
  now), at most :data:`DELETE_FILES_BATCH_MAX` per run (:func:`expired_count`);
* with ``cleanFileForciblyEnable``, above ``diskSpaceCleanForciblyRatio`` it deletes them
  whatever their age ("clean at once").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

import attrs

__all__ = [
    "DELETE_FILES_BATCH_MAX",
    "HOUR_MS",
    "MANUAL_DELETE_RUNS",
    "RetentionRun",
    "SpaceCheck",
    "decide_run",
    "expired_count",
    "is_time_to_delete",
    "segment_count",
    "space_to_delete",
]

DELETE_FILES_BATCH_MAX: Final = 10
"""``MappedFileQueue.DELETE_FILES_BATCH_MAX``: the most segments one run deletes."""
MANUAL_DELETE_RUNS: Final = 20
"""``CleanCommitLogService.MAX_MANUAL_DELETE_FILE_TIMES``: runs a manual request lasts."""
HOUR_MS: Final = 3_600_000


def is_time_to_delete(hours: Collection[int], hour: int) -> bool:
    """``isTimeToDelete``: the local hour now is one of ``deleteWhen``'s
    (``BrokerConfig.delete_hours``)."""
    return hour in hours


@attrs.frozen
class SpaceCheck:
    """``isSpaceToDelete``'s verdict on one measurement."""

    #: The disk is above ``diskMaxUsedSpaceRatio`` (or could not be measured): delete.
    space_to_delete: bool
    #: Above ``diskSpaceCleanForciblyRatio``: delete whatever the files' age (with
    #: ``cleanFileForciblyEnable``).
    clean_immediately: bool
    #: Which store path decided (``CL`` the commit log's, ``CQ`` the consume queues'), and its
    #: used fraction.
    path: str
    ratio: float


def space_to_delete(
    commitlog_ratio: float,
    queue_ratio: float,
    *,
    max_used: float,
    clean_forcibly: float,
    warning: float,
) -> SpaceCheck:
    """``CleanCommitLogService.isSpaceToDelete`` on the used fractions (0-1; -1: unknown).

    The commit log's partition is looked at first: above ``max_used`` (or unknown) it decides,
    and the consume queues' partition is not looked at. Otherwise the consume queues'
    partition is judged the same way. "Clean immediately" is set by either partition above
    ``clean_forcibly`` (or ``warning``) on the way.
    """
    immediately = False
    for path, ratio in (("CL", commitlog_ratio), ("CQ", queue_ratio)):
        if ratio > clean_forcibly or ratio > warning:
            immediately = True
        if ratio < 0 or ratio > max_used:
            return SpaceCheck(True, immediately, path, ratio)
    return SpaceCheck(False, immediately, "CL", commitlog_ratio)


@attrs.frozen
class RetentionRun:
    """Why a run deletes (``deleteExpiredFiles``'s log line), and how."""

    #: The hour is one of ``deleteWhen``'s.
    time_up: bool
    #: The disk is above ``diskMaxUsedSpaceRatio``.
    space_full: bool
    #: A manual request (``deleteExpiredCommitLog``) is in force.
    manual: bool
    #: Delete whatever the segments' age (``cleanAtOnce``).
    at_once: bool

    def describe(self) -> str:
        reasons = [
            what
            for what, yes in (
                ("deleteWhen", self.time_up),
                ("disk above diskMaxUsedSpaceRatio", self.space_full),
                ("deleteExpiredCommitLog", self.manual),
            )
            if yes
        ]
        how = "any age (disk above diskSpaceCleanForciblyRatio)" if self.at_once else "expired"
        return f"{', '.join(reasons)}; deleting {how} files"


def decide_run(
    *, time_up: bool, space: SpaceCheck, manual: bool, clean_file_forcibly: bool
) -> RetentionRun | None:
    """``deleteExpiredFiles``: whether this run deletes at all (None: not now), and how."""
    if not (time_up or space.space_to_delete or manual):
        return None
    return RetentionRun(
        time_up=time_up,
        space_full=space.space_to_delete,
        manual=manual,
        at_once=clean_file_forcibly and space.clean_immediately,
    )


def expired_count(
    modified_ms: Sequence[int],
    *,
    now_ms: int,
    reserved_ms: int,
    at_once: bool,
    batch_max: int = DELETE_FILES_BATCH_MAX,
) -> int:
    """How many of the oldest segments may be deleted now (``deleteExpiredFileByTime``).

    *modified_ms* holds every segment's last-modified time, oldest first; the last entry is
    the segment being written, which never goes. A segment goes when it was last modified
    *reserved_ms* ago or earlier, or *at_once*; the count stops at the first segment kept
    (never a hole in the middle of the log) and at *batch_max*.
    """
    count = 0
    for modified in modified_ms[:-1]:
        if count >= batch_max or not (at_once or now_ms >= modified + reserved_ms):
            break
        count += 1
    return count


def segment_count(min_offset: int, max_offset: int, segment_size: int) -> int:
    """The segment files a log holding ``[min_offset, max_offset)`` has: a full last segment
    stays the last until the next append opens another (``getLastMappedFile``)."""
    if max_offset <= min_offset:
        return 0
    first = min_offset - min_offset % segment_size
    return -(-(max_offset - first) // segment_size)
