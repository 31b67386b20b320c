"""Epoch histories and the consistent point (``EpochFileCache``'s rules and its Java tests)."""

from __future__ import annotations

import re
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioha.proto._epochs import (
    EpochEntry,
    EpochError,
    EpochHistory,
    entries_of,
    find_consistent_point,
    format_epoch_file,
    parse_epoch_file,
)

BASE = entries_of([(1, 100), (2, 300), (3, 500)])


def test_entry_ends_and_lookup() -> None:
    assert BASE.end_of(1) == 500
    assert BASE.end_of(2, 900) == 900
    assert BASE.find_by_offset(350) == (1, EpochEntry(2, 300))
    assert BASE.find_by_offset(99) is None
    assert EpochHistory().find_by_offset(0) is None
    assert BASE.last_epoch == 3
    assert EpochHistory().last_epoch == 0


def test_truncate_suffix_keeps_what_starts_before() -> None:
    assert BASE.truncate_suffix(150) == entries_of([(1, 100)])
    assert BASE.truncate_suffix(500) == entries_of([(1, 100), (2, 300)])
    assert BASE.truncate_suffix(501) is BASE


@pytest.mark.parametrize(
    ("local", "local_end", "other", "other_end", "point"),
    [
        # EpochFileCacheTest's cases.
        ([(1, 100), (2, 300), (3, 500)], 700, [(1, 100), (2, 300), (3, 450)], 700, 450),
        ([(1, 100), (2, 300), (3, 500)], 700, [(1, 100), (2, 300), (3, 500)], 600, 600),
        ([(1, 100), (2, 300), (3, 500)], 700, [(1, 200), (2, 500)], 700, -1),
        ([(1, 100), (2, 300), (3, 500), (4, 800)], 900, [(1, 100), (2, 300), (3, 500)], 700, 700),
        # A master that lost its tail and began epoch 3 inside the slave's epoch 2.
        ([(1, 0), (2, 100)], 400, [(1, 0), (2, 100), (3, 250)], 600, 250),
        # A slave behind, in the master's current epoch: nothing to cut.
        ([(1, 0), (2, 100)], 150, [(1, 0), (2, 100)], 600, 150),
    ],
)
def test_consistent_point(
    local: list[tuple[int, int]],
    local_end: int,
    other: list[tuple[int, int]],
    other_end: int,
    point: int,
) -> None:
    assert (
        find_consistent_point(entries_of(local), local_end, entries_of(other), other_end) == point
    )


@pytest.mark.parametrize(("epoch", "start"), [(3, 600), (4, 500), (4, 400)])
def test_append_refuses_non_increasing(epoch: int, start: int) -> None:
    message = (
        f"epoch entry {epoch}-{start} does not follow 3-500 (epochs and start offsets must "
        "both increase)"
    )
    with pytest.raises(EpochError, match=f"^{re.escape(message)}$"):
        BASE.append(epoch, start)
    assert BASE.append(4, 600).entries[-1] == EpochEntry(4, 600)


@pytest.mark.parametrize(
    "history", [[(2, 100), (1, 200)], [(1, 100), (2, 100)], [(1, 100), (1, 200)]]
)
def test_out_of_order_entries_refused(history: list[tuple[int, int]]) -> None:
    (e1, s1), (e2, s2) = history
    message = (
        f"epoch entries out of order: {e1}-{s1} then {e2}-{s2} (epochs and start offsets "
        "must both increase)"
    )
    with pytest.raises(EpochError, match=f"^{re.escape(message)}$"):
        entries_of(history)


def test_begin_epoch_never_reuses_a_dropped_epoch() -> None:
    # The log lost everything from 450: epoch 3 (from 500) describes bytes no longer held.
    after = BASE.begin_epoch(450)
    assert after == entries_of([(1, 100), (2, 300), (4, 450)])
    # A restart that wrote nothing since the last epoch began replaces that empty epoch.
    assert after.begin_epoch(450) == entries_of([(1, 100), (2, 300), (5, 450)])
    assert EpochHistory().begin_epoch(0) == entries_of([(1, 0)])


def test_file_format_is_rocketmq_checkpoint_file() -> None:
    text = format_epoch_file(BASE.entries)
    # CheckpointFile: count, CRC32 (UtilAll.crc32: & 0x7fffffff) of the entry lines, entries.
    body = "1-100\n2-300\n3-500\n"
    assert text == f"3\n{zlib.crc32(body.encode()) & 0x7FFFFFFF}\n{body}"
    assert parse_epoch_file(text) == BASE
    assert parse_epoch_file("0\n0\n") == EpochHistory()
    assert parse_epoch_file("1\r\n0\r\n7-9\r\n") == entries_of([(7, 9)])  # CRC 0: not checked
    assert parse_epoch_file("1\n0\n7-9") == entries_of([(7, 9)])  # no final newline


def crc(body: str) -> int:
    return zlib.crc32(body.encode()) & 0x7FFFFFFF


def test_the_crc_covers_each_entry_line_as_stored() -> None:
    plain, blank = crc("7-9\n"), crc("7-9 \n")
    # Written on Windows: the \r of each line is not part of what the CRC covers.
    assert parse_epoch_file(f"1\r\n{plain}\r\n7-9\r\n") == entries_of([(7, 9)])
    # Anything else on a line is: the CRC is of the stored text, not of a cleaned-up one.
    assert parse_epoch_file(f"1\n{blank}\n7-9 \n") == entries_of([(7, 9)])
    with pytest.raises(EpochError, match="does not match"):
        parse_epoch_file(f"1\n{plain}\n7-9 \n")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "missing the entry count and CRC lines"),
        ("x\n0\n", "the first two lines must be the entry count and the CRC, got 'x' and '0'"),
        ("2\n0\n1-100\n", "expects 2 entries, found 1"),
        ("1\n12345\n1-100\n", "CRC 12345 does not match the entries' CRC"),
        ("1\n0\n1_100\n", "'1_100' is not an 'epoch-startOffset' line"),
        ("1\n0\n1-100X\n", "'1-100X' is not an 'epoch-startOffset' line"),
        ("1\n0\n-1-5\n", "'-1-5' is not an 'epoch-startOffset' line"),
        ("2\n0\n2-100\n1-200\n", "epoch entries out of order"),
    ],
)
def test_damaged_files_are_named(text: str, match: str) -> None:
    with pytest.raises(EpochError, match=f"^somewhere: {re.escape(match)}"):
        parse_epoch_file(text, where="somewhere")
    # Without a name, the error still says what was being read.
    with pytest.raises(EpochError, match=f"^epoch file: {re.escape(match)}"):
        parse_epoch_file(text)


histories = st.lists(st.tuples(st.integers(1, 5), st.integers(1, 500)), max_size=6).map(
    lambda steps: EpochHistory(
        EpochEntry(sum(e for e, _ in steps[: i + 1]), sum(s for _, s in steps[: i + 1]))
        for i in range(len(steps))
    )
)


@given(histories)
def test_format_round_trips(history: EpochHistory) -> None:
    assert parse_epoch_file(format_epoch_file(history.entries)) == history


@given(histories, st.integers(0, 3000), histories, st.integers(0, 3000))
def test_point_never_beyond_either_end(
    a: EpochHistory, a_end: int, b: EpochHistory, b_end: int
) -> None:
    a_end = max(a_end, a.entries[-1].start_offset if a else 0)
    b_end = max(b_end, b.entries[-1].start_offset if b else 0)
    point = find_consistent_point(a, a_end, b, b_end)
    assert point <= min(a_end, b_end)
    assert point == find_consistent_point(b, b_end, a, a_end)


def test_negative_entries_are_refused_by_name() -> None:
    with pytest.raises(EpochError, match="negative epoch entry"):
        EpochHistory([EpochEntry(-1, 0)])
    with pytest.raises(EpochError, match="negative epoch entry"):
        EpochHistory([EpochEntry(1, -5)])
    # 0 is a valid epoch and a valid start: only negatives are refused.
    assert EpochHistory([EpochEntry(0, 0)]).last_epoch == 0


def test_entry_finds_an_epoch_by_number() -> None:
    assert BASE.entry(2) == (1, EpochEntry(2, 300))
    assert BASE.entry(4) is None
    assert EpochHistory().entry(1) is None


def test_entries_of_a_history_is_that_history() -> None:
    assert entries_of(BASE) is BASE
