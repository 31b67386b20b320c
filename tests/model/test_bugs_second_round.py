"""Bugs the first configurations could miss or only catch indirectly, each now caught by name.

Like ``test_bugs.py``: each test puts a one-line mistake into the production core (or into the
one sync replication rule, ``trioha.proto._quorum``) for the duration of the test, runs the
configuration built to see it, and pins the property that catches it (docs/model.md). Where an
older configuration lets the bug through, the test shows that too.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import model
from trioha.proto import (
    MASTER_TABLE,
    AckAdvanced,
    CloseKind,
    LogView,
    MasterOptions,
    MasterPhase,
    MasterState,
    ReportReceived,
    _quorum,
    _state,
)
from trioha.proto._state import Rule

_M = MasterPhase


def _first(config: str) -> str:
    result = model.check(config)
    first = result.first_violation
    if first is not None:
        return first.name
    assert result.missed_probes, f"{config}: the bug went unnoticed"
    return "missed: " + ", ".join(result.missed_probes)


def test_an_ack_checked_against_the_log_end_instead_of_what_was_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#3015's half-fix (4.9): only a report beyond the master's end is refused."""
    original = _state._master_report

    def half_fix(
        state: MasterState, event: ReportReceived, options: MasterOptions
    ) -> tuple[MasterState, tuple[Any, ...]]:
        if state.next_transfer < event.offset <= event.log.max_offset:
            return attrs.evolve(state, ack_offset=event.offset), (AckAdvanced(event.offset),)
        return original(state, event, options)

    key = (_M.TRANSFER, ReportReceived)
    monkeypatch.setitem(MASTER_TABLE, key, Rule(half_fix, MASTER_TABLE[key].targets))
    assert model.check("hostile").ok  # beyond-the-end reports only: it passed
    assert _first("hostile-anywhere") == "AckNotAhead"


def test_a_backwards_report_taken_as_an_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    original = _state._master_report

    def lenient(
        state: MasterState, event: ReportReceived, options: MasterOptions
    ) -> tuple[MasterState, tuple[Any, ...]]:
        if event.offset < state.ack_offset:
            return attrs.evolve(state, ack_offset=event.offset), (AckAdvanced(event.offset),)
        return original(state, event, options)

    key = (_M.TRANSFER, ReportReceived)
    monkeypatch.setitem(MASTER_TABLE, key, Rule(lenient, MASTER_TABLE[key].targets))
    assert _first("hostile-anywhere") == "ReportsMonotonePerConnection"


def test_a_frame_that_crosses_a_segment_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """``getCommitLogData`` forgotten: a frame runs on into the next segment."""
    monkeypatch.setattr(LogView, "readable_end", lambda self, offset: self.max_offset)
    assert model.check("smoke").ok  # one segment, frames of one byte: invisible
    assert _first("odd-frames") == "FrameWithinLog"


def test_a_slave_exactly_fallbehind_max_behind_taken_as_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``isSlaveOK`` is strict: ``end - ack < fallbehind_max``; ``<=`` lets one more through."""

    def lenient(vouches: Any, needed: int, end: int, fallbehind_max: int) -> bool:
        return sum(1 for _s, ack in vouches if end - ack <= fallbehind_max) >= needed

    monkeypatch.setattr(_quorum, "slaves_available", lenient)
    assert _first("fallbehind-edge") == "missed: refused_at_fallbehind_max"


def test_a_slave_within_fallbehind_max_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def strict(vouches: Any, needed: int, end: int, fallbehind_max: int) -> bool:
        return sum(1 for _s, ack in vouches if end - ack < fallbehind_max - 1) >= needed

    monkeypatch.setattr(_quorum, "slaves_available", strict)
    assert _first("fallbehind-edge") == "HonestSlaveAvailable"


def test_an_honest_ack_of_everything_sent_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by one in the #3015 check: an ack of exactly what was sent closes the link."""
    original = _state._master_report

    def strict(
        state: MasterState, event: ReportReceived, options: MasterOptions
    ) -> tuple[MasterState, tuple[Any, ...]]:
        if event.offset == state.next_transfer and event.offset > state.ack_offset:
            return _state._closed(
                state, CloseKind.PROTOCOL_ERROR, "slave acks offset beyond what was sent to it"
            )
        return original(state, event, options)

    key = (_M.TRANSFER, ReportReceived)
    monkeypatch.setitem(MASTER_TABLE, key, Rule(strict, MASTER_TABLE[key].targets))
    assert _first("smoke") == "HonestReportsAccepted"


def test_a_master_that_never_serves_a_reconnected_slave(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every first report after the first connection is refused: the slave is shut out."""
    original = _state._master_first_report

    def once(
        state: MasterState, event: ReportReceived, options: MasterOptions
    ) -> tuple[MasterState, tuple[Any, ...]]:
        if event.offset > 0:
            return _state._closed(state, CloseKind.PROTOCOL_ERROR, "refused")
        return original(state, event, options)

    key = (_M.AWAIT_REPORT, ReportReceived)
    monkeypatch.setitem(MASTER_TABLE, key, Rule(once, MASTER_TABLE[key].targets))
    result = model.check("smoke", stop_at_first=False)
    assert result.liveness["HonestSlaveNeverRefused"] == "HonestSlaveNeverRefused"


def test_the_release_of_waiting_puts_forgets_where_a_put_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quorum counts a connection for bytes it never carried (served from later on)."""
    monkeypatch.setattr(_quorum.Quorum, "holds", lambda self, start, end: self.highest >= end)
    assert _first("empty-slave-gap") == "SyncAckedOnSlave"
