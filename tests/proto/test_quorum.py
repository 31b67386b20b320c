"""The sync replication rules (``trioha.proto.Quorum``, and failover mode's ``InSyncQuorum``)
and the table's declared targets."""

from __future__ import annotations

import pytest

from trioha.proto import (
    DURABLE_EVERYWHERE,
    MASTER_TABLE,
    SLAVE_TABLE,
    Connected,
    InSyncQuorum,
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


# --- failover mode: the SyncStateSet rule (InSyncQuorum) --------------------------------------


def sss(
    members: set[int],
    vouches: dict[int, tuple[int, int]],
    min_in_sync: int = 1,
    *,
    all_ack: bool = True,
    durable: int = DURABLE_EVERYWHERE,
) -> InSyncQuorum:
    return InSyncQuorum.of(
        1, members, vouches, min_in_sync, all_ack=all_ack, master_durable=durable
    )


def test_every_member_of_the_set_must_hold_a_put() -> None:
    rule = sss({1, 2, 3}, {2: (0, 100), 3: (0, 80)})
    assert rule.holders(0, 80) == {1, 2, 3}
    assert rule.holds(0, 80)
    assert rule.holders(0, 100) == {1, 2}
    assert not rule.holds(0, 100)  # broker 3 has not acked it


def test_a_broker_outside_the_set_counts_only_towards_min_in_sync() -> None:
    rule = sss({1, 2}, {2: (0, 50), 3: (0, 100)}, min_in_sync=2)
    assert not rule.holds(0, 100)  # member 2 lacks it, whoever else has it
    alone = sss({1}, {3: (0, 100)}, min_in_sync=2)
    assert alone.holds(0, 100)  # the set {1} holds it, and two brokers do


def test_min_in_sync_counts_brokers_holding_the_put_master_included() -> None:
    assert sss({1}, {}, min_in_sync=1).holds(0, 10)
    assert not sss({1}, {}, min_in_sync=2).holds(0, 10)
    assert sss({1}, {2: (0, 10)}, min_in_sync=2).holds(0, 10)


def test_without_all_ack_only_the_count_is_asked() -> None:
    rule = sss({1, 2, 3}, {2: (0, 100)}, min_in_sync=2, all_ack=False)
    assert rule.holds(0, 100)
    assert not sss({1, 2, 3}, {}, min_in_sync=2, all_ack=False).holds(0, 100)


def test_the_master_counts_itself_only_once_its_copy_is_durable() -> None:
    rule = sss({1, 2}, {2: (0, 100)}, durable=60)
    assert rule.holders(0, 100) == {2}
    assert not rule.holds(0, 100)
    assert rule.holds(0, 60)


def test_a_connection_vouches_in_the_set_rule_only_for_what_it_carried() -> None:
    rule = sss({1, 2}, {2: (50, 100)})
    assert not rule.holds(0, 60)  # served from 50: it never carried [0, 50)
    assert rule.holds(50, 60)


def test_before_the_append_a_set_smaller_than_min_in_sync_is_refused() -> None:
    assert not sss({1}, {}, min_in_sync=2).enough_members()
    assert sss({1, 2}, {}, min_in_sync=2).enough_members()


def test_a_put_may_wait_if_enough_brokers_could_come_to_hold_it() -> None:
    gap = 256 << 20
    assert sss({1}, {}, 1).available(10, gap)
    assert not sss({1, 2}, {}, 2).available(10, gap)  # nobody connected
    assert sss({1, 2}, {2: (0, 0)}, 2).available(10, gap)
    assert not sss({1, 2}, {2: (0, 0)}, 2).available(gap, gap)  # exactly fallbehind_max behind


def test_min_in_sync_below_one_means_one() -> None:
    assert sss({1}, {}, min_in_sync=0).min_in_sync == 1
