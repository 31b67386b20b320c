"""Disk space guards: when the store stops taking writes, and when it takes them again.

Mirrors ``DefaultMessageStore``'s ``isSpaceFull`` check and ``RunningFlags``:

* every ``cleanResourceInterval`` the used fraction of the partition holding the commit log
  is measured the way ``UtilAll.getDiskPartitionSpaceUsedPercent`` measures it (blocks
  reserved for root do not count as free; the value is rounded up to whole percent);
* above ``diskSpaceWarningLevelRatio`` (0.90) the DISK_FULL flag is set and puts are refused
  with ``SERVICE_NOT_AVAILABLE``; at or below it the flag is cleared on the next check, with
  no restart and no admin command;
* above ``diskMaxUsedSpaceRatio`` (0.75) retention deletes expired commit log files at once,
  and above ``diskSpaceCleanForciblyRatio`` (0.85) with ``cleanFileForciblyEnable`` the oldest
  whatever their age (``trioha.broker._retention``, which also measures through this guard);
  each crossing is said once at WARNING.

A write that *fails* (``OSError``: ENOSPC, EIO, a read-only remount) is the other signal, the
counterpart of RocketMQ's WRITE_LOGICS_QUEUE_ERROR bit: the writer reports it with
:meth:`DiskGuard.failed` and, for the commit log and the consume queues, puts are refused
until the writer succeeds again. Unlike RocketMQ, which never clears that bit by itself,
every check lets one attempt through (a put or the writer's own retry), so the broker resumes
on its own once space is back. Each state change is logged once, when it flips.

The guard does no IO of its own beyond ``statvfs``; it is driven by the broker's watch task.
"""

from __future__ import annotations

import enum
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

__all__ = ["DiskGuard", "DiskLevel", "DiskStatistics", "used_ratio"]

log = logging.getLogger("trioha.store.disk")


def used_ratio(path: str | os.PathLike[str]) -> float:
    """``UtilAll.getDiskPartitionSpaceUsedPercent``: a multiple of 0.01, or -1 if unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    free = st.f_bfree * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    used = total - free
    entire = used + usable
    if total <= 0 or entire <= 0:
        return -1.0
    return math.ceil(used * 100 / entire) / 100


class DiskLevel(enum.Enum):
    """Where the commit log's partition stands against the three ratios."""

    OK = "ok"
    ABOVE_MAX_USED = "above diskMaxUsedSpaceRatio"
    ABOVE_CLEAN_FORCIBLY = "above diskSpaceCleanForciblyRatio"
    FULL = "above diskSpaceWarningLevelRatio"


@attrs.frozen
class DiskStatistics:
    """The guard's state (part of ``Broker.statistics()`` and of ``status``)."""

    writable: bool
    level: str
    #: Used fraction per store path (``CL``, ``CQ``), as RocketMQ reports them.
    commitlog_ratio: float
    consumequeue_ratio: float
    #: The writers failing now and their last error, ``"what: error; ..."`` ("" if none).
    failures: str


@attrs.define
class _Failure:
    error: str
    blocks_puts: bool
    #: One attempt may go through (set at each check): the writer or a put tries again.
    retry: bool = False


#: What a failing writer calls itself in logs and in ``DiskStatistics.failures``.
COMMIT_LOG = "commit log"
COMMIT_LOG_FLUSH = "commit log flush"
CONSUME_QUEUE = "consume queues"
CONSUME_QUEUE_CHECKPOINT = "consume queue checkpoint"
MESSAGE_INDEX = "message index"
METADATA = "metadata files"
SENT_MARK = "HA sent mark"
ACKED_MARK = "acknowledged mark"


class DiskGuard:
    """DISK_FULL and the write-error flags of one store; see the module docstring."""

    def __init__(
        self,
        paths: Mapping[str, Path],
        *,
        warning_ratio: float = 0.90,
        clean_forcibly_ratio: float = 0.85,
        max_used_ratio: float = 0.75,
        measure: Callable[[Path], float] = used_ratio,
        master: bool = True,
    ) -> None:
        self.paths = dict(paths)
        #: A slave ignores DISK_FULL (``appendToCommitLog`` only checks for shutdown): it
        #: appends replicated data until a write fails, and its log lines say so.
        self.master = master
        self.warning_ratio = warning_ratio
        self.clean_forcibly_ratio = clean_forcibly_ratio
        self.max_used_ratio = max_used_ratio
        #: What measures one path's used fraction (``statvfs``; a test swaps in a fake).
        self.probe = measure
        self.ratios: dict[str, float] = dict.fromkeys(self.paths, 0.0)
        self.level = DiskLevel.OK
        self._failures: dict[str, _Failure] = {}
        #: Puts refused because of this guard (for tests and ``status``).
        self.refused = 0

    # --- state ------------------------------------------------------------------------------
    @property
    def disk_full(self) -> bool:
        return self.level is DiskLevel.FULL

    @property
    def writable(self) -> bool:
        """``RunningFlags.isWriteable``: no DISK_FULL and no failing writer blocking puts."""
        if self.disk_full:
            return False
        return not any(f.blocks_puts and not f.retry for f in self._failures.values())

    def failing(self, what: str) -> bool:
        return what in self._failures

    def describe(self) -> str:
        """Why puts are refused, for a log line or a response remark ("" when writable)."""
        parts = []
        if self.disk_full:
            parts.append(
                f"the disk is {self.ratios.get('CL', -1):.2f} used, above "
                f"diskSpaceWarningLevelRatio {self.warning_ratio:.2f}"
            )
        parts += [f"{what} cannot be written ({f.error})" for what, f in self._failures.items()]
        return "; ".join(parts)

    def ratio_remark(self) -> str:
        """RocketMQ's bracket in the SERVICE_NOT_AVAILABLE remark: ``CL: 0.93 CQ: 0.93 ...``."""
        cl = self.ratios.get("CL", -1.0)
        cq = self.ratios.get("CQ", cl)
        return f"CL: {cl:5.2f} CQ: {cq:5.2f} INDEX: {cq:5.2f}"

    # --- inputs -----------------------------------------------------------------------------
    def measure(self) -> dict[str, float]:
        """Measure every path (blocking ``statvfs``: call it from a worker thread)."""
        return {name: self.probe(path) for name, path in self.paths.items()}

    def check(self, ratios: Mapping[str, float]) -> None:
        """Apply a measurement (``isSpaceFull``) and open one retry for failing writers."""
        self.ratios.update(ratios)
        ratio = ratios.get("CL", -1.0)
        if ratio > self.warning_ratio:
            level = DiskLevel.FULL
        elif ratio > self.clean_forcibly_ratio:
            level = DiskLevel.ABOVE_CLEAN_FORCIBLY
        elif ratio > self.max_used_ratio:
            level = DiskLevel.ABOVE_MAX_USED
        else:
            level = DiskLevel.OK
        if level is not self.level:
            self._flip(self.level, level, ratio)
            self.level = level
        for failure in self._failures.values():
            failure.retry = True

    def _flip(self, old: DiskLevel, new: DiskLevel, ratio: float) -> None:
        where = self.paths.get("CL")
        if new is DiskLevel.FULL:
            log.error(
                "disk of the commit log (%s) is %.2f used, above diskSpaceWarningLevelRatio "
                "%.2f: %s",
                where,
                ratio,
                self.warning_ratio,
                "puts are refused (SERVICE_NOT_AVAILABLE) until it is at or below"
                if self.master
                else "the slave appends replicated data until a write fails; free space",
            )
        elif new is DiskLevel.OK:
            log.info("disk of the commit log (%s) is %.2f used: back to normal", where, ratio)
        else:
            threshold = (
                self.clean_forcibly_ratio
                if new is DiskLevel.ABOVE_CLEAN_FORCIBLY
                else self.max_used_ratio
            )
            log.warning(
                "disk of the commit log (%s) is %.2f used, %s %.2f%s; retention deletes old "
                "commit log files at its next run; puts are refused above %.2f",
                where,
                ratio,
                new.value,
                threshold,
                "; puts are accepted again" if old is DiskLevel.FULL else "",
                self.warning_ratio,
            )

    def failed(
        self, what: str, exc: BaseException, *, blocks_puts: bool = True, effect: str = ""
    ) -> None:
        """A writer's attempt failed with *exc*; logged at ERROR once per failure spell.

        *effect* says what stops meanwhile (for a writer whose failure does not refuse puts:
        ``"replication to slaves is paused at 1024"``).
        """
        message = _one_line(exc)
        failure = self._failures.get(what)
        if failure is None:
            self._failures[what] = _Failure(message, blocks_puts)
            if blocks_puts:
                effect = "puts are refused (SERVICE_NOT_AVAILABLE)" + (
                    f" and {effect}" if effect else ""
                )
            log.error(
                "%s cannot be written: %s; %sretrying every check until it works",
                what,
                message,
                f"{effect}; " if effect else "",
            )
            return
        failure.error = message
        failure.retry = False

    def succeeded(self, what: str, resumed: str = "") -> None:
        """A writer's attempt worked; logged once if it had been failing (*resumed* says
        what goes on again, for a writer whose failure did not refuse puts)."""
        failure = self._failures.pop(what, None)
        if failure is not None:
            if resumed and not failure.blocks_puts:
                now = resumed
            else:
                now = "puts accepted" if self.writable else self.describe()
            log.warning("%s written again; %s", what, now)

    def retry_due(self, what: str) -> bool:
        """Whether a failing writer may try again now (always True for a healthy one)."""
        failure = self._failures.get(what)
        return failure is None or failure.retry

    def statistics(self) -> DiskStatistics:
        cl = self.ratios.get("CL", -1.0)
        return DiskStatistics(
            writable=self.writable,
            level=self.level.value,
            commitlog_ratio=cl,
            consumequeue_ratio=self.ratios.get("CQ", cl),
            failures="; ".join(f"{what}: {f.error}" for what, f in self._failures.items()),
        )


def _one_line(exc: BaseException) -> str:
    """*exc*'s message, with the OSError behind it when the message does not show it."""
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.strerror and cause.strerror not in text:
        text = f"{text} ({cause.strerror})"
    return text
