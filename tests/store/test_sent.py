"""The classic master's durable marks: what it may have sent, what was surely flushed."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from trioha import DamagedLogError, StorageError, StoreLayoutError
from trioha.net import open_master_history
from trioha.store import NewMessage, open_store
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
            store.commitlog.append(NewMessage(topic="FooBar", body=b"x" * 100)).physical_offset
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
    with open_store(tmp_path, segment_size=SEG) as store, caplog.at_level(logging.WARNING):
        history = open_master_history(store)
        assert history.lost == ((offsets[8], offsets[12] + 10),)
        assert store.commitlog.max_offset == SEG  # the next segment boundary past the range
        assert f"[{offsets[8]}, {offsets[12] + 10})" in caplog.text
        assert "--truncate-to-master" in caplog.text
        assert (
            store.commitlog.append(NewMessage(topic="FooBar", body=b"new")).physical_offset == SEG
        )
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


def test_the_reserve_step_must_be_positive(tmp_path: Path) -> None:
    for step in (0, -1):
        with pytest.raises(ValueError, match="reserve step must be positive"):
            SentOffsets.open(tmp_path, step=step)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("sent 12\nlost 9 9\n", r"line 2 \('lost 9 9'\).*empty range 9..9"),
        ("sent 12\nlost -1 5\n", "empty range -1..5"),
        ("sent 12\nsnet 13\n", "unknown entry 'snet'"),
        ("sent 12 13\n", "unknown entry 'sent'"),
    ],
)
def test_mark_file_lines_not_understood_are_refused_by_line(
    tmp_path: Path, text: str, match: str
) -> None:
    (tmp_path / SENT_OFFSET_FILE).write_text(text)
    with pytest.raises(StoreLayoutError, match=match):
        SentOffsets.open(tmp_path)


def test_an_unreadable_mark_file_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / SENT_OFFSET_FILE).mkdir()
    with pytest.raises(StoreLayoutError, match=f"cannot read .*{SENT_OFFSET_FILE}"):
        SentOffsets.open(tmp_path)
    (tmp_path / SENT_OFFSET_FILE).rmdir()
    (tmp_path / SENT_OFFSET_FILE).write_bytes(b"sent \xff\n")
    with pytest.raises(StoreLayoutError, match="cannot read"):
        SentOffsets.open(tmp_path)


def _unwritable(tmp_path: Path) -> Path:
    """Make the mark's temporary file impossible to create (as on a full or broken disk)."""
    temp = tmp_path / (SENT_OFFSET_FILE + ".tmp")
    temp.mkdir()
    return temp


def test_a_reserve_that_cannot_be_written_raises_and_sends_nothing(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    _unwritable(tmp_path)
    with pytest.raises(StorageError, match=f"cannot write .*{SENT_OFFSET_FILE}"):
        sent.reserve(10)
    assert sent.reserved == 0 and sent.needs_reserve(10)


def test_a_flushed_mark_that_cannot_be_written_stays_low_and_is_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sent = SentOffsets.open(tmp_path)
    sent.note_flushed(100, now=10.0)
    temp = _unwritable(tmp_path)
    with caplog.at_level(logging.WARNING):
        sent.note_flushed(200, now=20.0)
        sent.note_flushed(250, now=25.0)  # still failing: not said again every second
    assert sent.flushed == 100
    assert caplog.text.count("the flushed mark stays at 100 for now") == 1
    temp.rmdir()
    with caplog.at_level(logging.INFO):
        sent.note_flushed(300, now=30.0)
    assert SentOffsets.open(tmp_path).flushed == 300
    assert f"{tmp_path / SENT_OFFSET_FILE} written again (flushed mark 300)" in caplog.text


def test_a_close_that_cannot_write_keeps_the_higher_reserved_mark(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    sent.reserve(10)
    sent.note_sent(10)
    _unwritable(tmp_path)
    with caplog.at_level(logging.WARNING):
        sent.close()
    assert "keeping the reserved mark 1010" in caplog.text
    assert sent.reserved == 1010
    assert SentOffsets.open(tmp_path).reserved == 1010  # more careful, never less


def test_a_fresh_mark_is_all_zeros_and_a_close_without_sending_writes_nothing(
    tmp_path: Path,
) -> None:
    sent = SentOffsets.open(tmp_path)
    assert (sent.reserved, sent.sent, sent.flushed, sent.lost) == (0, 0, 0, ())
    sent.close()
    assert not (tmp_path / SENT_OFFSET_FILE).exists()


def test_a_step_of_one_byte_is_allowed(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1)
    sent.reserve(10)
    assert SentOffsets.open(tmp_path).reserved == 11


def test_reserving_what_is_already_reserved_writes_nothing(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    sent.reserve(10)
    sent.reserve(1010)
    assert sent.reserved == 1010
    assert SentOffsets.open(tmp_path).reserved == 1010


def test_a_recovered_end_at_or_past_the_mark_loses_nothing(tmp_path: Path) -> None:
    # Nothing sent and an empty log: no file is written at all.
    fresh = SentOffsets.open(tmp_path)
    assert fresh.note_recovered_end(0) is None
    assert not (tmp_path / SENT_OFFSET_FILE).exists()
    marked = SentOffsets.open(tmp_path, step=1000)
    marked.reserve(500)
    assert marked.note_recovered_end(1500) is None  # exactly the mark
    assert (marked.reserved, marked.sent, marked.lost) == (1500, 1500, ())
    assert marked.note_recovered_end(2000) is None  # durable bytes past it: the mark follows
    assert (marked.reserved, marked.sent) == (2000, 2000)
    again = SentOffsets.open(tmp_path)
    assert (again.reserved, again.lost) == (2000, ())


def test_an_epoch_restart_starts_the_marks_afresh(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    sent.reserve(500)
    sent.note_flushed(1200, now=0.0)
    assert sent.note_recovered_end(300) == (300, 1500)
    sent.restart_at(800)
    assert (sent.reserved, sent.sent, sent.flushed, sent.lost) == (800, 800, 800, ())
    assert (tmp_path / SENT_OFFSET_FILE).read_text() == "sent 800\nflushed 800\n"
    sent.restart_at(2000)  # the flushed bound never rises here
    assert (tmp_path / SENT_OFFSET_FILE).read_text() == "sent 2000\nflushed 800\n"
    assert (sent.reserved, sent.sent, sent.flushed) == (2000, 2000, 800)


def test_the_same_flushed_end_again_does_not_restart_the_one_second_wait(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path)
    sent.note_flushed(100, now=10.0)
    sent.note_flushed(100, now=11.5)  # nothing new: not written, the clock not reset
    sent.note_flushed(200, now=12.0)
    assert SentOffsets.open(tmp_path).flushed == 200


def test_warnings_name_the_file_and_the_mark_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / SENT_OFFSET_FILE
    sent = SentOffsets.open(tmp_path, step=1000)
    sent.note_flushed(100, now=10.0)
    sent.reserve(10)
    sent.note_sent(10)
    _unwritable(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trioha.store"):
        sent.note_flushed(200, now=20.0)
        sent.close()
    first, second = caplog.messages
    assert first.startswith(f"cannot write {path}: ")
    assert first.endswith("; the flushed mark stays at 100 for now")
    assert second.startswith(f"cannot write {path}: ")
    assert second.endswith("; keeping the reserved mark 1010")


def test_a_clean_close_leaves_the_marks_usable(tmp_path: Path) -> None:
    sent = SentOffsets.open(tmp_path, step=1000)
    sent.reserve(10)
    sent.note_sent(10)
    sent.close()
    assert (sent.reserved, sent.sent) == (10, 10)
    assert sent.needs_reserve(11) and not sent.needs_reserve(10)


def test_the_mark_file_is_replaced_whole_and_readable_by_all(tmp_path: Path) -> None:
    path = tmp_path / SENT_OFFSET_FILE
    umask = os.umask(0o022)
    try:
        sent = SentOffsets.open(tmp_path, step=1000)
        sent.reserve(10)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    # A longer temporary file left by a crash must not leave its tail in the new mark.
    (tmp_path / (SENT_OFFSET_FILE + ".tmp")).write_text("sent 1\nflushed 1\n" + "lost 1 2\n" * 50)
    sent.reserve(2000)
    assert path.read_text() == "sent 3000\nflushed 0\n"


def test_a_mark_file_is_read_back_whole(tmp_path: Path) -> None:
    (tmp_path / SENT_OFFSET_FILE).write_text("sent 700\nflushed 300\nlost 0 4096\nlost 5000 6000\n")
    sent = SentOffsets.open(tmp_path)
    assert (sent.reserved, sent.sent, sent.flushed) == (700, 700, 300)
    assert sent.lost == ((0, 4096), (5000, 6000))  # a range may start at the log's start
    sent.note_sent(800)
    assert sent.sent == 800


def test_a_mark_file_with_other_than_ascii_is_refused(tmp_path: Path) -> None:
    # Python's int() reads fullwidth digits; the file is ASCII, so they are damage.
    (tmp_path / SENT_OFFSET_FILE).write_text("sent \uff17\uff10\uff10\n", encoding="utf-8")
    with pytest.raises(StoreLayoutError, match=f"^cannot read {tmp_path / SENT_OFFSET_FILE}: "):
        SentOffsets.open(tmp_path)


def test_a_line_not_understood_is_quoted_up_to_60_characters(tmp_path: Path) -> None:
    path = tmp_path / SENT_OFFSET_FILE
    line = "snet " + "1" * 100
    path.write_text(f"sent 12\n{line}\n")
    with pytest.raises(StoreLayoutError) as refused:
        SentOffsets.open(tmp_path)
    assert str(refused.value) == (
        f"{path} line 2 ({line[:60]!r}) is not understood: unknown entry 'snet'; "
        "it records what a master sent to its slaves, so it is not ignored"
    )
