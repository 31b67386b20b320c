"""Epoch histories and the consistent point (``EpochFileCache``'s rules and its Java tests)."""

from __future__ import annotations

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
    with pytest.raises(EpochError, match="must both increase"):
        BASE.append(epoch, start)
    assert BASE.append(4, 600).entries[-1] == EpochEntry(4, 600)


def test_out_of_order_entries_refused() -> None:
    with pytest.raises(EpochError, match="out of order"):
        entries_of([(2, 100), (1, 200)])
    with pytest.raises(EpochError, match="out of order"):
        entries_of([(1, 100), (2, 100)])


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
    import zlib

    body = "1-100\n2-300\n3-500\n"
    assert text == f"3\n{zlib.crc32(body.encode()) & 0x7FFFFFFF}\n{body}"
    assert parse_epoch_file(text) == BASE
    assert parse_epoch_file("0\n0\n") == EpochHistory()
    assert parse_epoch_file("1\r\n0\r\n7-9\r\n") == entries_of([(7, 9)])  # CRC 0: not checked


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "missing"),
        ("x\n0\n", "entry count"),
        ("2\n0\n1-100\n", "expects 2 entries, found 1"),
        ("1\n12345\n1-100\n", "does not match"),
        ("1\n0\n1_100\n", "not an 'epoch-startOffset'"),
        ("2\n0\n2-100\n1-200\n", "out of order"),
    ],
)
def test_damaged_files_are_named(text: str, match: str) -> None:
    with pytest.raises(EpochError, match=match):
        parse_epoch_file(text, where="somewhere")


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


def test_entry_finds_an_epoch_by_number() -> None:
    assert BASE.entry(2) == (1, EpochEntry(2, 300))
    assert BASE.entry(4) is None
    assert EpochHistory().entry(1) is None


def test_entries_of_a_history_is_that_history() -> None:
    assert entries_of(BASE) is BASE
