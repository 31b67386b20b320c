"""A Hypothesis state machine that replicates through partial reads, drops, crashes and lies.

:class:`ReplicationMachine` drives a :class:`~trioha.testing.ProtocolPair` (the real sans-IO
core and real commit logs) with rules that a network and a data centre inflict on it, and
checks after every step what RocketMQ replication promises:

* the slave's log is a byte prefix of the master's: every byte it holds is the master's byte
  at that offset. The one exception is a master crash that lost bytes the slave already had;
  the protocol has no history id, so the promise becomes: the slave's next connection is closed
  by the master (its request is beyond the master's end), never silently continued. The
  machine then *fences* the slave (an operator must re-seed it, the ``reseed`` rule) because
  once the master's log grows past the slave's end again nothing on the wire could tell the
  two histories apart;
* every offset the master believes a slave holds (an accepted ack) is at most what the slave
  holds (with ``ack_flushed``: at most what it has flushed), except the beliefs of a half-open
  connection to a slave that has since crashed without flushed acks, which RocketMQ shares;
* every sync put answered PUT_OK is on the slave, and with ``ack_flushed`` it survives any
  slave crash;
* per connection, the request offset is set once, the transfer position never rewinds, the
  slave's reports never go backwards and the master's accepted acks only grow; a new
  connection starts with empty receive buffers, and a closed one ignores late bytes;
* replication converges: with the network healed and time stopped, the slave catches up
  completely and every waiting sync put is answered PUT_OK;
* classic mode's divergence check (``master_loses_power``): a master that loses bytes it had
  sent starts its new history past them (``skip_past``) and refuses a first report inside the
  lost range, whenever it comes, telling the slave where the histories part; a slave holding
  lost bytes is never served, its log never changes, until ``truncate_to_master`` cuts it back
  with the store's safe truncation.

In epoch mode (``PairOptions.epoch_mode``) a master crash, or a power loss that takes the
master's last records (flushed or not), never fences the slave: at its next handshake the
slave cuts its log back to the consistent point and is a prefix of the master again before it
reports, so the prefix invariant holds throughout.

This module needs hypothesis; the rest of :mod:`trioha.testing` does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, cast

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trioha._status import PutStatus
from trioha.proto import MasterPhase, SendReport, SlavePhase, Timing
from trioha.testing._pair import (
    Link,
    PairOptions,
    ProtocolPair,
    ReplicaLog,
    Side,
    SyncPut,
    log_bytes,
    pending_report_bytes,
)

if TYPE_CHECKING:
    from trioha.store import CommitLog

__all__ = ["LogFactory", "ReplicationMachine", "memory_log", "pair_options", "replication_machine"]

#: Makes an empty commit log: ``factory(segment_size, clock_ms)``.
LogFactory = Callable[[int, Callable[[], int]], ReplicaLog]


def memory_log(segment_size: int, clock_ms: Callable[[], int]) -> ReplicaLog:
    """The in-memory commit log (the file log's rules without the files)."""
    from trioha.store import MemoryCommitLog

    return MemoryCommitLog(segment_size=segment_size, clock_ms=clock_ms)


def pair_options() -> st.SearchStrategy[PairOptions]:
    """Small segments and batches, so frames stop at segment ends and messages span frames."""
    return st.builds(
        PairOptions,
        segment_size=st.sampled_from([512, 1024, 4096]),
        batch_size=st.sampled_from([7, 64, 333, 32 * 1024]),
        ack_flushed=st.booleans(),
        sync_from_oldest=st.booleans(),
        epoch_mode=st.booleans(),
    )


def _event(value: str) -> None:
    """``hypothesis.event``, or nothing when a regression test replays steps outside Hypothesis."""
    with contextlib.suppress(InvalidArgument):
        event(value)


_WHICH = st.integers(0, 7)  # picks among candidate connections, modulo their number
_DEFAULT = Timing()
_TIME_STEPS = st.sampled_from(
    [
        0.01,
        0.5,
        1.0,
        _DEFAULT.heartbeat,
        _DEFAULT.heartbeat + 0.01,
        _DEFAULT.housekeeping,
        _DEFAULT.housekeeping + 5.0,
    ]
)


class ReplicationMachine(RuleBasedStateMachine):
    """See the module docstring. Subclass it (or use :func:`replication_machine`) to fix the
    options or the log implementation; run it with ``ReplicationMachine.TestCase``."""

    #: Fixed options, or None to draw them for each run from :func:`pair_options`.
    options: ClassVar[PairOptions | None] = None
    #: How to make the master's and the slave's commit logs.
    log_factory: ClassVar[LogFactory] = staticmethod(memory_log)

    def __init__(self) -> None:
        super().__init__()
        self.pair: ProtocolPair | None = None
        #: Why the slave may not reconnect until re-seeded (a master crash diverged it).
        self.fenced: str | None = None
        self._next_transfer: dict[int, int] = {}
        #: Classic mode: the master's durable "highest offset sent" mark (SentOffsets).
        self.sent_mark = 0
        #: The slave's log when a power loss left it holding bytes the master lost; it must
        #: not change (no byte spliced on) until it is cut back.
        self.holds_lost: bytes | None = None

    # --- set-up -------------------------------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        options = type(self).options or data.draw(pair_options(), label="options")
        self._options = options
        self.pair = ProtocolPair(
            master_log=self._new_log(), slave_log=self._new_log(), options=options
        )

    def _new_log(self) -> ReplicaLog:
        def clock_ms() -> int:
            return int(self.p.now * 1000) if self.pair is not None else 0

        return type(self).log_factory(self._options.segment_size, clock_ms)

    @property
    def p(self) -> ProtocolPair:
        assert self.pair is not None
        return self.pair

    def _pick(self, links: list[Link], which: int) -> Link:
        return links[which % len(links)]

    def _writable(self) -> list[Link]:
        return [link for link in self.p.links if link.master_open]

    def _readable_by_slave(self) -> list[Link]:
        """Open slave ends with something to read: bytes in flight, or the EOF after them."""
        return [
            link
            for link in self.p.links
            if link.slave_open and (link.to_slave or not (link.master_open or link.dead))
        ]

    def _readable_by_master(self) -> list[Link]:
        return [
            link
            for link in self.p.links
            if link.master_open and (link.to_master or not (link.slave_open or link.dead))
        ]

    # --- producers ----------------------------------------------------------------------------

    @rule(body=st.binary(max_size=120), sync=st.booleans())
    def put(self, body: bytes, sync: bool) -> None:
        put = self.p.put(body, sync=sync)
        _event(f"put answered at once: {put.status.value if put.status else 'waits'}")

    # --- the network --------------------------------------------------------------------------

    @precondition(lambda self: self.pair is not None and self.p.current is None and not self.fenced)
    @rule()
    def connect(self) -> None:
        link = self.p.connect()
        # A new connection starts from nothing: no bytes of an older one, no decoder state.
        assert link.slave.buffered == 0
        assert link.slave.state.receiving is None
        assert pending_report_bytes(link.master) == 0
        assert link.master.state.request_offset == -1
        if self.p.options.epoch_mode:  # the handshake first; the report after it
            assert link.reports == []
            assert link.slave.state.phase is SlavePhase.HANDSHAKE
        else:
            assert link.reports == [self.p.slave_log.max_offset]
        _event("connect")

    @precondition(lambda self: self.pair is not None and bool(self._writable()))
    @rule(which=_WHICH, n=st.one_of(st.none(), st.integers(1, 40)))
    def master_writes(self, which: int, n: int | None) -> None:
        link = self._pick(self._writable(), which)
        written = self.p.master_write(link, n)
        if written and link.outbox:
            _event("master: short write (frame half written)")
        if link.frames and link.frames[-1][1] == 0 and written and not link.outbox:
            _event("master: heartbeat frame")

    @precondition(lambda self: self.pair is not None and bool(self._readable_by_slave()))
    @rule(which=_WHICH, n=st.one_of(st.integers(1, 13), st.integers(1, 400)))
    def slave_reads(self, which: int, n: int) -> None:
        link = self._pick(self._readable_by_slave(), which)
        self.p.deliver_to_slave(link, n)
        if link.slave_open and link.slave.buffered:
            _event("slave: partial frame buffered")

    @precondition(lambda self: self.pair is not None and bool(self._readable_by_master()))
    @rule(which=_WHICH, n=st.integers(1, 20))
    def master_reads(self, which: int, n: int) -> None:
        link = self._pick(self._readable_by_master(), which)
        self.p.deliver_to_master(link, n)
        if link.master_open and pending_report_bytes(link.master):
            _event("master: partial report buffered")

    @precondition(
        lambda self: (
            self.pair is not None and self.p.current is not None and self.p.current.master_open
        )
    )
    @rule(write=st.integers(1, 64), read=st.integers(1, 64))
    def trickle(self, write: int, read: int) -> None:
        """A slow link: a few bytes written, a few read, so frames arrive in pieces."""
        link = self.p.current
        assert link is not None
        self.p.master_write(link, write)
        self.p.deliver_to_slave(link, read)
        if link.slave_open and link.slave.buffered:
            _event("slave: partial frame buffered")

    @precondition(lambda self: self.pair is not None and self.p.current is not None)
    @rule(master_notices=st.booleans(), slave_notices=st.booleans())
    def drop(self, master_notices: bool, slave_notices: bool) -> None:
        link = self.p.current
        assert link is not None
        lost = len(link.to_slave) + len(link.to_master) + len(link.outbox)
        self.p.drop(link, master_notices=master_notices, slave_notices=slave_notices)
        _event(f"drop (bytes in flight lost: {'yes' if lost else 'no'})")
        if not master_notices:
            _event("drop: master side half-open")
        if not slave_notices:
            _event("drop: slave side half-open")

    @precondition(
        lambda self: (
            self.pair is not None
            and any(
                (not link.master_open and link.to_master) or (not link.slave_open and link.to_slave)
                for link in self.p.links
            )
        )
    )
    @rule(which=_WHICH)
    def late_bytes(self, which: int) -> None:
        """Bytes still in flight on a connection whose receiving end has closed reach it."""
        links = [
            link
            for link in self.p.links
            if (not link.master_open and link.to_master) or (not link.slave_open and link.to_slave)
        ]
        link = self._pick(links, which)
        before = (self.p.slave_log.max_offset, len(self.p.links))
        if not link.master_open and link.to_master:
            assert (
                link.master.receive_data(
                    bytes(link.to_master), now=self.p.now, log=self.p.master_view()
                )
                == ()
            )
            link.to_master.clear()
        if not link.slave_open and link.to_slave:
            assert link.slave.receive_data(bytes(link.to_slave), now=self.p.now) == []
            link.to_slave.clear()
        assert (self.p.slave_log.max_offset, len(self.p.links)) == before
        _event("late bytes reached a closed connection and were ignored")

    @precondition(
        lambda self: (
            self.pair is not None
            and self.p.current is not None
            and self.p.current.streaming
            and not self.p.current.dead
        )
    )
    @rule(beyond=st.integers(1, 1 << 40))
    def slave_lies(self, beyond: int) -> None:
        """A broken slave acks bytes it was never sent; the master must not believe it."""
        link = self.p.current
        assert link is not None
        lie = link.master.state.next_transfer + beyond
        link.to_master += link.slave.encode(SendReport(lie))
        # Read at once (reports are whole words, so the lie is the newest one of this read):
        # later sends could make the same number true.
        self.p.deliver_to_master(link)
        assert not link.master_open, f"the master believed an ack of {lie} it never sent"
        assert link.closes[-1][0] is Side.MASTER
        _event("a report beyond what was sent: closed")

    # --- time ---------------------------------------------------------------------------------

    @precondition(lambda self: self.pair is not None)
    @rule(seconds=_TIME_STEPS)
    def time_passes(self, seconds: float) -> None:
        before = sum(len(link.closes) for link in self.p.links)
        self.p.advance(seconds)
        if sum(len(link.closes) for link in self.p.links) > before:
            _event("housekeeping closed a silent connection")

    # --- durability ---------------------------------------------------------------------------

    @precondition(lambda self: self.pair is not None)
    @rule()
    def slave_flushes(self) -> None:
        self.p.flush_slave()

    @precondition(lambda self: self.pair is not None)
    @rule()
    def master_flushes(self) -> None:
        self.p.flush_master()

    @precondition(lambda self: self.pair is not None)
    @rule(where=st.floats(0, 1), master_notices=st.booleans())
    def slave_crashes(self, where: float, master_notices: bool) -> None:
        log = self.p.slave_log
        cut = log.flushed_offset + int((log.max_offset - log.flushed_offset) * where)
        lost_puts = [put for put in self._acked_puts() if put.end > cut]
        if self.p.options.ack_flushed:
            assert not lost_puts, f"a slave crash at {cut} loses PUT_OK puts {lost_puts}"
        lost = self.p.crash_slave(cut, master_notices=master_notices)
        if self.holds_lost is not None:  # what the crash left of the lost history
            prefix = self.p.slave_is_prefix()
            self.holds_lost = None if prefix else log_bytes(self.p.slave_log)
        _event(f"slave crash ({'lost unflushed bytes' if lost else 'nothing lost'})")
        if lost_puts:
            _event("slave crash lost a PUT_OK put (acks were not flushed)")

    @precondition(lambda self: self.pair is not None and not self.p.master_lost)
    @rule()
    def master_crashes(self) -> None:
        pair = self.p
        acked_lost = [put for put in self._acked_puts() if put.end > pair.master_log.flushed_offset]
        lost = pair.crash_master()
        _event(f"master crash ({'lost unflushed bytes' if lost else 'nothing lost'})")
        if acked_lost:
            _event("master crash lost a PUT_OK put the slave holds")
        if self.fenced:
            return
        if pair.options.epoch_mode:
            self._handshake_after_master_restart()
            return
        # Everything reconnects; the master hears the slave's request before any new put.
        link = pair.connect()
        pair.deliver_to_master(link, 8)
        if pair.slave_is_prefix():
            assert link.master_open, f"an honest slave was refused: {link.closes}"
            return
        # The slave holds bytes the master lost: they are beyond the master's end, so the
        # master must refuse the request, and nothing may be sent to the slave.
        assert pair.slave_log.max_offset > pair.master_log.max_offset
        assert not link.master_open, "a slave ahead of its master was served"
        assert link.closes and link.closes[0][0] is Side.MASTER
        assert not link.frames
        self.fenced = (
            f"the slave holds [{pair.common_prefix_end()}, {pair.slave_log.max_offset}) that "
            f"the master lost in a crash; {link.closes[0][1]}"
        )
        pair.drop(link)
        _event("master crash diverged the slave: refused on reconnect")

    @precondition(
        lambda self: (
            self.pair is not None
            and self.p.options.epoch_mode
            and self.p.master_log.max_offset > self.p.master_log.min_offset
        )
    )
    @rule(back=st.integers(1, 6))
    def master_loses_records(self, back: int) -> None:
        """Power loss, or a damaged record: the master comes back without its last *back*
        records, which the slave may hold, flushed or not (epoch mode only: classic HA cannot
        tell, which is what epochs are for)."""
        pair = self.p
        starts = [m.physical_offset for m in pair.master_log.iter_messages()]  # type: ignore[attr-defined]
        cut = starts[-min(back, len(starts))]
        lost = pair.lose_master_records(cut)
        _event(f"master lost records ({lost} bytes)")
        self._handshake_after_master_restart()

    def _handshake_after_master_restart(self) -> None:
        """Epoch mode: the slave reconnects at once; after the handshakes it is a prefix of
        the master (cut back if it held what the master lost), never refused or spliced."""
        pair = self.p
        held = pair.slave_log.max_offset
        link = pair.connect()
        pair.deliver_to_master(link)  # the slave's handshake
        pair.master_write(link)  # the master's
        pair.deliver_to_slave(link)
        assert link.slave_open and link.master_open, f"an epoch slave was refused: {link.closes}"
        assert link.slave.state.phase is SlavePhase.TRANSFER
        assert pair.slave_is_prefix(), "the slave streams but is not a prefix of the master"
        if link.truncations:
            assert link.truncations == [pair.slave_log.max_offset] and held > link.truncations[0]
            _event("epoch mode: the slave cut back to the consistent point")

    # --- classic mode: a power cut, the refusal, the operator's cut -------------------------

    def _sent_end(self) -> int:
        """The durable mark: what the master may have sent (SentOffsets reserves before)."""
        ends = [offset + size for link in self.p.links for offset, size in link.frames]
        self.sent_mark = max([self.sent_mark, *ends])
        return self.sent_mark

    def _lost_range(self) -> tuple[int, int] | None:
        """The lost range the slave's first report would fall in, if any."""
        end = self.p.slave_log.max_offset
        for lo, hi in self.p.master_lost:
            if lo < end <= hi:
                return lo, hi
        return None

    @precondition(
        lambda self: (
            self.pair is not None
            and not self.p.options.epoch_mode  # epoch mode has master_loses_records instead
            and self.fenced is None
            and self.holds_lost is None
        )
    )
    @rule()
    def master_loses_power(self) -> None:
        """Classic mode: the master's unflushed tail is gone; it starts as
        ``open_master_history`` says (epochs, not the sent marks, handle it in epoch mode)."""
        pair = self.p
        sent = self._sent_end()
        pair.crash_master()
        log = pair.master_log
        end = log.max_offset
        if sent <= end:
            _event("power loss: nothing sent was lost")
            return
        pair.master_lost = (*pair.master_lost, (end, sent))
        new_start = cast("CommitLog", log).skip_past(sent)
        log.flush()
        assert new_start > sent
        assert new_start % log.segment_size == 0
        _event("power loss: the master lost bytes it had sent")
        if not pair.slave_is_prefix():
            assert self._lost_range() is not None, "a slave holding lost bytes is not refusable"
            self.holds_lost = log_bytes(pair.slave_log)
            _event("power loss: the slave holds bytes the master lost")

    @precondition(
        lambda self: (
            self.pair is not None
            and self.p.current is None
            and self._lost_range() is not None
            and any(
                side is Side.SLAVE and "pushed offset" in why
                for link in self.p.links
                for side, why in link.closes
            )
        )
    )
    @rule()
    def truncate_to_master(self) -> None:
        """``trioha slave --truncate-to-master``: the refused slave is cut back to the fork."""
        pair = self.p
        lost = self._lost_range()
        assert lost is not None
        fork = lost[0]
        log = pair.slave_log
        if fork > log.min_offset:
            kept = cast("CommitLog", log).truncate_to_boundary(fork)
            assert kept, "the cut bytes are kept aside"
            log.flush()
        else:  # the slave's log starts past the fork: nothing in common, re-seed it empty
            pair.slave_log = self._new_log()
        pair.incarnation += 1
        self.holds_lost = None
        assert pair.slave_is_prefix()
        _event("refused slave cut back to the master's history")

    @invariant()
    def a_slave_holding_lost_bytes_is_never_served(self) -> None:
        if self.pair is None or self.holds_lost is None:
            return
        pair = self.p
        assert log_bytes(pair.slave_log) == self.holds_lost, "bytes were spliced onto the slave"
        for link in pair.links:
            if link.master_open and link.incarnation == pair.incarnation:
                assert link.master.state.phase is MasterPhase.AWAIT_REPORT, (
                    f"{link!r} serves a slave that holds bytes the master lost"
                )
        for link in pair.links:
            for side, why in link.closes:
                if side is Side.MASTER and "crashed and lost them" in why:
                    _event("classic refusal: the master refused a slave holding lost bytes")

    @precondition(lambda self: self.pair is not None and self.fenced is not None)
    @rule()
    def reseed(self) -> None:
        """The operator cuts the slave back to what it shares with the master."""
        pair = self.p
        shared = pair.common_prefix_end()
        if shared > pair.slave_log.min_offset:
            pair.slave_log.truncate(shared)
            pair.slave_log.flush()
        else:  # nothing in common: start the slave from an empty store
            pair.slave_log = self._new_log()
        pair.incarnation += 1
        self.fenced = None
        _event("slave re-seeded")

    # --- liveness -----------------------------------------------------------------------------

    @precondition(
        lambda self: self.pair is not None and self.fenced is None and self._lost_range() is None
    )
    @rule()
    def converge(self) -> None:
        """With the network healed and no time passing, the slave catches up completely."""
        pair = self.p
        for link in pair.links:
            if link.dead and link.open:
                pair.drop(link)  # housekeeping would find out, given time
        pair.run_until_quiet(max_rounds=50)
        closes = [close for link in pair.links for close in link.closes]
        current = pair.current
        slave = pair.slave_log
        # An empty slave is served from the master's last segment (RocketMQ's rule), which
        # holds nothing yet when a power loss just closed the ones before it: caught up too.
        empty_at_end = (
            slave.max_offset == slave.min_offset
            and current is not None
            and current.start_offset == pair.master_log.max_offset
        )
        assert slave.max_offset == pair.master_log.max_offset or empty_at_end, (
            f"slave stopped at {slave.max_offset}, master at "
            f"{pair.master_log.max_offset}; closes: {closes}"
        )
        assert current is not None and current.start_offset is not None
        for put in pair.puts:
            if put.sync and put.lost is None and put.status is None:
                # Only a put this connection never carried may wait on (for its timeout).
                assert put.start < current.start_offset, f"{put} still waits after convergence"
        _event("converged")

    # --- invariants ---------------------------------------------------------------------------

    def assert_invariants(self) -> None:
        """Every invariant, as Hypothesis checks them after each step (for replaying steps)."""
        self.slave_is_a_prefix_of_the_master()
        self.master_believes_no_more_than_the_slave_holds()
        self.put_ok_is_on_the_slave()
        self.per_connection_rules()

    def _acked_puts(self) -> list[SyncPut]:
        return [
            put
            for put in self.p.puts
            if put.sync and put.status is PutStatus.PUT_OK and put.lost is None
        ]

    @invariant()
    def slave_is_a_prefix_of_the_master(self) -> None:
        if self.pair is None or self.fenced or self.holds_lost is not None:
            return
        assert self.p.slave_is_prefix(), (
            f"slave diverged from the master at {self.p.common_prefix_end()}"
        )

    @invariant()
    def master_believes_no_more_than_the_slave_holds(self) -> None:
        if self.pair is None:
            return
        pair = self.p
        for link in pair.links:
            if not link.streaming:
                continue
            if pair.options.ack_flushed:
                assert link.ack_offset <= pair.slave_log.flushed_offset, (
                    f"{link!r} believes {link.ack_offset}; slave flushed "
                    f"{pair.slave_log.flushed_offset}"
                )
            elif link.incarnation == pair.incarnation and not self.fenced:
                assert link.ack_offset <= pair.slave_log.max_offset, (
                    f"{link!r} believes {link.ack_offset}; slave holds {pair.slave_log.max_offset}"
                )

    @invariant()
    def put_ok_is_on_the_slave(self) -> None:
        if self.pair is None:
            return
        pair = self.p
        slave = pair.slave_log
        for put in pair.puts:
            if not (put.sync and put.status is PutStatus.PUT_OK and put.lost is None):
                continue
            if not pair.options.ack_flushed and put.acked_by != pair.incarnation:
                continue  # acked by a slave life that has since crashed (RocketMQ's promise)
            assert slave.min_offset <= put.start and put.end <= slave.max_offset, (
                f"{put} answered PUT_OK but the slave holds [{slave.min_offset}, "
                f"{slave.max_offset})"
            )
            if pair.options.ack_flushed:
                assert put.end <= slave.flushed_offset, f"{put} PUT_OK but not flushed on slave"
            assert log_bytes(slave, put.start, put.end) == put.data

    @invariant()
    def per_connection_rules(self) -> None:
        if self.pair is None:
            return
        for link in self.p.links:
            state = link.master.state
            if link.request_offset is not None:
                assert state.request_offset == link.request_offset, "request offset changed"
            elif state.phase is MasterPhase.AWAIT_REPORT:
                assert state.request_offset == -1
            if state.next_transfer >= 0:
                before = self._next_transfer.get(link.number, -1)
                assert state.next_transfer >= before, "the transfer position went backwards"
                self._next_transfer[link.number] = state.next_transfer
            assert link.reports == sorted(link.reports), f"reports went backwards: {link.reports}"
            assert link.acks == sorted(set(link.acks)), f"acks not increasing: {link.acks}"
            if not link.slave_open:
                assert link.slave.buffered == 0, "a closed slave connection holds bytes"
            if not link.master_open:
                assert pending_report_bytes(link.master) == 0


def replication_machine(
    options: PairOptions | None = None,
    *,
    log_factory: LogFactory = memory_log,
    name: str = "ConfiguredReplicationMachine",
) -> type[ReplicationMachine]:
    """A :class:`ReplicationMachine` with fixed *options* (e.g. from
    ``PairOptions.from_config(my_broker_config)``) and/or another commit log implementation.

    Use it in a test module as ``TestMine = replication_machine(opts).TestCase``.
    """
    namespace = {"options": options, "log_factory": staticmethod(log_factory)}
    return type(name, (ReplicationMachine,), namespace)
