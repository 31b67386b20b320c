"""The disk guard: DefaultMessageStore.isSpaceFull and RunningFlags, as pure decisions."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from trioha._config import BrokerConfig
from trioha.store._diskspace import (
    COMMIT_LOG,
    COMMIT_LOG_FLUSH,
    CONSUME_QUEUE,
    METADATA,
    DiskGuard,
    DiskLevel,
    DiskStatistics,
    used_ratio,
)

DISK = "trioha.store.disk"


def guard() -> DiskGuard:
    return DiskGuard({"CL": Path("/cl"), "CQ": Path("/root")})


def writable(g: DiskGuard) -> bool:
    """``g.writable``, read afresh (mypy would carry an earlier assert's narrowing over)."""
    return g.writable


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_used_ratio_is_a_whole_percent_and_minus_one_for_a_missing_path(tmp_path: Path) -> None:
    ratio = used_ratio(tmp_path)
    assert 0 <= ratio <= 1
    assert round(ratio * 100, 6) == round(ratio * 100)
    assert used_ratio(tmp_path / "missing") == -1.0


@pytest.mark.parametrize(
    ("ratio", "level", "writable"),
    [
        (0.50, DiskLevel.OK, True),
        (0.76, DiskLevel.ABOVE_MAX_USED, True),
        (0.86, DiskLevel.ABOVE_CLEAN_FORCIBLY, True),
        (0.90, DiskLevel.ABOVE_CLEAN_FORCIBLY, True),  # "> 0.90": exactly 0.90 still writes
        (0.91, DiskLevel.FULL, False),
        (-1.0, DiskLevel.OK, True),
    ],
)
def test_levels_follow_rocketmq_thresholds(ratio: float, level: DiskLevel, writable: bool) -> None:
    g = guard()
    g.check({"CL": ratio, "CQ": ratio})
    assert g.level is level
    assert g.writable is writable


def test_disk_full_flips_are_logged_once_each_way(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    g = guard()
    for ratio in (0.95, 0.96, 0.99, 0.95):
        g.check({"CL": ratio})
    assert not writable(g)
    for ratio in (0.50, 0.40):
        g.check({"CL": ratio})
    assert writable(g)  # no restart, no admin command
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert len(messages) == 2
    assert messages[0][0] == logging.ERROR and "diskSpaceWarningLevelRatio 0.90" in messages[0][1]
    assert messages[1][0] == logging.INFO and "back to normal" in messages[1][1]


def test_a_failing_writer_blocks_puts_until_a_retry_works(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = guard()
    g.failed(COMMIT_LOG, enospc())
    assert not writable(g) and "No space left on device" in g.describe()
    g.check({"CL": 0.5})  # a check lets one attempt through ...
    assert writable(g)
    g.failed(COMMIT_LOG, enospc())  # ... which fails: closed again, without a new ERROR
    assert not writable(g)
    g.check({"CL": 0.5})
    g.succeeded(COMMIT_LOG)
    assert writable(g) and not g.failing(COMMIT_LOG)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert any("written again" in r.getMessage() for r in caplog.records)


def test_a_failing_metadata_writer_is_reported_but_does_not_stop_puts() -> None:
    g = guard()
    g.failed(METADATA, enospc(), blocks_puts=False)
    assert writable(g)
    assert "metadata files: [Errno 28]" in g.statistics().failures


def test_the_remark_bracket_is_rocketmqs() -> None:
    g = guard()
    g.check({"CL": 0.93, "CQ": 0.5})
    assert g.ratio_remark() == "CL:  0.93 CQ:  0.50 INDEX:  0.50"


def test_ratios_come_from_the_config_with_max_used_clamped() -> None:
    config = BrokerConfig(disk_max_used_space_ratio=99, disk_space_warning_level_ratio=80)
    assert config.disk_ratios == (0.80, 0.85, 0.95)
    assert BrokerConfig(disk_max_used_space_ratio=1).disk_ratios[2] == 0.10


def test_a_full_disk_and_failing_writers_are_all_described() -> None:
    g = guard()
    g.check({"CL": 0.95})
    g.failed(COMMIT_LOG, enospc())
    assert g.describe() == (
        "the disk is 0.95 used, above diskSpaceWarningLevelRatio 0.90; "
        f"{COMMIT_LOG} cannot be written ([Errno 28] No space left on device)"
    )


def test_a_failing_writer_retries_once_per_check() -> None:
    g = guard()
    assert g.retry_due(COMMIT_LOG)  # a healthy writer always may
    g.failed(COMMIT_LOG, enospc())
    assert not g.retry_due(COMMIT_LOG)
    g.check({"CL": 0.5})
    assert g.retry_due(COMMIT_LOG)
    g.failed(COMMIT_LOG, enospc())
    assert not g.retry_due(COMMIT_LOG)


def test_a_failure_names_the_os_error_behind_it() -> None:
    g = guard()
    try:
        try:
            raise enospc()
        except OSError as exc:
            raise RuntimeError("append of 120 bytes failed") from exc
    except RuntimeError as wrapped:
        g.failed(COMMIT_LOG, wrapped)
    assert g.statistics().failures == (
        f"{COMMIT_LOG}: append of 120 bytes failed (No space left on device)"
    )
    g.failed(METADATA, RuntimeError(), blocks_puts=False)
    assert f"{METADATA}: RuntimeError" in g.statistics().failures


def test_a_filesystem_reporting_no_blocks_has_an_unknown_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.statvfs(tmp_path)
    empty = os.statvfs_result((real.f_bsize, real.f_frsize, 0, 0, 0, *real[5:]))
    monkeypatch.setattr(os, "statvfs", lambda path: empty)
    assert used_ratio(tmp_path) == -1.0


def statvfs_of(
    blocks: int, bfree: int, bavail: int, *, frsize: int = 4096, bsize: int = 512
) -> os.statvfs_result:
    """A ``statvfs`` answer; *bsize* differs from *frsize* so mixing them up shows."""
    return os.statvfs_result((bsize, frsize, blocks, bfree, bavail, 0, 0, 0, 0, 255))


@pytest.mark.parametrize(
    ("blocks", "bfree", "bavail", "ratio"),
    [
        # 900 used of 950 a non-root user can have: 94.7% rounds up to 0.95
        (1000, 100, 50, 0.95),
        # root's reserve is not free: 500 used of 500 + 400 usable is 55.6% -> 0.56
        (1000, 500, 400, 0.56),
        # exactly 80%: no rounding up past it
        (1000, 200, 200, 0.80),
        (1000, 1000, 1000, 0.0),
        # nothing used and nothing usable (all reserved): unknown, not a division by zero
        (1000, 1000, 0, -1.0),
    ],
)
def test_used_ratio_counts_roots_reserve_as_used_and_rounds_up(
    monkeypatch: pytest.MonkeyPatch, blocks: int, bfree: int, bavail: int, ratio: float
) -> None:
    seen: list[object] = []

    def fake_statvfs(path: object) -> os.statvfs_result:
        seen.append(path)
        return statvfs_of(blocks, bfree, bavail)

    monkeypatch.setattr(os, "statvfs", fake_statvfs)
    assert used_ratio("/store/commitlog") == ratio
    assert seen == ["/store/commitlog"]


def test_used_ratio_scales_blocks_by_the_fragment_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: statvfs_of(3, 1, 1, frsize=1, bsize=4096))
    assert used_ratio("/x") == 0.67  # 2 used of 3: 66.7% rounds up


def test_used_ratio_of_the_smallest_partition_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: statvfs_of(1, 0, 0, frsize=1))
    assert used_ratio("/x") == 1.0  # one byte, used: full, not unknown


def test_used_ratio_of_a_partition_with_no_blocks_but_usable_space_is_unknown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: statvfs_of(0, 0, 10))
    assert used_ratio("/x") == -1.0


def test_the_defaults_are_rocketmqs_ratios_and_a_master() -> None:
    g = guard()
    assert (g.warning_ratio, g.clean_forcibly_ratio, g.max_used_ratio) == (0.90, 0.85, 0.75)
    assert g.master is True
    assert g.paths == {"CL": Path("/cl"), "CQ": Path("/root")}
    assert g.ratios == {"CL": 0.0, "CQ": 0.0}
    assert g.level is DiskLevel.OK and g.refused == 0
    assert g.statistics() == DiskStatistics(
        writable=True, level="ok", commitlog_ratio=0.0, consumequeue_ratio=0.0, failures=""
    )


@pytest.mark.parametrize(
    ("ratio", "level"),
    [
        (0.75, DiskLevel.OK),
        (0.751, DiskLevel.ABOVE_MAX_USED),
        (0.85, DiskLevel.ABOVE_MAX_USED),
        (0.851, DiskLevel.ABOVE_CLEAN_FORCIBLY),
        (0.90, DiskLevel.ABOVE_CLEAN_FORCIBLY),
        (0.901, DiskLevel.FULL),
    ],
)
def test_each_threshold_is_strictly_above(ratio: float, level: DiskLevel) -> None:
    g = guard()
    g.check({"CL": ratio})
    assert g.level is level


def test_a_guard_measures_every_path_with_its_measure() -> None:
    g = DiskGuard(
        {"CL": Path("/a"), "CQ": Path("/b")}, measure=lambda p: {"/a": 0.5, "/b": 0.7}[str(p)]
    )
    assert g.measure() == {"CL": 0.5, "CQ": 0.7}


def test_the_default_measure_is_statvfs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "statvfs", lambda path: statvfs_of(1000, 100, 50))
    assert DiskGuard({"CL": Path("/cl")}).measure() == {"CL": 0.95}


def above_line(
    ratio: str, ratio_name: str, threshold: str, warning: str, *, again: bool = False
) -> str:
    """The WARNING an operator reads when the commit log's disk passes a cleaning ratio."""
    return (
        f"disk of the commit log (/cl) is {ratio} used, above {ratio_name} {threshold}"
        + ("; puts are accepted again" if again else "")
        + "; retention deletes old commit log files at its next run; puts are refused above "
        + warning
    )


def full_line(ratio: str, warning: str) -> str:
    return (
        f"disk of the commit log (/cl) is {ratio} used, above diskSpaceWarningLevelRatio "
        f"{warning}: puts are refused (SERVICE_NOT_AVAILABLE) until it is at or below"
    )


def test_configured_ratios_decide_the_levels_and_the_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    g = DiskGuard(
        {"CL": Path("/cl")}, warning_ratio=0.60, clean_forcibly_ratio=0.50, max_used_ratio=0.40
    )
    levels = []
    for ratio in (0.41, 0.51, 0.61, 0.40):
        g.check({"CL": ratio})
        levels.append(g.level)
    assert levels == [
        DiskLevel.ABOVE_MAX_USED,
        DiskLevel.ABOVE_CLEAN_FORCIBLY,
        DiskLevel.FULL,
        DiskLevel.OK,
    ]
    assert [m for _, _, m in caplog.record_tuples] == [
        above_line("0.41", "diskMaxUsedSpaceRatio", "0.40", "0.60"),
        above_line("0.51", "diskSpaceCleanForciblyRatio", "0.50", "0.60"),
        full_line("0.61", "0.60"),
        "disk of the commit log (/cl) is 0.40 used: back to normal",
    ]


def test_every_level_change_is_logged_once_with_its_exact_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    g = guard()
    for ratio in (0.80, 0.82, 0.87, 0.88, 0.95, 0.97, 0.86, 0.76, 0.50, 0.95, 0.80):
        g.check({"CL": ratio})
    assert caplog.record_tuples == [
        (DISK, logging.WARNING, above_line("0.80", "diskMaxUsedSpaceRatio", "0.75", "0.90")),
        (DISK, logging.WARNING, above_line("0.87", "diskSpaceCleanForciblyRatio", "0.85", "0.90")),
        (DISK, logging.ERROR, full_line("0.95", "0.90")),
        (
            DISK,
            logging.WARNING,
            above_line("0.86", "diskSpaceCleanForciblyRatio", "0.85", "0.90", again=True),
        ),
        (DISK, logging.WARNING, above_line("0.76", "diskMaxUsedSpaceRatio", "0.75", "0.90")),
        (DISK, logging.INFO, "disk of the commit log (/cl) is 0.50 used: back to normal"),
        (DISK, logging.ERROR, full_line("0.95", "0.90")),
        (
            DISK,
            logging.WARNING,
            above_line("0.80", "diskMaxUsedSpaceRatio", "0.75", "0.90", again=True),
        ),
    ]


def test_a_full_slave_says_it_keeps_appending(caplog: pytest.LogCaptureFixture) -> None:
    g = DiskGuard({"CL": Path("/slave/cl")}, master=False)
    g.check({"CL": 0.93})
    assert caplog.record_tuples == [
        (
            DISK,
            logging.ERROR,
            "disk of the commit log (/slave/cl) is 0.93 used, above diskSpaceWarningLevelRatio "
            "0.90: the slave appends replicated data until a write fails; free space",
        )
    ]


def test_a_check_without_the_commit_log_ratio_is_unknown_and_keeps_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    g = guard()
    g.check({"CL": 0.95, "CQ": 0.93})
    g.check({"CQ": 0.40})  # no CL measure: -1, not full
    assert g.level is DiskLevel.OK
    assert g.ratios == {"CL": 0.95, "CQ": 0.40}
    assert writable(g)
    assert caplog.records[-1].getMessage() == (
        "disk of the commit log (/cl) is -1.00 used: back to normal"
    )


def test_statistics_show_ratios_level_and_failures_exactly() -> None:
    g = guard()
    g.check({"CL": 0.95, "CQ": 0.93})
    g.failed(COMMIT_LOG, enospc())
    g.failed(METADATA, OSError(errno.EIO, "Input/output error"), blocks_puts=False)
    assert g.statistics() == DiskStatistics(
        writable=False,
        level="above diskSpaceWarningLevelRatio",
        commitlog_ratio=0.95,
        consumequeue_ratio=0.93,
        failures=f"{COMMIT_LOG}: [Errno 28] No space left on device; "
        f"{METADATA}: [Errno 5] Input/output error",
    )


def test_statistics_and_remark_without_measures_fall_back() -> None:
    only_cl = DiskGuard({"CL": Path("/cl")})
    only_cl.check({"CL": 0.77})
    stats = only_cl.statistics()
    assert (stats.commitlog_ratio, stats.consumequeue_ratio) == (0.77, 0.77)
    assert stats.level == "above diskMaxUsedSpaceRatio"
    assert only_cl.ratio_remark() == "CL:  0.77 CQ:  0.77 INDEX:  0.77"
    nothing = DiskGuard({})
    stats = nothing.statistics()
    assert (stats.commitlog_ratio, stats.consumequeue_ratio) == (-1.0, -1.0)
    assert nothing.ratio_remark() == "CL: -1.00 CQ: -1.00 INDEX: -1.00"


def test_a_full_disk_without_a_commit_log_ratio_is_described_as_unknown() -> None:
    g = DiskGuard({}, warning_ratio=0.5)
    g.level = DiskLevel.FULL
    assert g.describe() == "the disk is -1.00 used, above diskSpaceWarningLevelRatio 0.50"


def test_a_writable_guard_describes_nothing() -> None:
    g = guard()
    g.check({"CL": 0.88})
    assert g.describe() == ""


def test_the_first_failure_is_logged_exactly_and_later_ones_update_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = guard()
    g.failed(COMMIT_LOG, enospc())
    g.failed(METADATA, enospc(), blocks_puts=False)
    g.check({"CL": 0.5})
    g.failed(COMMIT_LOG, OSError(errno.EROFS, "Read-only file system"))
    assert g.statistics().failures == (
        f"{COMMIT_LOG}: [Errno 30] Read-only file system; "
        f"{METADATA}: [Errno 28] No space left on device"
    )
    assert g.retry_due(COMMIT_LOG) is False  # a bool, as annotated
    assert g.retry_due(METADATA) is True
    assert caplog.record_tuples == [
        (
            DISK,
            logging.ERROR,
            "commit log cannot be written: [Errno 28] No space left on device; puts are refused "
            "(SERVICE_NOT_AVAILABLE); retrying every check until it works",
        ),
        (
            DISK,
            logging.ERROR,
            "metadata files cannot be written: [Errno 28] No space left on device; retrying "
            "every check until it works",
        ),
    ]


def test_a_recovered_writer_says_whether_puts_are_accepted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    g = guard()
    g.failed(COMMIT_LOG, enospc())
    g.failed(CONSUME_QUEUE, enospc())
    caplog.clear()
    g.succeeded(COMMIT_LOG)
    assert g.failing(CONSUME_QUEUE) and not g.failing(COMMIT_LOG)
    g.succeeded(CONSUME_QUEUE)
    g.succeeded(CONSUME_QUEUE)  # healthy already: nothing more to say
    assert caplog.record_tuples == [
        (
            DISK,
            logging.WARNING,
            "commit log written again; consume queues cannot be written "
            "([Errno 28] No space left on device)",
        ),
        (DISK, logging.WARNING, "consume queues written again; puts accepted"),
    ]


def test_a_failure_whose_message_already_names_the_os_error_is_not_repeated() -> None:
    g = guard()
    try:
        try:
            raise enospc()
        except OSError:
            raise RuntimeError("append failed: No space left on device") from None
    except RuntimeError as wrapped:
        wrapped.__cause__ = enospc()
        g.failed(COMMIT_LOG, wrapped)
    assert g.statistics().failures == f"{COMMIT_LOG}: append failed: No space left on device"


def test_a_failure_names_the_os_error_it_happened_while_handling() -> None:
    g = guard()
    try:
        try:
            raise enospc()
        except OSError:
            raise RuntimeError("flush failed")  # noqa: B904 - implicit context on purpose
    except RuntimeError as wrapped:
        g.failed(COMMIT_LOG_FLUSH, wrapped)
    assert g.statistics().failures == f"{COMMIT_LOG_FLUSH}: flush failed (No space left on device)"
