"""Four brokers' control cores against :class:`trioha.testing.MemoryEtcd`, driven by Hypothesis.

``test_machine.py`` walks the model's world, whose clock moves in whole ticks. This machine
keeps only the control plane, and lets the clock move by any number of milliseconds between
any two events, so the fencing arithmetic meets every gap between a keepalive's send, its
arrival, its reply, the lease's expiry in etcd and the next tick. The cores are the production
:func:`~trioha.failover.failover_step`, wired to the in-memory etcd by
:class:`tests.failover._group.Group`; the data plane is a stub that records what it was told
(the epoch file's last epoch and log end, which it reports back, and whether it may
acknowledge). Requests and replies wait in a bag delivered in any order; any of them may be
lost (the core is told ``Failed``, after the request landed or not) or land twice; watches
deliver late, in pieces, or again; brokers crash (memory lost, the epoch file kept), shut down
and restart; an operator asks the master to hand its role to any broker (what
``failover-elect`` writes, without its checks, bound to a lease that expires).

After every step, with the clock as it reads then:

* **FencedByEtcd**: a broker the data plane lets acknowledge (an ``Unfence`` deadline not yet
  passed, no ``Fence`` since) is the broker etcd's master key names, at the token it won;
* so at most one broker acknowledges at any moment;
* **SSSSuperset**: that broker waits for every member of etcd's SyncStateSet;
* **EpochsOnce**: no two ``BecomeMaster`` ever name one epoch, and the master key's epoch is
  etcd's counter;
* **SSSChangeFenced**: etcd takes a SyncStateSet change only from the broker holding the key.

At the end, once the faults stop: the group elects a master that acknowledges, soon.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.failover._group import KEYS, Group, Pending
from trioha.failover import (
    Action,
    BecomeMaster,
    BecomeSlave,
    Event,
    Failed,
    Fence,
    GroupView,
    LeaseGrant,
    LeaseGrantResponse,
    LogChanged,
    MasterRecord,
    Phase,
    Purpose,
    Range,
    RangeResponse,
    ReplicaAcked,
    ReplicaGone,
    ReplicaState,
    Replied,
    Response,
    RoleChangeFailed,
    SetSyncStateSet,
    Shutdown,
    SyncStateSet,
    Tick,
    TxnResponse,
    Unfence,
    Unsafe,
    Watched,
    handover_txn,
)

BROKERS = 4
TTL = 2
#: Fault-free rounds a settled group may need before a master acknowledges.
RECOVERY_ROUNDS = 60
#: The phases in which a broker holds the master key as far as it knows.
HOLDING = (Phase.MASTER, Phase.FENCED, Phase.HANDING_OVER)


class DataPlane:
    """What one broker's data plane was told, and what it reports."""

    def __init__(self) -> None:
        self.last_epoch = 0
        self.max_offset = 0
        self.ack_until = 0
        self.members: frozenset[int] = frozenset()
        self.master = 0

    def crash(self) -> None:
        """Memory is gone; the epoch file and the flushed log stay."""
        self.ack_until = 0
        self.members = frozenset()
        self.master = 0


class GroupMachine(RuleBasedStateMachine):
    brokers: ClassVar[int] = BROKERS
    unsafe: ClassVar[Unsafe] = Unsafe()
    #: Start from a group that elected broker 1 and settled (every run begins with it).
    start_running: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        self.g = Group(
            self.brokers, lease_ttl=TTL, ha_max_time_slave_not_catchup=3000, unsafe=self.unsafe
        )
        self.planes = {i: DataPlane() for i in self.g.brokers}
        self.up = set(self.g.brokers)
        self.epochs_begun: dict[int, int] = {}
        self.counter = 0
        self.trail: list[str] = []
        self.queue: list[tuple[int, Event]] = []
        self.busy = False
        if self.start_running:
            for i in self.g.brokers:
                self.tick(i)
                self.settle()

    # --- wiring -------------------------------------------------------------------------------
    def feed(self, i: int, event: Event) -> None:
        """Feed *event* and carry out every action, in order, before the next event (as the
        Trio layer must): facts the actions give rise to wait in a queue."""
        self.queue.append((i, event))
        if self.busy:
            return
        self.busy = True
        try:
            while self.queue:
                j, next_event = self.queue.pop(0)
                g = self.g
                before = len(g.log)
                g.feed(j, next_event)
                self.trail.append(f"t={g.now} b{j} <- {next_event!r} -> {g.phase(j).value}")
                for _, action in g.log[before:]:
                    self.carry_out(j, action)
        finally:
            self.busy = False

    def carry_out(self, i: int, action: Action) -> None:
        """What the data plane does with each action (facts go back as events)."""
        plane = self.planes[i]
        match action:
            case BecomeMaster(epoch=epoch, members=members):
                if epoch <= plane.last_epoch:
                    self.feed(i, RoleChangeFailed(f"epoch file at {plane.last_epoch}"))
                    return
                other = self.epochs_begun.setdefault(epoch, i)
                assert other == i, f"EpochsOnce: b{other} and b{i} both began epoch {epoch}"
                plane.last_epoch, plane.master, plane.members = epoch, i, members
                plane.ack_until = 0
                self.feed(i, LogChanged(plane.max_offset, epoch, plane.max_offset))
            case BecomeSlave(master=record):
                plane.master, plane.ack_until = record.broker_id, 0
            case Unfence(until=until):
                if plane.master == i:
                    plane.ack_until = until
            case Fence():
                plane.ack_until = 0
            case SetSyncStateSet(members=members):
                plane.members = members
            case _:
                pass  # requests and watches are the Group's; alerts and FailInFlight: no state

    def reply(self, p: Pending) -> Response:
        """etcd answers *p*; judged against SSSChangeFenced on the way."""
        etcd = self.g.etcd
        holder = etcd.state.get(KEYS.master)
        before = etcd.state.get(KEYS.sync_state_set)
        response = etcd.request(p.request)
        after = etcd.state.get(KEYS.sync_state_set)
        if p.purpose is Purpose.ALTER and before != after:
            assert holder is not None, f"SSSChangeFenced: b{p.broker} changed the set, no master"
            record = MasterRecord.decode(holder.key, holder.value)
            assert record.broker_id == p.broker, (
                f"SSSChangeFenced: b{p.broker} changed the set while b{record.broker_id} is master"
            )
        return response

    def running(self, i: int) -> bool:
        return i in self.up and self.g.phase(i) is not Phase.STOPPED

    # --- rules --------------------------------------------------------------------------------
    @rule(ms=st.integers(1, 1500))
    def time_passes(self, ms: int) -> None:
        self.g.now += ms
        self.g.etcd.tick()

    @rule(rounds=st.integers(1, 20))
    def settle(self, rounds: int = 20) -> None:
        """The network is fast for a while: every request lands, every reply and watch event
        arrives, round after round."""
        g = self.g
        for _ in range(rounds):
            if not (g.inbox or g.outbox or any(self.watch_due(i) for i in g.brokers)):
                return
            for p in list(g.inbox):
                g.inbox.remove(p)
                g.outbox.append((p.broker, p.request_id, self.reply(p)))
            for broker, request_id, response in list(g.outbox):
                g.outbox.remove((broker, request_id, response))
                if self.running(broker):
                    self.feed(broker, Replied(request_id, response))
            for i in g.brokers:
                self.watch_delivers(i, 1000)

    def watch_due(self, i: int) -> bool:
        g = self.g
        if not self.running(i) or i not in g.watches:
            return False
        watched, start = g.watches[i]
        return bool(g.etcd.events(watched, start))

    @rule(ms=st.integers(1, 1500))
    def everyone_ticks(self, ms: int) -> None:
        self.time_passes(ms)
        for i in self.g.brokers:
            self.tick(i)

    @rule(i=st.integers(1, BROKERS))
    def tick(self, i: int) -> None:
        if self.running(i):
            self.feed(i, Tick())

    @precondition(lambda self: bool(self.g.inbox))
    @rule(data=st.data(), twice=st.booleans())
    def etcd_answers(self, data: st.DataObject, twice: bool) -> None:
        """A request lands (a retry below the client may land it twice); its reply waits."""
        p = data.draw(st.sampled_from(self.g.inbox))
        self.g.inbox.remove(p)
        response = self.reply(p)
        if twice:
            response = self.reply(p)
        self.g.outbox.append((p.broker, p.request_id, response))

    @precondition(lambda self: bool(self.g.outbox))
    @rule(data=st.data())
    def reply_arrives(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(self.g.outbox))
        self.g.outbox.remove(item)
        broker, request_id, response = item
        if self.running(broker):
            self.feed(broker, Replied(request_id, response))

    @precondition(lambda self: bool(self.g.inbox) or bool(self.g.outbox))
    @rule(data=st.data(), landed=st.booleans())
    def times_out(self, data: st.DataObject, landed: bool) -> None:
        """A request or its reply is lost: it landed or not, and the core hears ``Failed``."""
        waiting: list[tuple[int, int, Pending | None]]
        waiting = [(p.broker, p.request_id, p) for p in self.g.inbox]
        waiting += [(b, r, None) for b, r, _ in self.g.outbox]
        broker, request_id, pending = data.draw(st.sampled_from(waiting))
        if pending is not None:
            self.g.inbox.remove(pending)
            if landed:
                self.reply(pending)
        else:
            self.g.outbox[:] = [o for o in self.g.outbox if o[:2] != (broker, request_id)]
        if self.running(broker):
            self.feed(broker, Failed(request_id, "timed out"))

    @rule(i=st.integers(1, BROKERS), some=st.integers(1, 3))
    def watch_delivers(self, i: int, some: int) -> None:
        """The watch delivers its next events, possibly only the first few."""
        g = self.g
        if not self.running(i) or i not in g.watches:
            return
        watched, start = g.watches[i]
        events = g.etcd.events(watched, start)[:some]
        if events:
            g.watches[i] = (watched, events[-1].revision + 1)
            self.feed(i, Watched(tuple(events)))

    @rule(i=st.integers(1, BROKERS), back=st.integers(1, 6))
    def stale_watch(self, i: int, back: int) -> None:
        """Events already delivered come again (a watch restarted too far back)."""
        g = self.g
        if not self.running(i) or i not in g.watches:
            return
        watched, start = g.watches[i]
        events = g.etcd.events(watched, max(1, start - back))
        old = tuple(e for e in events if e.revision < start)
        if old:
            self.feed(i, Watched(old))

    @rule(i=st.integers(1, BROKERS), grow=st.integers(0, 3))
    def log_changes(self, i: int, grow: int) -> None:
        if not self.running(i):
            return
        plane = self.planes[i]
        plane.max_offset += grow
        self.feed(i, LogChanged(plane.max_offset, plane.last_epoch, plane.max_offset))

    @rule(i=st.integers(1, BROKERS), j=st.integers(1, BROKERS), caught_up=st.booleans())
    def slave_reports(self, i: int, j: int, caught_up: bool) -> None:
        """Master *i* hears from slave *j* (when *j* follows it)."""
        if i == j or not self.running(i) or not self.running(j):
            return
        if self.planes[j].master != i or self.g.phase(i) not in HOLDING:
            return
        offset = self.planes[i].max_offset
        acked = offset if caught_up else max(0, offset - 1)
        self.feed(i, ReplicaAcked(j, acked, caught_up, offset))

    @rule(i=st.integers(1, BROKERS), j=st.integers(1, BROKERS))
    def slave_disconnects(self, i: int, j: int) -> None:
        if i != j and self.running(i) and self.g.phase(i) in HOLDING:
            self.feed(i, ReplicaGone(j))

    @rule(
        to=st.integers(1, BROKERS),
        timeout_ms=st.integers(0, 4000),
        ttl=st.integers(1, 6),
    )
    def operator_hands_over(self, to: int, timeout_ms: int, ttl: int) -> None:
        """``failover-elect`` writes its request (without its own checks first, as if the
        group changed after it read it), bound to a lease of *ttl* seconds that nobody keeps
        alive."""
        etcd = self.g.etcd
        read = etcd.request(Range.prefix(KEYS.prefix))
        assert isinstance(read, RangeResponse)
        view = GroupView().snapshot(KEYS, read.revision, read.kvs)
        if view.master.current is None:
            return
        grant = etcd.request(LeaseGrant(ttl))
        assert isinstance(grant, LeaseGrantResponse)
        txn = handover_txn(KEYS, view, to, lease=grant.lease, timeout_ms=timeout_ms)
        reply = etcd.request(txn)
        assert isinstance(reply, TxnResponse) and reply.succeeded
        self.trail.append(f"t={self.g.now} operator: hand over to b{to} ({timeout_ms} ms)")

    @rule(i=st.integers(1, BROKERS))
    def crash(self, i: int) -> None:
        """Power cut: the core's memory, its requests and replies are gone; etcd keeps its
        lease until it expires."""
        if i not in self.up:
            return
        self.up.discard(i)
        self.planes[i].crash()
        g = self.g
        g.inbox[:] = [p for p in g.inbox if p.broker != i]
        g.outbox[:] = [o for o in g.outbox if o[0] != i]
        g.watches.pop(i, None)
        self.trail.append(f"t={g.now} b{i} crashes")

    @rule(i=st.integers(1, BROKERS))
    def shutdown(self, i: int) -> None:
        if self.running(i):
            self.feed(i, Shutdown())

    @rule(i=st.integers(1, BROKERS))
    def restart(self, i: int) -> None:
        if self.running(i):
            return
        self.up.add(i)
        self.g.cores[i] = ReplicaState()
        self.g.watches.pop(i, None)
        plane = self.planes[i]
        plane.crash()
        self.feed(i, LogChanged(plane.max_offset, plane.last_epoch, 0))
        self.feed(i, Tick())

    # --- properties ---------------------------------------------------------------------------
    def acking(self) -> list[int]:
        now = self.g.now
        return [i for i in self.up if now < self.planes[i].ack_until]

    @invariant()
    def fenced_by_etcd(self) -> None:
        etcd = self.g.etcd
        etcd.tick()
        acking = self.acking()
        assert len(acking) <= 1, self.report(f"brokers {acking} acknowledge at once")
        key = etcd.state.get(KEYS.master)
        for i in acking:
            assert key is not None, self.report(f"b{i} acknowledges but etcd names no master")
            record = MasterRecord.decode(key.key, key.value)
            core = self.g.cores[i]
            assert (record.broker_id, key.create_revision) == (i, core.token), self.report(
                f"b{i} acknowledges but etcd names b{record.broker_id} (token "
                f"{key.create_revision}, b{i}'s is {core.token})"
            )
            sss = etcd.state.get(KEYS.sync_state_set)
            assert sss is not None
            stored = SyncStateSet.decode(sss.key, sss.value).members
            waits = self.planes[i].members
            assert stored <= waits, self.report(
                f"SSSSuperset: b{i} waits for {sorted(waits)}, etcd's set is {sorted(stored)}"
            )

    @invariant()
    def epochs_follow_the_counter(self) -> None:
        etcd = self.g.etcd.state
        counter = etcd.get(KEYS.epoch)
        value = int(counter.value) if counter is not None else 0
        assert value >= self.counter, self.report("etcd's epoch counter went back")
        self.counter = value
        key = etcd.get(KEYS.master)
        if key is not None:
            assert MasterRecord.decode(key.key, key.value).epoch == value, self.report(
                "the master key's epoch is not etcd's counter"
            )

    def report(self, message: str) -> str:
        return message + "\n" + "\n".join(self.trail[-30:])

    # --- liveness -----------------------------------------------------------------------------
    def teardown(self) -> None:
        """No more faults: everything is delivered, the clock moves in small steps, crashed
        brokers restart. Some master must acknowledge within a few lease times."""
        g = self.g
        for i in g.brokers:
            self.restart(i)
        for _ in range(RECOVERY_ROUNDS):
            if self.acking():
                return
            self.settle()
            self.fenced_by_etcd()
            self.everyone_ticks(250)
        raise AssertionError(self.report("no master acknowledges after the faults stopped"))


TestGroupMachine = GroupMachine.TestCase


class HandoverMachine(GroupMachine):
    """The same group, every broker in the SyncStateSet from the start, so that an operator's
    handover is accepted and carried out often, among every fault above."""

    def __init__(self) -> None:
        super().__init__()
        for j in self.g.brokers:
            if j != 1:
                self.slave_reports(1, j, caught_up=True)
                self.settle()


TestHandoverMachine = HandoverMachine.TestCase


class NoFenceMachine(GroupMachine):
    """The group with the no-self-fence twin switched on."""

    unsafe: ClassVar[Unsafe] = Unsafe(no_self_fence=True)


@pytest.mark.parametrize(
    ("machine_class", "caught"), [(GroupMachine, False), (NoFenceMachine, True)]
)
def test_fenced_by_etcd_catches_a_master_that_does_not_fence_itself(
    machine_class: type[GroupMachine], caught: bool
) -> None:
    """A master cut off from etcd: its keepalives never arrive, its lease expires."""
    machine = machine_class()
    assert machine.g.phase(1) is Phase.MASTER
    assert machine.acking() == [1]
    machine.fenced_by_etcd()
    for _ in range(6):  # 3 s: past the 2 s lease
        machine.time_passes(500)
        machine.tick(1)
    if caught:
        with pytest.raises(AssertionError, match="etcd names no master"):
            machine.fenced_by_etcd()
    else:
        machine.fenced_by_etcd()
        assert machine.acking() == []
