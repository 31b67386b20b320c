"""The checker bites: realistic bugs put into the production core are caught, by name.

Each test replaces one rule of :data:`trioha.proto.MASTER_TABLE` / :data:`SLAVE_TABLE` (or the
function a rule calls) for the duration of the test, as a one-line mistake in
``trioha/proto/_state.py`` would, runs a configuration, and pins the property that catches it
and the length of the shortest counterexample (docs/model.md has the same table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

import model
from trioha.proto import (
    MASTER_TABLE,
    SLAVE_TABLE,
    AckAdvanced,
    AppendConfirmed,
    BodyReceived,
    Connected,
    ConnectionLost,
    FrameWritten,
    HeartbeatDue,
    LogView,
    MasterOptions,
    MasterPhase,
    MasterState,
    ReportReceived,
    SendReport,
    SlavePhase,
    SlaveState,
    _state,
)
from trioha.proto._state import Rule

_M = MasterPhase
_S = SlavePhase


def _caught(config: str) -> tuple[str, int]:
    result = model.check(config)
    first = result.first_violation
    assert first is not None, f"{config}: the bug went unnoticed"
    return first.name, len(first.trace)


_Apply = Callable[..., Any]


def _patch_master(
    monkeypatch: pytest.MonkeyPatch, key: tuple[MasterPhase, type], apply: _Apply
) -> None:
    monkeypatch.setitem(MASTER_TABLE, key, Rule(apply, MASTER_TABLE[key].targets))


def _patch_slave(
    monkeypatch: pytest.MonkeyPatch, key: tuple[SlavePhase, type], apply: _Apply
) -> None:
    monkeypatch.setitem(SLAVE_TABLE, key, Rule(apply, SLAVE_TABLE[key].targets))


def test_resume_one_record_too_far(monkeypatch: pytest.MonkeyPatch) -> None:
    """``nextTransferFromWhere = slaveRequestOffset + 1``: the master skips a byte."""
    original = _state.choose_start

    def too_far(request: int, log: LogView, options: MasterOptions) -> int:
        start = original(request, log, options)
        return start + 1 if request else start

    monkeypatch.setattr(_state, "choose_start", too_far)
    assert _caught("smoke") == ("FramesContiguous", 10)


def test_stale_partial_frame_after_reconnect(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slave keeps a half-received frame's header across a reconnect."""

    def lost(state: SlaveState, event: ConnectionLost) -> tuple[SlaveState, tuple[()]]:
        return attrs.evolve(state, phase=_S.DISCONNECTED), ()

    def connected(state: SlaveState, event: Connected) -> tuple[SlaveState, tuple[SendReport]]:
        new = attrs.evolve(state, phase=_S.TRANSFER, expected=event.log_max, reported=event.log_max)
        return new, (SendReport(event.log_max),)

    _patch_slave(monkeypatch, (_S.TRANSFER, ConnectionLost), lost)
    _patch_slave(monkeypatch, (_S.DISCONNECTED, Connected), connected)
    assert _caught("smoke") == ("FramingIntact", 10)


def test_reseek_on_every_ack(monkeypatch: pytest.MonkeyPatch) -> None:
    """The master moves ``nextTransferFromWhere`` to each ack: it resends what is in flight."""
    key = (_M.TRANSFER, ReportReceived)
    original = _state._master_report

    def reseek(
        state: MasterState, event: ReportReceived, options: MasterOptions
    ) -> tuple[MasterState, tuple[object, ...]]:
        new, actions = original(state, event, options)
        if new.phase is _M.TRANSFER and new.ack_offset > state.ack_offset:
            new = attrs.evolve(new, next_transfer=event.offset)
        return new, actions

    _patch_master(monkeypatch, key, reseek)
    assert _caught("smoke") == ("RequestOffsetOnce", 9)


def test_skip_the_heartbeat_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slave lets ``haSendHeartbeatInterval`` pass without reporting (RocketMQ #1082)."""
    _patch_slave(monkeypatch, (_S.TRANSFER, HeartbeatDue), lambda s, e: (s, ()))
    assert _caught("smoke") == ("HeartbeatsKeepLinkOpen", 5)


def test_trust_an_ack_beyond_what_was_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """RocketMQ #3015 without its fix: any report counts as an ack."""
    key = (_M.TRANSFER, ReportReceived)
    original = _state._master_report

    def credulous(
        state: MasterState, event: ReportReceived, options: MasterOptions
    ) -> tuple[MasterState, tuple[object, ...]]:
        if event.offset > state.ack_offset:
            return attrs.evolve(state, ack_offset=event.offset), (AckAdvanced(event.offset),)
        return original(state, event, options)

    _patch_master(monkeypatch, key, credulous)
    assert _caught("hostile") == ("AckNotAhead", 4)


def test_report_before_the_append_is_confirmed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slave acks a body as it arrives, before the store has it (and before a flush)."""
    key = (_S.TRANSFER, BodyReceived)
    original = _state._slave_body

    def eager(state: SlaveState, event: BodyReceived) -> tuple[SlaveState, tuple[object, ...]]:
        new, actions = original(state, event)
        return attrs.evolve(new, reported=new.expected), (*actions, SendReport(new.expected))

    _patch_slave(monkeypatch, key, eager)
    assert _caught("fixed-ack-flushed-restart") == ("SyncAckedOnSlave", 8)


def test_slave_requests_one_byte_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slave's first report is one less than its log end: the master resends a byte."""

    def short(state: SlaveState, event: Connected) -> tuple[SlaveState, tuple[SendReport]]:
        ask = max(0, event.log_max - 1)
        new = SlaveState(phase=_S.TRANSFER, expected=event.log_max, reported=ask)
        return new, (SendReport(ask),)

    _patch_slave(monkeypatch, (_S.DISCONNECTED, Connected), short)
    # At the same depth the slave's offset check fires (NoFrameRejected) and the master
    # refuses the slave's next, true report as beyond what it sent; the latter is met first.
    assert _caught("smoke") == ("HonestReportsAccepted", 11)


def test_forget_that_the_frame_was_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """``lastWriteOver`` is never set again: a frame stays handed out forever."""
    _patch_master(monkeypatch, (_M.TRANSFER, FrameWritten), lambda s, e, o: (s, ()))
    assert _caught("smoke") == ("WellFormed", 3)


def test_confirm_beyond_the_log_end_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store confirming more than it was given is an IO-layer bug the core refuses."""
    key = (_S.TRANSFER, AppendConfirmed)
    original = _state._slave_confirmed

    def overshoot(state: SlaveState, event: AppendConfirmed) -> tuple[object, tuple[object, ...]]:
        return original(state, AppendConfirmed(event.offset + 1))

    _patch_slave(monkeypatch, key, overshoot)
    assert _caught("smoke") == ("NoLocalProtocolError", 7)


def test_the_real_tables_are_back() -> None:
    """monkeypatch restored every rule (a leaked patch would poison other tests)."""
    assert model.check("fixed-ack-flushed-restart").ok
