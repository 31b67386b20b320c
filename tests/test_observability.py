"""Latency histograms, JSON log lines and progress reports: what an operator reads."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from trioha._histogram import LatencyHistogram
from trioha._logging import configure_logging
from trioha._progress import Progress, human_bytes


def test_a_histogram_counts_each_observation_in_its_bucket_cumulatively() -> None:
    h = LatencyHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.002, 0.05, 0.05, 3.0):
        h.observe(seconds)
    snap = h.snapshot()
    assert snap.buckets == ((0.001, 2), (0.01, 3), (0.1, 5), (float("inf"), 6))
    assert snap.count == 6
    assert snap.sum == pytest.approx(3.1035)
    with pytest.raises(ValueError, match="strictly increasing"):
        LatencyHistogram((0.1, 0.01))


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_are_one_object_per_line_with_the_structured_fields() -> None:
    out = io.StringIO()
    configure_logging(fmt="json", stream=out)
    log = logging.getLogger("trioha.net")
    log.warning(
        "slave %s refused",
        "10.0.0.2:5000",
        extra={"peer": "10.0.0.2:5000", "offset": 1024, "reason": "diverged"},
    )
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        log.exception("append failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "WARNING" and first["logger"] == "trioha.net"
    assert first["message"] == "slave 10.0.0.2:5000 refused"
    assert (first["peer"], first["offset"], first["reason"]) == ("10.0.0.2:5000", 1024, "diverged")
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert "No space left on device" in second["exc"]


@pytest.mark.usefixtures("restore_logging")
def test_text_logs_stay_the_default_and_a_wrong_format_is_refused() -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    logging.getLogger("trioha").info("hello")
    assert out.getvalue().rstrip().endswith("INFO    trioha: hello")
    with pytest.raises(ValueError, match="text, json"):
        configure_logging(fmt="xml")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_off_a_terminal_logs_a_line_per_interval_with_rate_and_eta(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    caplog.set_level(logging.INFO, "trioha.progress")
    with Progress(
        "slave catch-up", total=1 << 30, interval=10, clock=clock, terminal=False
    ) as progress:
        clock.now = 5
        progress.set(256 << 20)  # before the interval: no line
        assert caplog.messages == []
        clock.now = 10
        progress.set(512 << 20)
        clock.now = 20
        progress.update(512 << 20)
    assert caplog.messages[0] == (
        "slave catch-up: 512.0 MiB of 1.0 GiB (50%), 51.2 MiB/s, ETA 10.0 s"
    )
    assert caplog.messages[1] == "slave catch-up: 1.0 GiB of 1.0 GiB (100%), 51.2 MiB/s"
    assert caplog.messages[2].endswith("(done in 20.0 s)")


def test_progress_on_a_terminal_draws_a_bar() -> None:
    out = io.StringIO()
    progress = Progress("recovery", total=10, unit="segments", terminal=True, stream=out)
    progress.update(4)
    progress.close()
    assert "recovery" in out.getvalue() and "4/10" in out.getvalue()


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (12, 2048, 5 << 20, 3 << 40)] == [
        "12 B",
        "2.0 KiB",
        "5.0 MiB",
        "3.0 TiB",
    ]


def test_store_recovery_reports_segments_scanned(tmp_path: Path) -> None:
    from trioha.store import NewMessage, open_store

    with open_store(tmp_path, segment_size=64 << 10) as store:
        while store.commitlog.max_offset < 3 * (64 << 10) + 100:
            store.commitlog.append_batch([NewMessage(topic="T", body=b"x" * 1000)] * 16)
    calls: list[tuple[int, int]] = []
    with open_store(tmp_path, recovery_progress=lambda *a: calls.append(a)):
        pass
    assert calls  # a clean start scans the last segments only
    assert calls[-1][0] == calls[-1][1] and calls == sorted(calls)
    (tmp_path / "abort").touch()  # after a crash: every segment
    calls.clear()
    with open_store(tmp_path, recovery_progress=lambda *a: calls.append(a)):
        pass
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
