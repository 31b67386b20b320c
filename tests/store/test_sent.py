"""The classic master's durable marks: what it may have sent, what was surely flushed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trioha import DamagedLogError, StoreLayoutError
from trioha.net._divergence import open_master_history
from trioha.store import open_store
from trioha.store._sent import SENT_OFFSET_FILE, SentOffsets

SEG = 4096


def test_reserving_writes_ahead_and_a_clean_close_writes_the_exact_figure(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    assert (sent.reserved, sent.lost) == (0, ())
    assert sent.needs_reserve(10)
    sent.reserve(10)
    assert SentOffsets.open(tmp_path).reserved == 1010  # durable before anything is sent
    assert not sent.needs_reserve(1010)
    sent.note_sent(700)
    sent.close()
    assert SentOffsets.open(tmp_path).reserved == 700


def test_a_recovered_end_below_the_mark_is_a_lost_range_kept_for_good(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    sent.reserve(500)
    assert sent.note_recovered_end(300) == (300, 1500)
    again = SentOffsets.open(tmp_path)
    assert again.lost == ((300, 1500),)
    assert again.note_recovered_end(2000) is None  # nothing new lost
    assert SentOffsets.open(tmp_path).lost == ((300, 1500),)


def test_an_unreadable_mark_file_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / SENT_OFFSET_FILE).write_text("sent 12\nlost 5 x\n")
    with pytest.raises(StoreLayoutError, match="line 2"):
        SentOffsets.open(tmp_path)


def test_the_flushed_mark_is_written_at_most_once_a_second(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path)
    sent.note_flushed(100, now=10.0)
    sent.note_flushed(200, now=10.5)
    assert SentOffsets.open(tmp_path).flushed == 100
    sent.note_flushed(300, now=11.0)
    assert SentOffsets.open(tmp_path).flushed == 300


def fill(root: Path, n: int) -> list[int]:
    with open_store(root, segment_size=SEG) as store:
        return [
            store.commitlog.append(topic="FooBar", body=b"x" * 100).physical_offset
            for _ in range(n)
        ]


def test_a_master_that_lost_sent_bytes_starts_its_new_history_past_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    offsets = fill(tmp_path, 15)  # all in the first segment
    sent = SentOffsets.open(tmp_path, step=10)
    sent.reserve(offsets[12])  # sent up to record 25, then (say) the tail was lost
    with open_store(tmp_path, segment_size=SEG) as store:
        store.commitlog.truncate(offsets[8])
    with open_store(tmp_path, segment_size=SEG) as store, caplog.at_level(logging.ERROR):
        history = open_master_history(store)
        assert history.lost == ((offsets[8], offsets[12] + 10),)
        assert store.commitlog.max_offset == SEG  # the next segment boundary past the range
        assert f"[{offsets[8]}, {offsets[12] + 10})" in caplog.text
        assert "--truncate-to-master" in caplog.text
        assert store.commitlog.append(topic="FooBar", body=b"new").physical_offset == SEG
    with open_store(tmp_path, segment_size=SEG) as store:  # a restart: nothing new lost
        history = open_master_history(store)
        assert history.lost == ((offsets[8], offsets[12] + 10),)
        assert store.commitlog.max_offset > SEG


def test_a_master_refuses_to_start_on_a_log_cut_below_what_was_flushed(tmp_path: Path) -> None:
    offsets = fill(tmp_path, 15)
    SentOffsets.open(tmp_path).note_flushed(offsets[14], now=0.0)
    # Damage in the middle of the log: recovery cuts from there on.
    with (tmp_path / "commitlog" / f"{0:020d}").open("r+b") as f:
        f.seek(offsets[10] + 4)
        f.write(b"\xde\xad\xbe\xef")
    (tmp_path / "abort").touch()
    with open_store(tmp_path, segment_size=SEG) as store:
        damaged = rf"ends at {offsets[10]}, below {offsets[14]}.*lost\+found"
        with pytest.raises(DamagedLogError, match=damaged):
            open_master_history(store)
        assert store.commitlog.max_offset == offsets[10]
    with open_store(tmp_path, segment_size=SEG) as store:
        history = open_master_history(store, accept_damaged=True)
        assert history.flushed == offsets[10]
        assert store.commitlog.max_offset == offsets[10]
