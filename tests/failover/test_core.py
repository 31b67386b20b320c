"""The replica manager's control core, one rule at a time, against the in-memory etcd.

Each test reads like a sentence of docs/failover.md; the group is driven by hand
(:class:`tests.failover._group.Group`), so every request's timing is the test's to choose.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import trioha.failover
from tests.failover._group import KEYS, Group
from trioha._status import PutStatus
from trioha.failover import (
    FAILOVER_TABLE,
    Alert,
    BecomeMaster,
    BecomeSlave,
    Compare,
    EventType,
    Failed,
    FailInFlight,
    Fence,
    GroupView,
    Handover,
    HandoverState,
    KeyValue,
    LeaseGrant,
    LeaseGrantResponse,
    LogChanged,
    MasterRecord,
    Phase,
    Purpose,
    Put,
    Range,
    RangeResponse,
    ReplicaAcked,
    ReplicaState,
    Replied,
    RoleChangeFailed,
    SendRequest,
    SetSyncStateSet,
    Shutdown,
    SyncStateSet,
    Tick,
    Txn,
    TxnResponse,
    Unfence,
    Watched,
    WatchEvent,
    failover_step,
    handover_refusal,
    handover_txn,
)
from trioha.failover._core import _EVENTS


def members(g: Group) -> frozenset[int]:
    (kv,) = [kv for kv in g.etcd.kvs() if kv.key == KEYS.sync_state_set]
    return SyncStateSet.decode(kv.key, kv.value).members


def master(g: Group) -> MasterRecord | None:
    for kv in g.etcd.kvs():
        if kv.key == KEYS.master:
            return MasterRecord.decode(kv.key, kv.value)
    return None


def counter(g: Group) -> bytes:
    (kv,) = [kv for kv in g.etcd.kvs() if kv.key == KEYS.epoch]
    return kv.value


def running(n: int = 2, *, sss: tuple[int, ...] = (1, 2), **options: Any) -> Group:
    """A started group whose set is *sss* (every slave in it caught up at offset 0)."""
    g = Group(n, **options)
    g.start()
    for i in sss[1:]:
        g.feed(1, ReplicaAcked(i, 0, True, 0))
        g.deliver()
    assert members(g) == frozenset(sss)
    return g


def keep_alive(g: Group, *brokers: int, ms: int = 1000) -> None:
    """Time passes; the named brokers' keepalives (and everything else) get through."""
    g.tick(ms)
    skip = tuple(b for b in g.brokers if b not in brokers)
    g.inbox = [p for p in g.inbox if not (p.broker in skip and p.purpose is Purpose.KEEPALIVE)]
    g.deliver(skip=())


# --- the first master and the set -------------------------------------------------------------


def test_the_first_broker_becomes_master_of_epoch_one_alone_in_the_set() -> None:
    g = Group(3)
    g.start()
    assert [g.phase(i) for i in g.brokers] == [Phase.MASTER, Phase.FOLLOWER, Phase.FOLLOWER]
    assert master(g) == MasterRecord(1, 1, "h1:10911", "h1:10912")
    assert counter(g) == b"1"
    assert members(g) == {1}
    assert g.actions(1, BecomeMaster) == [BecomeMaster(1, frozenset({1}))]
    assert g.actions(1, Unfence) == [Unfence(2400)]
    for i in (2, 3):
        assert g.actions(i, BecomeSlave) == [
            BecomeSlave(MasterRecord(1, 1, "h1:10911", "h1:10912"))
        ]


def test_a_caught_up_slave_joins_through_a_fenced_transaction_and_counts_at_once() -> None:
    g = Group(2)
    g.start()
    token = g.cores[1].token
    sss_revision = g.cores[1].view.sss.mod_revision
    actions = g.feed(1, ReplicaAcked(2, 0, True, 0))
    # The union is in force before the change is even sent.
    assert actions[0] == SetSyncStateSet(frozenset({1, 2}))
    send = actions[1]
    assert isinstance(send, SendRequest)
    assert send.purpose is Purpose.ALTER
    assert isinstance(send.request, Txn)
    assert send.request.compare == (
        Compare.created_at(KEYS.master, token),
        Compare.modified_at(KEYS.sync_state_set, sss_revision),
    )
    g.deliver()
    assert members(g) == {1, 2}
    assert g.cores[1].sss == {1, 2}


def test_a_slave_short_of_the_confirm_offset_does_not_join() -> None:
    g = Group(2)
    g.start()
    assert g.feed(1, ReplicaAcked(2, 100, False, 100)) == ()  # never caught up with the end
    assert g.feed(1, ReplicaAcked(2, 99, True, 100)) == ()  # short of the confirm offset
    assert g.feed(1, ReplicaAcked(2, 100, True, 100))[0] == SetSyncStateSet(frozenset({1, 2}))


def test_a_member_whose_broker_is_gone_from_etcd_leaves_only_once_committed() -> None:
    g = running(3, sss=(1, 2, 3))
    start = len(g.log)
    for _ in range(4):  # broker 3 is cut off from etcd: its lease runs out
        keep_alive(g, 1, 2)
    assert members(g) == {1, 2}
    after = [a for i, a in g.log[start:] if i == 1 and not _routine(a)]
    # The data plane kept waiting for broker 3 until etcd had the smaller set.
    assert [type(a) for a in after] == [SendRequest, SetSyncStateSet]
    assert after[1] == SetSyncStateSet(frozenset({1, 2}))


def _routine(action: object) -> bool:
    """A keepalive sent or its deadline applied."""
    if isinstance(action, SendRequest):
        return action.purpose is Purpose.KEEPALIVE
    return isinstance(action, Unfence)


def test_a_member_that_does_not_catch_up_in_time_leaves() -> None:
    g = running(2, sss=(1, 2), ha_max_time_slave_not_catchup=2500)
    g.tick(2000)
    g.deliver()
    assert members(g) == {1, 2}
    g.tick(1000)
    g.deliver()
    assert members(g) == {1}  # availability over redundancy: the master may go on alone


# --- fencing ----------------------------------------------------------------------------------


def test_the_deadline_counts_from_when_the_keepalive_was_sent() -> None:
    g = Group(1)
    g.start()
    g.tick(1000)
    keepalive = g.take(Purpose.KEEPALIVE)
    g.now += 1500  # the reply comes 1.5 s later
    g.apply(keepalive)
    g.deliver()
    assert g.actions(1, Unfence)[-1] == Unfence(1000 + 2400)
    g.now = 3399
    g.feed(1, Tick())
    g.inbox.clear()
    assert g.phase(1) is Phase.MASTER
    g.now = 3400
    actions = g.feed(1, Tick())
    assert g.phase(1) is Phase.FENCED
    assert Fence in [type(a) for a in actions]
    assert FailInFlight(PutStatus.FLUSH_SLAVE_TIMEOUT) in actions


def test_a_keepalive_that_succeeds_in_time_unfences() -> None:
    g = Group(1)
    g.start()
    g.tick(2400)  # past the grant's deadline: fenced, a keepalive goes out
    assert g.phase(1) is Phase.FENCED
    g.deliver()  # the lease still lives in etcd (3 s)
    assert g.phase(1) is Phase.MASTER
    assert g.actions(1, Unfence)[-1] == Unfence(2400 + 2400)


def test_a_lease_etcd_no_longer_knows_starts_the_broker_over() -> None:
    g = Group(1)
    g.start()
    g.tick(1000)
    keepalive = g.take(Purpose.KEEPALIVE)
    g.now = 3000  # the lease expires in etcd before the keepalive gets there
    reply = g.apply(keepalive)
    g.outbox.clear()
    actions = g.feed(1, Replied(keepalive.request_id, reply))
    assert g.phase(1) is Phase.STARTING
    assert g.cores[1].lease == 0
    assert [type(a) for a in actions[:2]] == [Fence, FailInFlight]
    assert g.inbox[-1].purpose is Purpose.GRANT  # a new lease is asked for at once
    g.deliver()
    assert g.phase(1) is Phase.MASTER
    assert master(g) == MasterRecord(1, 2, "h1:10911", "h1:10912")


# --- elections --------------------------------------------------------------------------------


def test_a_member_campaigns_when_the_master_key_goes_and_drops_the_old_master() -> None:
    g = running(2, sss=(1, 2))
    sss_revision = g.etcd.state.get(KEYS.sync_state_set).mod_revision  # type: ignore[union-attr]
    epoch_revision = g.etcd.state.get(KEYS.epoch).mod_revision  # type: ignore[union-attr]
    for _ in range(4):  # broker 1 is cut off from etcd
        keep_alive(g, 2)
    campaign = [a for a in g.actions(2, SendRequest) if a.purpose is Purpose.CAMPAIGN]
    (send,) = campaign
    assert isinstance(send.request, Txn)
    assert send.request.compare == (
        Compare.absent(KEYS.master),
        Compare.modified_at(KEYS.sync_state_set, sss_revision),
        Compare.modified_at(KEYS.epoch, epoch_revision),
        Compare.absent(KEYS.handover),  # no operator's handover is pending
    )
    assert master(g) == MasterRecord(2, 2, "h2:10911", "h2:10912")
    assert counter(g) == b"2"
    assert g.actions(2, BecomeMaster) == [BecomeMaster(2, frozenset({1, 2}))]
    assert g.cores[2].token == g.etcd.state.get(KEYS.master).create_revision  # type: ignore[union-attr]
    assert members(g) == {2}  # broker 1's registration went with its lease


def test_the_best_live_candidate_goes_first() -> None:
    g = running(3, sss=(1, 2, 3))
    g.feed(2, LogChanged(300, 1))
    g.feed(3, LogChanged(200, 1))
    for _ in range(4):
        keep_alive(g, 2, 3)
    assert master(g) == MasterRecord(2, 2, "h2:10911", "h2:10912")
    assert not [a for a in g.actions(3, SendRequest) if a.purpose is Purpose.CAMPAIGN]
    reports = [a for a in g.actions(3, SendRequest) if a.purpose is Purpose.REPORT]
    assert reports  # broker 3 reported its log before it backed off
    assert g.actions(3, BecomeSlave)[-1] == BecomeSlave(MasterRecord(2, 2, "h2:10911", "h2:10912"))


def test_a_broker_outside_the_set_never_campaigns() -> None:
    g = running(2, sss=(1,))
    for _ in range(6):
        keep_alive(g, 2)
    assert master(g) is None
    assert not [a for a in g.actions(2, SendRequest) if a.purpose is Purpose.CAMPAIGN]


def test_an_unclean_election_says_how_much_it_loses() -> None:
    g = running(2, sss=(1,), enable_elect_unclean_master=True)
    g.feed(2, LogChanged(200, 1))
    # Broker 1 last registered a log of 500 bytes.
    g.feed(1, LogChanged(500, 1))
    g.etcd.request(Txn((), (Put(KEYS.broker(1), _registration(1, 500), g.cores[1].lease),)))
    for _ in range(4):
        keep_alive(g, 2)
    (became,) = g.actions(2, BecomeMaster)
    assert became == BecomeMaster(2, frozenset({2}), unclean_lost=300)
    assert members(g) == {2}
    assert any("unclean election" in a.message for a in g.actions(2, Alert))


def _registration(broker: int, max_offset: int) -> bytes:
    from trioha.failover import Registration

    return Registration(broker, 1, max_offset).encode()


def test_a_campaign_whose_reply_is_lost_is_recognised_when_it_goes_again() -> None:
    g = running(2, sss=(1, 2))
    for _ in range(4):  # broker 1 is cut off; broker 2 sees the vacancy and campaigns
        g.tick(1000)
        g.deliver(skip=(1,), hold=(Purpose.CAMPAIGN,))
    campaign = g.take(Purpose.CAMPAIGN, 2)
    g.etcd.request(campaign.request)  # it lands; the reply is lost
    g.feed(2, Failed(campaign.request_id, "timed out"))
    again = g.take(Purpose.CAMPAIGN, 2)
    assert again.request == campaign.request
    reply = g.apply(again)
    assert isinstance(reply, TxnResponse)
    assert not reply.succeeded  # the first copy holds the key: this one only reads
    g.deliver(skip=(1,))
    assert g.phase(2) is Phase.MASTER
    assert g.actions(2, BecomeMaster)[-1].epoch == 2


def test_an_alter_whose_reply_is_lost_goes_again_against_the_same_revision() -> None:
    g = Group(2)
    g.start()
    g.feed(1, ReplicaAcked(2, 0, True, 0))
    first = g.take(Purpose.ALTER)
    g.etcd.request(first.request)  # lands; no reply
    g.feed(1, Failed(first.request_id))
    again = g.take(Purpose.ALTER)
    assert again.request == first.request
    assert g.cores[1].proposal is not None
    g.apply(again)  # fails its compare: the first copy landed
    g.deliver()
    after = g.cores[1]
    assert after.proposal is None
    assert after.sss == {1, 2}
    assert members(g) == {1, 2}


# --- news from etcd, stale or odd -------------------------------------------------------------


def test_a_stale_or_repeated_watch_event_changes_nothing() -> None:
    g = running(2, sss=(1, 2))
    before = g.cores[2]
    old = WatchEvent(EventType.DELETE, KeyValue(KEYS.master, mod_revision=1))
    assert g.feed(2, Watched((old,))) == ()
    assert g.cores[2] == before


def test_a_master_key_from_an_earlier_start_is_waited_out() -> None:
    g = running(2, sss=(1, 2))
    g.cores[1] = ReplicaState()  # broker 1 restarts; its old lease still lives in etcd
    g.tick(0, 1)
    g.deliver()
    assert g.phase(1) is Phase.FOLLOWER
    assert any("earlier start" in a.message for a in g.actions(1, Alert))
    assert not g.actions(1, BecomeSlave)
    for _ in range(4):  # nobody keeps the old lease alive
        keep_alive(g, 1, 2)
    assert master(g) is not None
    assert master(g).broker_id in (1, 2)  # type: ignore[union-attr]
    assert master(g).epoch == 2  # type: ignore[union-attr]


def test_a_broker_whose_epoch_file_is_ahead_of_etcd_refuses_to_be_master() -> None:
    g = running(2, sss=(1, 2))
    g.feed(2, LogChanged(0, 7))
    for _ in range(4):
        keep_alive(g, 2)
    assert master(g) is None
    assert any("ahead of etcd" in a.message for a in g.actions(2, Alert))


def test_an_unreadable_set_stops_campaigns_and_says_which_key() -> None:
    g = running(2, sss=(1, 2))
    g.etcd.request(Txn((), (Put(KEYS.sync_state_set, b"not json"),)))
    g.deliver()
    for _ in range(4):
        keep_alive(g, 2)
    assert master(g) is None
    (alert,) = [a for a in g.actions(2, Alert) if "syncStateSet" in a.message]
    assert "not JSON" in alert.message


# --- giving up --------------------------------------------------------------------------------


def test_a_master_that_cannot_take_its_epoch_gives_up_the_key() -> None:
    g = Group(1)
    g.start()
    actions = g.feed(1, RoleChangeFailed("the epoch file is at 3"))
    assert g.phase(1) is Phase.STARTING
    assert isinstance(actions[0], Alert)
    assert [p.purpose for p in g.inbox] == [Purpose.GRANT, Purpose.REVOKE]
    g.apply(g.take(Purpose.REVOKE))
    assert master(g) is None
    g.feed(1, LogChanged(0, 3))  # what the data plane says of its epoch file
    g.deliver()
    assert master(g) is None
    assert any("ahead of etcd" in a.message for a in g.actions(1, Alert))


def test_shutdown_hands_the_key_back_at_once() -> None:
    g = running(2, sss=(1, 2))
    actions = g.feed(1, Shutdown())
    assert [type(a) for a in actions[:2]] == [Fence, FailInFlight]
    assert g.phase(1) is Phase.STOPPED
    g.apply(g.take(Purpose.REVOKE, 1))
    assert master(g) is None
    g.deliver()
    assert master(g) == MasterRecord(2, 2, "h2:10911", "h2:10912")


# --- handing the master role over ------------------------------------------------------------


def read_view(g: Group) -> GroupView:
    """The group as the operator's command reads it."""
    reply = g.etcd.request(Range.prefix(KEYS.prefix))
    assert isinstance(reply, RangeResponse)
    return GroupView().snapshot(KEYS, reply.revision, reply.kvs)


def request_handover(g: Group, target: int, *, timeout_ms: int = 5000) -> None:
    """What ``failover-elect`` writes: the request, bound to a lease of the operator's."""
    grant = g.etcd.request(LeaseGrant(30))
    assert isinstance(grant, LeaseGrantResponse)
    txn = handover_txn(KEYS, read_view(g), target, lease=grant.lease, timeout_ms=timeout_ms)
    reply = g.etcd.request(txn)
    assert isinstance(reply, TxnResponse) and reply.succeeded


def handover_key(g: Group) -> Handover | None:
    for kv in g.etcd.kvs():
        if kv.key == KEYS.handover:
            return Handover.decode(kv.key, kv.value)
    return None


def test_a_handover_fences_waits_for_the_target_then_gives_it_the_key() -> None:
    g = running(3, sss=(1, 2, 3))
    g.feed(1, LogChanged(100, 1, 100))  # the master's log ends at 100, all of it acknowledged
    g.feed(1, ReplicaAcked(2, 100, True, 100))
    g.feed(1, ReplicaAcked(3, 60, False, 100))  # the target is 40 bytes behind
    g.deliver()
    assert handover_refusal(KEYS, read_view(g), 3) == ""
    request_handover(g, 3)
    before = len(g.log)
    g.deliver()
    assert g.phase(1) is Phase.HANDING_OVER
    fence = [a for b, a in g.log[before:] if b == 1]
    assert [type(a) for a in fence[:2]] == [Fence, FailInFlight]
    assert fence[1] == FailInFlight(PutStatus.FLUSH_SLAVE_TIMEOUT)
    assert "handing the master role of epoch 1 over to broker 3" in fence[0].reason  # type: ignore[union-attr]
    assert master(g) == MasterRecord(1, 1, "h1:10911", "h1:10912")  # waits for the target
    keep_alive(g, 1, 2, 3)
    assert not [a for b, a in g.log[before:] if b == 1 and isinstance(a, Unfence)]
    g.feed(1, ReplicaAcked(3, 100, True, 100))  # the target holds the whole log now
    g.deliver()
    # Broker 3 won, though broker 2 (same log, lower id) ranks higher in an election.
    assert master(g) == MasterRecord(3, 2, "h3:10911", "h3:10912")
    assert counter(g) == b"2"
    assert handover_key(g) is None  # the campaign ended the request
    assert g.actions(3, BecomeMaster) == [BecomeMaster(2, frozenset({1, 2, 3}))]
    assert not [p for b, p in g.log[before:] if b == 2 and _campaigns(p)]
    new = MasterRecord(3, 2, "h3:10911", "h3:10912")
    for i in (1, 2):
        assert g.actions(i, BecomeSlave)[-1] == BecomeSlave(new)
    assert g.phase(1) is Phase.FOLLOWER
    assert g.cores[3].token == g.etcd.state.get(KEYS.master).create_revision  # type: ignore[union-attr]


def _campaigns(action: object) -> bool:
    return isinstance(action, SendRequest) and action.purpose is Purpose.CAMPAIGN


def test_a_handover_to_a_broker_outside_the_set_is_refused_by_the_master() -> None:
    g = running(3, sss=(1, 2))
    view = read_view(g)
    assert "broker 3 is not in the SyncStateSet [1, 2]" in handover_refusal(KEYS, view, 3)
    request_handover(g, 3)  # written anyway (as if the set changed after the check)
    g.deliver()
    refused = handover_key(g)
    assert refused is not None and refused.state is HandoverState.REFUSED
    assert "broker 3 is not in the SyncStateSet [1, 2]" in refused.reason
    assert g.phase(1) is Phase.MASTER
    assert not g.actions(1, Fence)
    assert master(g) == MasterRecord(1, 1, "h1:10911", "h1:10912")


def test_what_the_command_refuses_before_it_writes_anything() -> None:
    empty = Group(2)
    assert "not found in etcd" in handover_refusal(KEYS, read_view(empty), 2)
    g = running(3, sss=(1, 2, 3))
    assert "broker 7 is not registered" in handover_refusal(KEYS, read_view(g), 7)
    assert "registered: [1, 2, 3]" in handover_refusal(KEYS, read_view(g), 7)
    request_handover(g, 2, timeout_ms=60_000)
    g.feed(1, LogChanged(100, 1, 100))  # the target is behind: the master waits
    assert "a handover to broker 2 is already requested" in handover_refusal(KEYS, read_view(g), 3)
    g.feed(1, Shutdown())
    g.apply(g.take(Purpose.REVOKE, 1))
    assert "has no master" in handover_refusal(KEYS, read_view(g), 2)


def test_a_target_that_does_not_catch_up_in_time_is_refused_and_the_master_acks_again() -> None:
    g = running(2, sss=(1, 2))
    g.feed(1, LogChanged(100, 1, 100))
    request_handover(g, 2, timeout_ms=1500)
    g.deliver()
    assert g.phase(1) is Phase.HANDING_OVER
    keep_alive(g, 1, 2)
    assert g.phase(1) is Phase.HANDING_OVER
    keep_alive(g, 1, 2)  # 2 s: past the request's 1.5 s
    assert g.phase(1) is Phase.MASTER
    assert g.actions(1, Unfence)[-1].until > g.now
    refused = handover_key(g)
    assert refused is not None and refused.state is HandoverState.REFUSED
    assert "broker 2 did not catch up in time (it vouches for 0 of the master's 100" in (
        refused.reason
    )
    assert master(g) == MasterRecord(1, 1, "h1:10911", "h1:10912")
    g.feed(1, ReplicaAcked(2, 100, True, 100))  # judged once: a refused request stays refused
    g.deliver()
    assert g.phase(1) is Phase.MASTER


def test_a_master_that_dies_while_handing_over_is_replaced_by_an_ordinary_election() -> None:
    g = running(3, sss=(1, 2, 3))
    g.feed(1, LogChanged(100, 1, 100))
    request_handover(g, 3)
    g.deliver()
    assert g.phase(1) is Phase.HANDING_OVER
    for _ in range(4):  # broker 1 is cut off before it released anything
        keep_alive(g, 2, 3)
    record = master(g)
    # Never released: the request named no one to the others; the best candidate won, and
    # its campaign ended the request.
    assert record is not None and record.broker_id == 2 and record.epoch == 2
    assert handover_key(g) is None


# --- the table --------------------------------------------------------------------------------


def test_every_phase_handles_every_event() -> None:
    assert set(FAILOVER_TABLE) == {(phase, event) for phase in Phase for event in _EVENTS}


def test_an_event_the_table_refuses_is_a_local_protocol_error() -> None:
    from trioha._errors import LocalProtocolError

    class Strange:
        pass

    with pytest.raises(LocalProtocolError, match="Strange in phase STARTING"):
        failover_step(ReplicaState(), Strange(), 0, Group(1).options[1])  # type: ignore[arg-type]


def test_the_control_core_does_no_io() -> None:
    forbidden = {"trio", "socket", "os", "time", "asyncio", "selectors"}
    package = Path(trioha.failover.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"
