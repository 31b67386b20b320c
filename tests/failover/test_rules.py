"""Fencing, ranking and SyncStateSet maintenance, as the small functions they are."""

from __future__ import annotations

import pytest

from trioha.failover import (
    Decision,
    FailoverOptions,
    GroupKeys,
    Registration,
    Replica,
    campaign_decision,
    fence_deadline,
    keepalive_interval,
    rank,
    sss_change,
)

KEYS = GroupKeys.of("c", "b")


def test_a_master_acknowledges_for_four_fifths_of_the_ttl_after_sending_a_keepalive() -> None:
    assert fence_deadline(10_000, 3) == 12_400
    assert fence_deadline(0, 10) == 8_000
    assert fence_deadline(5, 1) == 805


def test_keepalives_go_three_times_per_ttl() -> None:
    assert keepalive_interval(3) == 1000
    assert keepalive_interval(2) == 666
    assert keepalive_interval(1) == 333


def test_options_refuse_what_cannot_work() -> None:
    with pytest.raises(ValueError, match="positive"):
        FailoverOptions(0, KEYS)
    with pytest.raises(ValueError, match="at least 1 second"):
        FailoverOptions(1, KEYS, lease_ttl=0)


# --- ranking ----------------------------------------------------------------------------------


def reg(broker: int, epoch: int, offset: int) -> Registration:
    return Registration(broker, epoch, offset)


def test_the_newest_epoch_then_the_longest_log_then_the_lowest_id_ranks_first() -> None:
    assert rank(1, 5, 0) > rank(2, 4, 10**9)
    assert rank(2, 5, 11) > rank(1, 5, 10)
    assert rank(1, 5, 10) > rank(2, 5, 10)


def test_alone_a_broker_campaigns_at_once() -> None:
    assert campaign_decision(1, (3, 10), None, {}) is Decision.CAMPAIGN


def test_with_rivals_a_broker_reports_its_log_first() -> None:
    rivals = {2: reg(2, 3, 5)}
    assert campaign_decision(1, (3, 10), None, rivals) is Decision.REPORT
    assert campaign_decision(1, (3, 10), reg(1, 3, 9), rivals) is Decision.REPORT
    assert campaign_decision(1, (3, 10), reg(1, 3, 10), rivals) is Decision.CAMPAIGN


def test_a_broker_backs_off_while_a_better_rival_is_alive() -> None:
    mine = reg(1, 3, 10)
    assert campaign_decision(1, (3, 10), mine, {2: reg(2, 3, 11)}) is Decision.BACK_OFF
    assert campaign_decision(1, (3, 10), mine, {2: reg(2, 4, 0)}) is Decision.BACK_OFF
    assert campaign_decision(2, (3, 10), reg(2, 3, 10), {1: reg(1, 3, 10)}) is Decision.BACK_OFF
    # An unreadable registration never outranks.
    assert campaign_decision(1, (3, 10), mine, {2: None}) is Decision.CAMPAIGN


# --- SyncStateSet maintenance -----------------------------------------------------------------


def change(
    members: set[int],
    replicas: list[Replica],
    live: set[int],
    *,
    now: int = 100_000,
    confirm: int | None = None,
) -> set[int] | None:
    new = sss_change(
        1,
        frozenset(members),
        replicas=replicas,
        live=live,
        now=now,
        ha_max=15_000,
        confirm_offset=confirm,
    )
    return None if new is None else set(new)


def test_a_member_whose_broker_is_gone_leaves() -> None:
    assert change({1, 2, 3}, [Replica(2, 50, 99_000), Replica(3, 50, 99_000)], {1, 2}) == {1, 2}


def test_a_member_that_has_not_caught_up_within_ha_max_leaves() -> None:
    replicas = [Replica(2, 50, 85_001), Replica(3, 50, 85_000)]
    assert change({1, 2, 3}, replicas, {1, 2, 3}) == {1, 2}


def test_a_healthy_set_stays() -> None:
    assert change({1, 2}, [Replica(2, 50, 99_999)], {1, 2}) is None


def test_a_lone_master_keeps_itself() -> None:
    assert change({1, 2}, [], {1}) == {1}
    assert change({2}, [], {2}) == {1, 2}  # the master is always a member of its own set


def test_a_slave_joins_once_it_holds_everything_acknowledged() -> None:
    caught_up = [Replica(2, 500, 99_000)]
    assert change({1}, caught_up, {1, 2}, confirm=501) is None
    assert change({1}, caught_up, {1, 2}, confirm=500) == {1, 2}
    assert change({1}, caught_up, {1, 2}) is None  # no fresh confirm offset: no joining
    assert change({1}, caught_up, {1}, confirm=0) is None  # not alive in etcd
    stale = [Replica(2, 500, 85_000)]
    assert change({1}, stale, {1, 2}, confirm=0) is None  # has not caught up lately
    gone = [Replica(2, -1, 99_000)]
    assert change({1}, gone, {1, 2}, confirm=0) is None  # not connected
