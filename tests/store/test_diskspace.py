"""The disk guard: DefaultMessageStore.isSpaceFull and RunningFlags, as pure decisions."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from trioha._config import BrokerConfig
from trioha.store._diskspace import COMMIT_LOG, METADATA, DiskGuard, DiskLevel, used_ratio


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
