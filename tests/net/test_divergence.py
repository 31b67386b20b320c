"""What a classic master checks when it starts: lost bytes it had sent, and damage.

The whole scenario with real processes is ``test_classic_divergence.py``; these pin what the
check does to the log and the marks, and the exact lines and errors an operator reads.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trioha import DamagedLogError, LostAcknowledgedError
from trioha.net._divergence import (
    check_master_history,
    former_master_divergence,
    open_master_history,
    promotion_end,
)
from trioha.store import DEFAULT_RESERVE_STEP, MemoryCommitLog, NewMessage, SentOffsets, open_store

SEG = 4096


def filled(records: int) -> MemoryCommitLog:
    log = MemoryCommitLog(segment_size=SEG)
    for i in range(records):
        log.append(NewMessage(topic="T", body=b"m%d" % i))
    return log


def ha_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "trioha.ha"]


@pytest.mark.parametrize(
    ("segment", "step"),
    [
        (SEG, SEG // 8),  # an eighth of a segment: a lost range never reaches far
        (64 << 20, DEFAULT_RESERVE_STEP),  # at most 4 MiB per fsync of the mark
    ],
)
def test_the_sent_mark_is_reserved_an_eighth_segment_at_a_time_at_most_4_mib(
    tmp_path: Path, segment: int, step: int
) -> None:
    with open_store(tmp_path, segment_size=segment) as store:
        sent = open_master_history(store)
        assert sent.step == step
        assert sent.path == tmp_path / "haSentOffset"
        sent.reserve(100)
        assert SentOffsets.open(tmp_path).reserved == 100 + step


def test_a_master_whose_log_ends_below_its_flushed_mark_refuses_to_start_naming_both(
    tmp_path: Path,
) -> None:
    # Nothing readable at all, but the marks say 1000 bytes had been flushed.
    with open_store(tmp_path, segment_size=SEG):
        pass
    SentOffsets.open(tmp_path).note_flushed(1000, now=0.0)
    with open_store(tmp_path, segment_size=SEG) as store, pytest.raises(DamagedLogError) as raised:
        open_master_history(store)
    assert str(raised.value) == (
        "refusing to start as master: the commit log ends at 0, below 1000, which had been "
        "flushed: that is damage, not a lost tail. Bytes [0, 1000) are out of the log; "
        f"recovery of {tmp_path} ended there (a clean end) and kept 0 cut bytes in nowhere "
        "(nothing was readable). New data would take offsets that slaves hold with the old "
        "bytes. Repair or restore the store (or promote a slave); to start anyway, knowing "
        "slaves beyond 0 will be refused, pass --accept-damaged-log (ha_accept_damaged_log)"
    )
    assert SentOffsets.open(tmp_path).flushed == 1000  # a refusal changes nothing


def damaged_store(root: Path) -> tuple[list[int], int]:
    """A store of three segments, all flushed, whose second record's magic is then broken;
    the offsets of its records and its end."""
    with open_store(root, segment_size=SEG) as store:
        offsets = [
            store.commitlog.append(NewMessage(topic="T", body=b"x" * 100)).physical_offset
            for _ in range(80)
        ]
        end = store.commitlog.max_offset
        assert end > 2 * SEG
    SentOffsets.open(root).note_flushed(end, now=0.0)
    with (root / "commitlog" / f"{0:020d}").open("r+b") as f:
        f.seek(offsets[1] + 4)
        f.write(b"\xde\xad\xbe\xef")
    (root / "abort").touch()
    return offsets, end


def test_the_damage_error_says_why_recovery_stopped_and_where_it_kept_the_cut_bytes(
    tmp_path: Path,
) -> None:
    offsets, end = damaged_store(tmp_path)
    with open_store(tmp_path, segment_size=SEG) as store:
        report = store.recovery
        assert report.reason and report.cut_bytes
        assert len(report.kept_aside) == 4  # the first segment's cut tail, 3 later segments
        with pytest.raises(DamagedLogError) as raised:
            open_master_history(store)
    kept = ", ".join(str(p) for p in report.kept_aside)
    assert (
        f"Bytes [{offsets[1]}, {end}) are out of the log; recovery of {tmp_path} ended there "
        f"({report.reason}) and kept {report.cut_bytes} cut bytes in {kept}. New data"
    ) in str(raised.value)


def test_the_damage_check_says_what_recovery_did_when_told_and_refuses_by_default(
    tmp_path: Path,
) -> None:
    log = filled(3)
    sent = SentOffsets.open(tmp_path)
    sent.note_flushed(log.max_offset + 50, now=0.0)
    with pytest.raises(
        DamagedLogError, match=r"which had been flushed: .*; recovery found no more\. New"
    ):
        check_master_history(log, sent)
    with pytest.raises(DamagedLogError, match=r"out of the log; it found a bad CRC\. New data"):
        check_master_history(log, sent, recovery="it found a bad CRC")


def test_an_accepted_damaged_log_starts_with_the_flushed_mark_cut_to_its_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = filled(3)
    end = log.max_offset
    sent = SentOffsets.open(tmp_path)
    sent.note_flushed(end + 50, now=0.0)
    with caplog.at_level(logging.INFO):
        assert check_master_history(log, sent, accept_damaged=True, recovery="it said so") is sent
    assert sent.flushed == end
    assert SentOffsets.open(tmp_path).flushed == end  # durable: the next start is not refused
    assert log.max_offset == end  # nothing was sent past it: no lost range, no padding
    assert sent.lost == ()
    assert ha_records(caplog) == [
        (
            logging.ERROR,
            f"the commit log ends at {end}, below {end + 50}, which had been flushed: that is "
            f"damage, not a lost tail. Bytes [{end}, {end + 50}) are out of the log; it said "
            "so; starting as master anyway (ha_accept_damaged_log)",
        )
    ]
    # Started once: the next start finds nothing wrong and says nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        check_master_history(log, SentOffsets.open(tmp_path))
    assert ha_records(caplog) == []


def sent_past_the_end(tmp_path: Path, past: int) -> tuple[MemoryCommitLog, int, SentOffsets]:
    """A log of 5 messages, its end, and marks saying up to *past* bytes beyond the end may
    have been sent (reserved in steps of 10): a master that lost the tail it had sent."""
    log = filled(5)
    end = log.max_offset
    sent = SentOffsets.open(tmp_path, step=10)
    sent.reserve(end + past)
    return log, end, sent


def test_a_lost_sent_range_is_padded_past_with_end_of_file_records_flushed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, end, sent = sent_past_the_end(tmp_path, 100)  # up to end + 100, + its step
    with caplog.at_level(logging.INFO):
        assert check_master_history(log, sent) is sent
    mark = end + 110
    assert sent.lost == ((end, mark),)
    assert SentOffsets.open(tmp_path).lost == ((end, mark),)
    assert log.max_offset == SEG  # the first segment boundary beyond the lost range
    assert log.flushed_offset == SEG  # the padding is on disk before anything is served
    # A WARNING: the mark is reserved ahead, so nothing past the end may have gone out; a
    # slave that does hold such bytes is refused at ERROR when it reports.
    assert ha_records(caplog) == [
        (
            logging.WARNING,
            f"this master may have sent bytes [{end}, {mark}) to slaves before it stopped, "
            f"and its log now ends at {end}: those bytes are lost here (the mark is reserved "
            "ahead, so fewer may have gone out). A slave reporting an offset in "
            f"({end}, {mark}] will be refused, with an ERROR naming it, until it is cut back "
            f"to {end} (`trioha slave --truncate-to-master`) or re-seeded; new messages start "
            f"at {SEG}, past the lost range, so that no slave is ever served a spliced log",
        )
    ]


def test_ranges_lost_in_earlier_crashes_are_recalled_at_every_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, first_end, sent = sent_past_the_end(tmp_path, 1)
    check_master_history(log, sent)  # first crash: [first_end, first_end + 11) lost
    log.append(NewMessage(topic="T", body=b"after"))
    second_end = log.max_offset
    sent = SentOffsets.open(tmp_path, step=10)
    sent.reserve(second_end + 1)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        check_master_history(log, sent)  # second crash: one more range
    lost = sent.lost
    assert lost == ((first_end, first_end + 11), (second_end, second_end + 11))
    records = ha_records(caplog)
    assert [level for level, _ in records] == [logging.WARNING, logging.INFO]
    assert records[0][1].startswith(f"this master may have sent bytes [{second_end}, ")
    assert records[1] == (
        logging.INFO,
        f"slaves reporting an offset in ({first_end}, {first_end + 11}] are refused (lost in "
        "an earlier crash)",
    )
    # A clean start later: every range is recalled, none is new.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        check_master_history(log, SentOffsets.open(tmp_path))
    assert ha_records(caplog) == [
        (
            logging.INFO,
            f"slaves reporting an offset in ({lo}, {hi}] are refused (lost in an earlier crash)",
        )
        for lo, hi in lost
    ]


def test_in_epoch_mode_the_marks_restart_at_the_recovered_end_without_padding(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = filled(5)
    end = log.max_offset
    # A mark past the end and a range lost earlier, as a classic master left them.
    (tmp_path / "haSentOffset").write_text(f"sent {end + 100}\nflushed 0\nlost 1 2\n")
    assert SentOffsets.open(tmp_path).lost == ((1, 2),)
    sent = SentOffsets.open(tmp_path)
    with caplog.at_level(logging.INFO):
        assert check_master_history(log, sent, epoch_mode=True) is sent
    assert log.max_offset == end  # the new epoch starts exactly at the recovered end
    assert (sent.reserved, sent.sent, sent.lost) == (end, end, ())
    again = SentOffsets.open(tmp_path)
    assert (again.reserved, again.lost) == (end, ())
    assert ha_records(caplog) == []


def test_in_epoch_mode_an_accepted_damaged_log_still_cuts_the_flushed_mark(
    tmp_path: Path,
) -> None:
    log = filled(3)
    end = log.max_offset
    sent = SentOffsets.open(tmp_path)
    sent.note_flushed(end + 7, now=0.0)
    with pytest.raises(DamagedLogError):
        check_master_history(log, sent, epoch_mode=True)
    check_master_history(log, sent, epoch_mode=True, accept_damaged=True)
    assert SentOffsets.open(tmp_path).flushed == end


def test_a_store_opened_as_master_passes_on_what_the_operator_accepts_and_the_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with open_store(tmp_path, segment_size=SEG) as store:
        store.commitlog.append(NewMessage(topic="T", body=b"x" * 100))
        end = store.commitlog.max_offset
    marks = SentOffsets.open(tmp_path, step=10)
    marks.reserve(end + 100)  # sent past the end: a lost tail
    marks.note_flushed(end + 50, now=0.0)  # and flushed past it: damage
    with open_store(tmp_path, segment_size=SEG) as store:
        with pytest.raises(DamagedLogError):
            open_master_history(store)
        with caplog.at_level(logging.ERROR):
            sent = open_master_history(store, accept_damaged=True)
        assert sent.flushed == end
        assert store.commitlog.max_offset == SEG  # classic by default: padded past the loss
    marks = SentOffsets.open(tmp_path, step=10)
    marks.reserve(2 * SEG + 100)
    marks.note_flushed(2 * SEG + 50, now=1.0)
    with open_store(tmp_path, segment_size=SEG) as store:
        sent = open_master_history(store, accept_damaged=True, epoch_mode=True)
        assert store.commitlog.max_offset == SEG  # epoch mode: no padding, the marks restart
        assert (sent.reserved, sent.flushed, sent.lost) == (SEG, SEG, ())


# --- a quiet crash: the marks were settled, nothing is reported -----------------------------


def test_a_crash_after_the_marks_settled_reports_nothing_and_pads_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = filled(5)
    end = log.max_offset
    sent = SentOffsets.open(tmp_path, step=100)
    sent.reserve(end)  # reserved ahead while sending ...
    sent.note_sent(end)
    sent.reserve_acked(end)
    sent.note_acked(end)
    assert sent.settle()  # ... then quiet: written down to the exact figures
    sent.write_settled()
    with caplog.at_level(logging.INFO):  # the crash: a restart reads the file back
        check_master_history(log, SentOffsets.open(tmp_path))
    assert ha_records(caplog) == []
    assert log.max_offset == end
    # Without the settle the reservation looks like a lost range: that is what it prevents.
    busy = SentOffsets.open(tmp_path, step=100)
    busy.reserve(end + 1)
    check_master_history(log, SentOffsets.open(tmp_path))
    assert log.max_offset == SEG


# --- acknowledged messages lost ---------------------------------------------------------------


def acked_past_the_end(
    tmp_path: Path, *, sent_past: int, acked_past: int
) -> tuple[MemoryCommitLog, int, str]:
    """A log of 5 messages and marks saying a put ending ``acked_past`` bytes beyond its end
    was answered PUT_OK and ``sent_past`` bytes beyond it were sent; the file's text."""
    log = filled(5)
    end = log.max_offset
    sent = SentOffsets.open(tmp_path, step=10)
    sent.reserve(end + sent_past)
    sent.note_sent(end + sent_past)
    sent.reserve_acked(end + acked_past)
    sent.note_acked(end + acked_past)
    sent.note_slave("10.0.0.7", end + acked_past)
    sent.note_slave("10.0.0.8", end - 5)
    sent.settle()  # exact figures, as a quiet master writes them
    sent.write_settled()
    return log, end, (tmp_path / "haSentOffset").read_text()


def test_acknowledged_messages_a_slave_may_hold_keep_the_master_from_starting(
    tmp_path: Path,
) -> None:
    log, end, before = acked_past_the_end(tmp_path, sent_past=40, acked_past=30)
    with pytest.raises(LostAcknowledgedError) as refused:
        check_master_history(log, SentOffsets.open(tmp_path, step=10), store_dir="/data/m")
    assert str(refused.value) == (
        f"refusing to start as master: this master answered PUT_OK for messages up to offset "
        f"{end + 30}, and its log now ends at {end}: the acknowledged bytes [{end}, {end + 30}) "
        "are lost here, and it had sent them to its slaves, which may still hold them (slave "
        f"10.0.0.7, which acknowledged at least up to {end + 30}; slave 10.0.0.8, which "
        f"acknowledged at least up to {end - 5}; the mark is reserved up to 10 bytes ahead of "
        "the last answer, so the loss may end earlier). Promote the slave that holds them: "
        "stop it and start it as master (`trioha master --store-dir <its store>`), then start "
        "this broker as its slave (`trioha slave --store-dir /data/m --master-ha "
        "10.0.0.7:<its HA port>`), which copies them back. To start this broker as master "
        "anyway and discard them, pass --accept-lost-acknowledged (haAcceptLostAcknowledged)"
    )
    # A refusal changes nothing: the next start refuses the same way.
    assert (tmp_path / "haSentOffset").read_text() == before
    assert log.max_offset == end


def test_lost_acknowledged_messages_accepted_are_said_at_error_and_forgotten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log, end, _ = acked_past_the_end(tmp_path, sent_past=40, acked_past=30)
    sent = SentOffsets.open(tmp_path, step=10)
    with caplog.at_level(logging.INFO):
        check_master_history(log, sent, accept_lost_acknowledged=True)
    (level, line), (sent_level, _) = ha_records(caplog)
    assert level == logging.ERROR
    assert line.startswith(f"this master answered PUT_OK for messages up to offset {end + 30}")
    assert line.endswith(
        "starting as master anyway (haAcceptLostAcknowledged): slaves holding them will be "
        "refused until cut back or re-seeded"
    )
    assert sent_level == logging.WARNING  # and the lost sent range as always
    assert SentOffsets.open(tmp_path).acked_reserved == end  # said once, not at every start
    assert log.max_offset == SEG


def test_acknowledged_messages_never_sent_are_lost_for_good_and_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An ASYNC_MASTER whose slave was away: PUT_OK after the local append, never sent.
    log, end, _ = acked_past_the_end(tmp_path, sent_past=0, acked_past=30)
    with caplog.at_level(logging.INFO):
        check_master_history(log, SentOffsets.open(tmp_path, step=10))
    assert ha_records(caplog) == [
        (
            logging.ERROR,
            f"this master answered PUT_OK for messages up to offset {end + 30} and its log now "
            f"ends at {end}: the acknowledged messages in [{end}, {end + 30}) are lost (the "
            "mark is reserved up to 10 bytes ahead of the last answer, so the loss may end "
            "earlier). It never sent them to a slave, so no copy of them exists; starting as "
            f"master, new messages start at {end}",
        )
    ]
    assert log.max_offset == end
    assert SentOffsets.open(tmp_path).acked_reserved == end


def test_in_epoch_mode_lost_acknowledged_messages_keep_the_master_from_starting_too(
    tmp_path: Path,
) -> None:
    log, end, _ = acked_past_the_end(tmp_path, sent_past=40, acked_past=30)
    with pytest.raises(LostAcknowledgedError, match=r"slave 10\.0\.0\.7, which acknowledged"):
        check_master_history(log, SentOffsets.open(tmp_path), epoch_mode=True)
    sent = SentOffsets.open(tmp_path)
    check_master_history(log, sent, epoch_mode=True, accept_lost_acknowledged=True)
    assert log.max_offset == end  # epoch mode: no padding
    assert (sent.reserved, sent.acked_reserved, sent.lost) == (end, end, ())


# --- promoted slaves and former masters -----------------------------------------------------


def test_a_store_with_data_but_no_marks_starts_as_a_promoted_master(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = filled(5)
    end = log.max_offset
    assert promotion_end(end, SEG) == SEG  # the boundary past half a segment beyond it
    with caplog.at_level(logging.INFO):
        sent = check_master_history(log, SentOffsets.open(tmp_path))
    upto = SEG - 1
    assert sent.lost == ((end, upto),)
    assert log.max_offset == SEG and log.flushed_offset == SEG
    assert ha_records(caplog) == [
        (
            logging.WARNING,
            "this store holds data but did not last run as a trioha master (a promoted slave, "
            "or a store another broker wrote): a former master or another slave may hold bytes "
            f"past its end {end} that it never had. A broker reporting an offset in ({end}, "
            f"{upto}] is refused until it is cut back to {end} (`trioha slave "
            "--truncate-to-master`) or re-seeded; this master's own messages start at "
            f"{SEG}, so that its slaves reconnect normally",
        )
    ]
    again = SentOffsets.open(tmp_path)  # the marks now say it runs as a master
    assert again.existed and again.lost == ((end, upto),) and again.reserved == upto
    caplog.clear()
    with caplog.at_level(logging.INFO):
        check_master_history(log, again)
    assert [level for level, _ in ha_records(caplog)] == [logging.INFO]  # recalled only
    assert log.max_offset == SEG


def test_a_promotion_pads_at_least_half_a_segment() -> None:
    cases = [(0, SEG), (1, SEG), (SEG // 2 - 1, SEG), (SEG // 2, 2 * SEG), (SEG, 2 * SEG)]
    for end, boundary in cases:
        assert promotion_end(end, SEG) == boundary
        assert boundary - end >= SEG // 2


def test_an_empty_store_or_epoch_mode_is_no_promotion_and_the_marks_are_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = MemoryCommitLog(segment_size=SEG)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with caplog.at_level(logging.INFO):
        check_master_history(empty, SentOffsets.open(tmp_path / "a"))
        log = filled(5)
        check_master_history(log, SentOffsets.open(tmp_path / "b"), epoch_mode=True)
    assert ha_records(caplog) == []
    assert (empty.max_offset, log.max_offset) == (0, filled(5).max_offset)
    assert (tmp_path / "a" / "haSentOffset").read_text() == "sent 0\nflushed 0\n"
    assert SentOffsets.open(tmp_path / "b").existed


def test_a_former_master_holding_bytes_it_never_sent_starts_diverged_at_a_boundary(
    tmp_path: Path,
) -> None:
    log = filled(10)
    end = log.max_offset
    first = next(iter(log.iter_messages()))
    sent = SentOffsets.open(tmp_path, step=1)
    assert former_master_divergence(log, sent, "m:1") is None  # no marks: a plain slave
    sent.reserve(first.end_offset + 10)  # sent up to 11 bytes into the second record
    marks = SentOffsets.open(tmp_path)
    divergence = former_master_divergence(log, marks, "10.0.0.5:10912")
    assert divergence is not None
    assert (divergence.master_offset, divergence.slave_offset) == (first.end_offset, end)
    assert divergence.master == "10.0.0.5:10912"
    assert divergence.reason == (
        f"this store last ran as a trioha master and never sent bytes [{first.end_offset + 11}, "
        f"{end}) to a slave: no other broker holds them, so master 10.0.0.5:10912's history "
        "cannot continue this log"
    )
    marks.reserve(end)  # everything may have been sent: the master decides
    assert former_master_divergence(log, marks, "m:1") is None
