"""The one sync replication rule (``trioha.proto.Quorum``) and the table's declared targets."""

from __future__ import annotations

import pytest

from trioha.proto import (
    MASTER_TABLE,
    SLAVE_TABLE,
    Connected,
    LogView,
    MasterOptions,
    MasterPhase,
    MasterState,
    Quorum,
    ReportReceived,
    SlavePhase,
    SlaveState,
    carried,
    master_step,
    needed_acks,
    replicated_offset,
    slave_step,
    slaves_available,
)
from trioha.proto._state import Rule

LOG = LogView(0, 1000, 1024)


def test_needed_acks_is_at_least_one() -> None:
    assert [needed_acks(n) for n in (0, 1, 2, 3)] == [1, 1, 2, 3]


def test_a_connection_vouches_only_for_what_it_carried_and_acked() -> None:
    assert carried((0, 100), 0, 100)
    assert carried((0, 100), 50, 80)
    assert not carried((10, 100), 0, 100)  # served from later: never carried [0, 10)
    assert not carried((0, 99), 0, 100)  # not acked to the end


@pytest.mark.parametrize(
    ("vouches", "needed", "start", "end"),
    [
        ([], 1, 0, 10),
        ([(0, 10)], 1, 0, 10),
        ([(0, 9)], 1, 0, 10),
        ([(5, 10)], 1, 0, 10),
        ([(5, 10)], 1, 5, 10),
        ([(0, 10), (5, 20)], 1, 0, 20),
        ([(0, 10), (5, 20)], 2, 5, 10),
        ([(0, 10), (5, 20)], 2, 0, 10),
        ([(0, 30), (0, 20), (0, 10)], 2, 0, 20),
        ([(0, 30), (0, 20), (0, 10)], 3, 0, 20),
        ([(0, 30), (9, 30), (0, 30)], 2, 5, 30),
    ],
)
def test_the_quorum_agrees_with_the_plain_rule(
    vouches: list[tuple[int, int]], needed: int, start: int, end: int
) -> None:
    """``holds`` takes a shortcut for puts after every start; it must never change the answer."""
    quorum = Quorum.of(vouches, needed)
    expected = replicated_offset(vouches, needed, start) >= end
    assert quorum.holds(start, end) is expected
    assert quorum.highest == replicated_offset(vouches, needed)
    assert (len([v for v in vouches if carried(v, start, end)]) >= needed) is expected
    for i in quorum.vouchers(start, end):
        assert carried(vouches[i], start, end)


def test_a_quorum_of_nobody_is_refused_and_empty() -> None:
    for needed in (0, -1):
        with pytest.raises(ValueError, match=r"^needed must be positive$"):
            replicated_offset([(0, 10)], needed)
    empty = Quorum.of([], 1)
    assert (empty.vouches, empty.highest, empty.latest_served_from) == ((), -1, 0)
    assert not empty.holds(0, 1)
    assert Quorum.of([(7, 9), (3, 20)], 1).latest_served_from == 7


def test_availability_counts_slaves_within_fallbehind_max() -> None:
    quorum = Quorum.of([(0, 100), (0, 50)], 2)
    assert quorum.available(140, 91) is slaves_available([(0, 100), (0, 50)], 2, 140, 91)
    assert quorum.available(140, 91)
    assert not quorum.available(141, 91)  # the second slave is exactly 91 behind: too far
    assert not Quorum.of([], 1).available(0, 1 << 30)


# --- the table's declared target phases are checked when a rule runs -------------------------


def test_a_master_rule_reaching_an_undeclared_phase_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = (MasterPhase.AWAIT_REPORT, ReportReceived)
    rule = MASTER_TABLE[key]
    # A first report within the log leads to TRANSFER; declare CLOSED only.
    monkeypatch.setitem(MASTER_TABLE, key, Rule(rule.apply, (MasterPhase.CLOSED,)))
    with pytest.raises(AssertionError, match=r"led to TRANSFER.*declares only CLOSED"):
        master_step(MasterState(), ReportReceived(0, LOG), MasterOptions())


def test_a_slave_rule_reaching_an_undeclared_phase_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = (SlavePhase.DISCONNECTED, Connected)
    rule = SLAVE_TABLE[key]
    monkeypatch.setitem(SLAVE_TABLE, key, Rule(rule.apply, (SlavePhase.DISCONNECTED,)))
    with pytest.raises(AssertionError, match="led to TRANSFER"):
        slave_step(SlaveState(), Connected(0))


def test_every_declared_target_is_a_phase_of_its_side() -> None:
    for (phase, _event), rule in MASTER_TABLE.items():
        assert isinstance(phase, MasterPhase)
        assert rule.targets and all(isinstance(t, MasterPhase) for t in rule.targets)
    for (slave_phase, _event), slave_rule in SLAVE_TABLE.items():
        assert isinstance(slave_phase, SlavePhase)
        assert slave_rule.targets and all(isinstance(t, SlavePhase) for t in slave_rule.targets)


@pytest.mark.parametrize("needed", [0, -1])
def test_a_quorum_of_no_slaves_is_refused(needed: int) -> None:
    with pytest.raises(ValueError, match="needed must be positive"):
        replicated_offset([], needed)
