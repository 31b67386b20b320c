"""The real Trio tasks (HAService, HAConnection, HAClient) over streams that misbehave.

Every example is one ``trio.run`` under an autojump clock (``tests/clock.py``): a master's HA
service and a slave's HA client talk through :class:`~trioha.testing.FaultyStream` pairs that
cut writes and reads anywhere, add delays, and kill the first few connections by reset, orderly
close or black hole, after some bytes or at some moment, while a producer appends and waits for
sync replication. After the run it checks, in virtual time:

* convergence: once the faults stop, the slave's log equals the master's before a deadline;
* a timely first report: the master hears each connection's request offset within the delays the
  faults add, never a heartbeat interval later (RocketMQ's client waits one,
  docs/rocketmq-protocol.md §1.2) unless the plan makes the slave a Java one, whose first
  report comes 5 s after it connects;
* detection of a dead peer: both ends of a broken connection are closed within
  housekeeping plus one heartbeat of the break, and then neither end has a task left and the
  master's registry no longer holds it;
* sync puts: PUT_OK only when the slave holds the put (flushed, with flushed acks),
  FLUSH_SLAVE_TIMEOUT only after ``slave_timeout``, SLAVE_NOT_AVAILABLE only with no slave
  connected (one that has not reported yet makes a put wait, as RocketMQ's ``isSlaveOK``).

A second test cuts the master's power in classic mode: the master keeps only what it had
flushed, restarts as a trioha master does (``check_master_history``) and producers go on at
once; a slave that holds lost bytes is refused (sticky, its log unchanged) and, once cut back,
follows the new history byte for byte; a slave that holds nothing lost simply follows.

The wrapper itself passes Trio's generic stream checks, so what fails here is trioha.
"""

from __future__ import annotations

import logging
import math
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import Phase, event, example, given, settings
from hypothesis import strategies as st

from tests.clock import thread_aware_autojump_clock
from tests.net._streams import DelegatingStream
from trioha import BrokerConfig
from trioha._config import BrokerRole
from trioha._status import PutStatus
from trioha.net import HAClient, HAService
from trioha.net._client import _Session
from trioha.net._connection import HAConnection
from trioha.net._divergence import check_master_history
from trioha.store import MemoryCommitLog, NewMessage, SentOffsets
from trioha.testing import Breakage, Faults, FaultyLink, FaultyStream, faulty_stream_pair, log_bytes

SEGMENT = 2048
HEARTBEAT = 5.0
HOUSEKEEPING = 20.0
SLAVE_TIMEOUT = 3.0
BACKOFF_MAX = 5.0
#: Virtual seconds allowed for catching up once the last faulty connection is gone.
CATCH_UP = 120.0
#: A Java slave's first report comes this long after it connects (``HAClient.run``: it
#: reports when ``haSendHeartbeatInterval`` has passed since its last write).
JAVA_FIRST_REPORT = 5.0


# --- the wrapper obeys Trio's stream contract ------------------------------------------------


@pytest.mark.parametrize(
    "faults",
    [Faults(), Faults(max_write=512, max_read=300), Faults(max_write=700, max_delay=0.01)],
    ids=["no-faults", "short-io", "delays"],
)
async def test_faulty_stream_is_a_trio_stream(
    faults: Faults, autojump_clock: trio.testing.MockClock
) -> None:
    rng = random.Random(7)

    async def maker() -> tuple[FaultyStream, FaultyStream]:
        return faulty_stream_pair(faults=faults, rng=rng)

    async def clogged() -> tuple[FaultyStream, FaultyStream]:
        return faulty_stream_pair(faults=faults, rng=rng, lockstep=True)

    await trio.testing.check_half_closeable_stream(maker, clogged)


@pytest.mark.parametrize("breakage", list(Breakage))
async def test_faulty_link_breaks_both_ends(
    breakage: Breakage, autojump_clock: trio.testing.MockClock
) -> None:
    """A blocked reader wakes when the link breaks; what it sees depends on how it broke."""
    link = FaultyLink(breakage=breakage)
    a, b = faulty_stream_pair(link=link)
    seen: list[object] = []

    async def reader() -> None:
        with trio.move_on_after(60):
            try:
                seen.append(await b.receive_some())
            except trio.BrokenResourceError as exc:
                seen.append(type(exc))
            return
        seen.append("timeout")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        link.break_()
    expected = {
        Breakage.RESET: trio.BrokenResourceError,
        Breakage.EOF: b"",
        Breakage.BLACKHOLE: "timeout",
    }
    assert seen == [expected[breakage]]
    if breakage is Breakage.BLACKHOLE:
        await a.send_all(b"lost")  # vanishes without error
    else:
        with pytest.raises(trio.BrokenResourceError):
            await a.send_all(b"x")


async def test_faulty_link_breaks_after_bytes(autojump_clock: trio.testing.MockClock) -> None:
    link = FaultyLink(break_after_bytes=5, breakage=Breakage.RESET)
    a, b = faulty_stream_pair(link=link, faults=Faults(max_write=2))
    with pytest.raises(trio.BrokenResourceError):
        await a.send_all(b"0123456789")
    assert link.bytes_sent == 5
    assert await b.inner.receive_some() == b"01234"


# --- the plan of one example -----------------------------------------------------------------


@attrs.frozen
class Break:
    """How one connection dies: after some bytes, or at a moment after it opened."""

    breakage: Breakage
    after_bytes: int | None
    after_seconds: float | None


@attrs.frozen
class Put:
    wait: float
    size: int
    sync: bool


@attrs.frozen
class Plan:
    seed: int
    faults: Faults
    breaks: tuple[Break, ...]
    puts: tuple[Put, ...]
    batch_size: int
    ack_flushed: bool
    sync_from_oldest: bool
    preload: int
    #: Seconds before the slave's first report on each connection: 0, or a Java slave's 5.
    first_report_delay: float = 0.0


breaks = st.one_of(
    st.builds(Break, st.sampled_from(Breakage), st.integers(0, 3000), st.none()),
    st.builds(Break, st.sampled_from(Breakage), st.none(), st.floats(0, 30)),
)
plans = st.builds(
    Plan,
    seed=st.integers(0, 2**32),
    faults=st.builds(
        Faults,
        max_write=st.sampled_from([None, 1, 5, 13, 200]),
        max_read=st.sampled_from([None, 3, 7, 100]),
        max_delay=st.sampled_from([0.0, 0.001, 0.05, 0.3]),
    ),
    breaks=st.lists(breaks, max_size=3).map(tuple),
    puts=st.lists(
        st.builds(
            Put,
            st.sampled_from([0.0, 0.01, 0.5, 2.0, 7.0]),
            st.integers(0, 200),
            st.booleans(),
        ),
        max_size=15,
    ).map(tuple),
    batch_size=st.sampled_from([9, 100, 32 * 1024]),
    ack_flushed=st.booleans(),
    sync_from_oldest=st.booleans(),
    preload=st.integers(0, 8),
    first_report_delay=st.sampled_from([0.0, JAVA_FIRST_REPORT]),
)


# --- one run ---------------------------------------------------------------------------------


@attrs.define
class Conn:
    """One connection the client opened: its link and both ends."""

    index: int
    link: FaultyLink
    master_end: FaultyStream
    slave_end: FaultyStream
    opened_at: float
    first_report_at: float | None = None


@attrs.define
class PutRecord:
    start: int
    end: int
    asked_at: float = -1.0
    slaves_streaming: int = -1
    slaves_connected: int = -1
    status: PutStatus | None = None
    answered_at: float | None = None


class LateFirstWrite(DelegatingStream):
    """A slave's end whose first write waits ``delay`` seconds (a Java slave's first report)."""

    def __init__(self, stream: trio.abc.Stream, delay: float) -> None:
        super().__init__(stream)
        self.delay = delay

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.delay:
            delay, self.delay = self.delay, 0.0
            await trio.sleep(delay)
        await self.inner.send_all(data)


class RecordingService(HAService):
    """The real HA service, noting when each connection's first report arrives."""

    def __init__(self, *args: Any, on_first: Callable[[HAConnection], None]) -> None:
        super().__init__(*args)
        self._on_first = on_first
        # The connections themselves, not their ids: a collected connection's id is reused.
        self._seen: set[HAConnection] = set()

    def on_ack(self, connection: HAConnection, offset: int) -> None:
        if connection not in self._seen:
            self._seen.add(connection)
            self._on_first(connection)
        super().on_ack(connection, offset)


async def run_sync_inline(fn: Callable[..., Any], *args: Any, **_kwargs: Any) -> Any:
    """``trio.to_thread.run_sync`` without the thread: under an autojump clock virtual time
    would jump while a worker thread runs, firing timeouts no real run could fire."""
    await trio.lowlevel.checkpoint()
    return fn(*args)


def transfer_time(plan: Plan, nbytes: int) -> float:
    """A bound on the virtual time the faults' delays add to moving *nbytes* of log: frames
    add their headers, and in the worst case every byte is its own write and its own read."""
    frames = nbytes // plan.batch_size + 1
    return (nbytes + 12 * frames) * 2 * plan.faults.max_delay


async def poll_until(condition: Callable[[], bool], deadline: float) -> None:
    """Check *condition* every 250 ms of virtual time until it holds or *deadline* passes."""
    while trio.current_time() < deadline:
        if condition():
            return
        await trio.sleep(0.25)


def ha_tasks() -> tuple[dict[int, int], dict[int, int]]:
    """Live tasks per HAConnection and per client session (by id), found by walking the tree."""
    conns: dict[int, int] = {}
    sessions: dict[int, int] = {}
    root = trio.lowlevel.current_root_task()
    assert root is not None
    stack = [root]
    while stack:
        task = stack.pop()
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
        frame = getattr(task.coro, "cr_frame", None)
        owner = frame.f_locals.get("self") if frame is not None else None
        if isinstance(owner, HAConnection):
            conns[id(owner)] = conns.get(id(owner), 0) + 1
        elif isinstance(owner, _Session):
            sessions[id(owner)] = sessions.get(id(owner), 0) + 1
    return conns, sessions


async def run_plan(plan: Plan, events: list[str]) -> None:
    rng = random.Random(plan.seed)
    master_log = MemoryCommitLog(segment_size=SEGMENT, clock_ms=lambda: 0)
    slave_log = MemoryCommitLog(segment_size=SEGMENT, clock_ms=lambda: 0)
    for i in range(plan.preload):
        master_log.append(NewMessage(topic="Preload", body=bytes([i]) * (50 + 37 * i)))
    base = BrokerConfig(
        mapped_file_size_commit_log=SEGMENT,
        ha_send_heartbeat_interval=int(HEARTBEAT * 1000),
        ha_housekeeping_interval=int(HOUSEKEEPING * 1000),
        ha_reconnect_backoff_max=int(BACKOFF_MAX * 1000),
    )
    master_config = base.evolve(
        broker_role=BrokerRole.SYNC_MASTER,
        ha_listen_port=0,
        ha_transfer_batch_size=plan.batch_size,
        ha_sync_from_oldest=plan.sync_from_oldest,
        slave_timeout=int(SLAVE_TIMEOUT * 1000),
    )
    slave_config = base.evolve(
        broker_role=BrokerRole.SLAVE,
        ha_master_address="127.0.0.1:10912",
        ha_slave_ack_flushed=plan.ack_flushed,
    )
    conns: list[Conn] = []
    puts: list[PutRecord] = []

    def on_first(connection: HAConnection) -> None:
        for conn in conns:
            if conn.master_end is connection.stream:
                conn.first_report_at = trio.current_time()

    service = RecordingService(master_config, master_log, on_first=on_first)

    faults_on = True  # the planned breaks stop once the producer is done

    async def break_later(link: FaultyLink, seconds: float) -> None:
        await trio.sleep(seconds)
        if faults_on:
            link.break_()

    async with trio.open_nursery() as nursery:

        async def connect(_host: str, _port: int) -> trio.abc.Stream:
            index = len(conns)
            planned = plan.breaks[index] if index < len(plan.breaks) else None
            plan_break = planned if faults_on else None
            link = FaultyLink()
            if plan_break is not None:
                link.breakage = plan_break.breakage
                link.break_after_bytes = plan_break.after_bytes
                if plan_break.after_seconds is not None:
                    nursery.start_soon(break_later, link, plan_break.after_seconds)
            master_end, slave_end = faulty_stream_pair(faults=plan.faults, rng=rng, link=link)
            master_end.name, slave_end.name = "master end", "slave end"
            conns.append(Conn(index, link, master_end, slave_end, trio.current_time()))
            nursery.start_soon(service.handle_stream, master_end, f"slave#{index}")
            if plan.first_report_delay:
                return LateFirstWrite(slave_end, plan.first_report_delay)
            return slave_end

        async def sync_put(record: PutRecord) -> None:
            # What the service sees when the put starts waiting (this task may start later
            # than the put was appended).
            record.asked_at = trio.current_time()
            record.slaves_streaming = len(service.live_acks())
            record.slaves_connected = len(service.connections)
            record.status = await service.wait_replicated(record.end, start=record.start)
            record.answered_at = trio.current_time()
            if record.status is PutStatus.PUT_OK:
                # The ack came from a slave that holds the put (flushed, with flushed acks).
                assert slave_log.max_offset >= record.end
                if plan.ack_flushed:
                    assert slave_log.flushed_offset >= record.end
                assert bytes(slave_log.read(record.start, record.end - record.start)) == bytes(
                    master_log.read(record.start, record.end - record.start)
                )

        client = HAClient(slave_config, slave_log, connect=connect)
        await nursery.start(service.time_out_puts)
        await nursery.start(client.run)
        for p in plan.puts:
            await trio.sleep(p.wait)
            result = master_log.append(NewMessage(topic="Fuzz", body=bytes(p.size)))
            service.notify_log_grew()
            if p.sync:
                record = PutRecord(result.physical_offset, result.end_offset)
                puts.append(record)
                nursery.start_soon(sync_put, record)

        # The faults stop: no planned break fires from now on (a dead connection stays dead).
        # Convergence: within the time to detect a dead connection, reconnect, and move the
        # log through the faults' delays, the slave holds the master's log over a healthy
        # connection.
        faults_on = False
        for conn in conns:
            conn.link.break_after_bytes = None
        deadline = (
            trio.current_time()
            + HOUSEKEEPING
            + HEARTBEAT
            + BACKOFF_MAX
            + transfer_time(plan, master_log.max_offset)
            + CATCH_UP
        )

        def converged() -> bool:
            last = conns[-1]
            return (
                slave_log.max_offset == master_log.max_offset
                and last.link.broken is None
                and last.first_report_at is not None
                and client.connected
            )

        await poll_until(converged, deadline)
        assert converged(), (
            f"slave at {slave_log.max_offset}, master at {master_log.max_offset} at the deadline; "
            f"{len(conns)} connections; last close: {client.last_close_reason}"
        )
        start = slave_log.min_offset
        assert bytes(slave_log.read(start, SEGMENT)) == bytes(master_log.read(start, SEGMENT))
        # The sync path works once the network does: a put is acked (perhaps after its own
        # slave_timeout, when the faults' delays are long) and then answered PUT_OK.
        final = master_log.append(NewMessage(topic="Fuzz", body=b"final"))
        service.notify_log_grew()
        span = {"end": final.end_offset, "start": final.physical_offset}
        if await service.wait_replicated(**span) is not PutStatus.PUT_OK:
            await poll_until(
                lambda: service.replicated_offset() >= final.end_offset,
                trio.current_time() + transfer_time(plan, 200) + CATCH_UP,
            )
            assert await service.wait_replicated(**span) is PutStatus.PUT_OK
        # Give every broken connection its full detection window before judging it: wait for
        # the timed breaks still to come, then for housekeeping plus a heartbeat after each.
        timed = [
            conn.opened_at + brk.after_seconds
            for conn, brk in zip(conns, plan.breaks, strict=False)
            if brk.after_seconds is not None
        ]
        await trio.sleep_until(max([trio.current_time(), *timed]))
        await trio.sleep_until(
            max([trio.current_time(), *(detection_bound(plan, c) for c in conns)]) + 0.01
        )
        check_connections(plan, conns, service, events)
        nursery.cancel_scope.cancel()

    check_puts(puts, events)


def detection_bound(plan: Plan, conn: Conn) -> float:
    """By when both ends of a broken connection must have closed: housekeeping plus one
    heartbeat after the break, plus a few of the faults' delays."""
    if conn.link.broken_at is None:
        return -math.inf
    return conn.link.broken_at + HOUSEKEEPING + HEARTBEAT + 40 * plan.faults.max_delay + 0.1


def check_connections(plan: Plan, conns: list[Conn], service: HAService, events: list[str]) -> None:
    now = trio.current_time()
    per_conn, per_session = ha_tasks()
    live = {id(c): c for c in service.connections.values()}
    for conn_id, count in per_conn.items():
        assert conn_id in live, "a task of a connection that left the registry is still running"
        assert count == 2, f"{count} tasks for one connection (reader and writer expected)"
    assert len(per_session) <= 1
    assert all(count == 2 for count in per_session.values())
    for conn in conns:
        link = conn.link
        for end in (conn.master_end, conn.slave_end):
            if end.writes_cut:
                events.append(f"{end.name}: writes cut into pieces")
            if end.reads_cut:
                events.append(f"{end.name}: reads cut short")
        if conn.first_report_at is not None:
            delay = conn.first_report_at - conn.opened_at
            # 8 bytes: at worst 8 delayed writes, then 8 delayed reads.
            assert delay <= plan.first_report_delay + 16 * plan.faults.max_delay + 0.01, (
                f"connection {conn.index}: first report after {delay:.3f} s"
            )
            events.append("first report heard")
        if link.broken is None or link.broken_at is None:
            continue
        events.append(f"link broken: {link.broken.value}")
        bound = detection_bound(plan, conn)
        for end in (conn.master_end, conn.slave_end):
            assert end.closed_at is not None and end.closed_at <= bound, (
                f"connection {conn.index} broke ({link.broken.value}) at {link.broken_at:.2f}; "
                f"its {end.name} closed at {end.closed_at} (now {now:.2f}), bound {bound:.2f}"
            )
        assert all(c.stream is not conn.master_end for c in service.connections.values())


def check_puts(puts: list[PutRecord], events: list[str]) -> None:
    for record in puts:
        if record.status is None:
            continue  # still waiting when the run ended (its slave_timeout had not passed)
        events.append(f"sync put: {record.status.value}")
        if record.slaves_streaming < record.slaves_connected:
            events.append(f"sync put before a first report: {record.status.value}")
        assert record.answered_at is not None
        waited = record.answered_at - record.asked_at
        if record.status is PutStatus.FLUSH_SLAVE_TIMEOUT:
            assert waited >= SLAVE_TIMEOUT - 1e-6  # float clock
            assert record.slaves_connected > 0
        elif record.status is PutStatus.SLAVE_NOT_AVAILABLE:
            assert waited == 0
            assert record.slaves_connected == 0
        else:
            assert record.status is PutStatus.PUT_OK


@pytest.fixture(autouse=True)
def _quiet_logs() -> Iterator[None]:
    """Connections break on purpose here; keep pytest from collecting every log line."""
    loggers = [logging.getLogger(name) for name in ("trioha.ha", "trioha.store")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


@settings(
    max_examples=max(10, settings().max_examples // 4),
    phases=[p for p in settings().phases if p is not Phase.explain],
)
@given(plan=plans)
@example(
    plan=Plan(
        seed=0,
        faults=Faults(max_write=None, max_read=3, max_delay=0.001),
        breaks=(Break(Breakage.BLACKHOLE, 309, None),),
        puts=(),
        batch_size=9,
        ack_flushed=False,
        sync_from_oldest=False,
        preload=0,
    )
).via("regression: a dead connection judged before its detection window had passed")
@example(
    plan=Plan(
        seed=0,
        faults=Faults(max_write=None, max_read=None, max_delay=0.001),
        breaks=(Break(Breakage.RESET, 769, None),),
        puts=(),
        batch_size=9,
        ack_flushed=False,
        sync_from_oldest=False,
        preload=0,
    )
).via("regression: the last put straddled a planned break that fired after the faults' time")
@example(
    plan=Plan(
        seed=974,
        faults=Faults(max_write=13, max_read=100, max_delay=0.3),
        breaks=(
            Break(Breakage.BLACKHOLE, 247, None),
            Break(Breakage.RESET, 92, None),
            Break(Breakage.EOF, 2, None),
        ),
        puts=(Put(7.0, 133, True), Put(0.01, 46, True)),
        batch_size=100,
        ack_flushed=True,
        sync_from_oldest=True,
        preload=5,
    )
).via("regression: a reconnection's first report missed because an old connection's id recurred")
@example(
    plan=Plan(
        seed=0,
        faults=Faults(max_write=None, max_read=None, max_delay=0.0),
        breaks=(Break(Breakage.BLACKHOLE, 9, None),),
        puts=(
            *(Put(w, 0, False) for w in (0.0, 0.5, 0.5, 0.5)),
            Put(0.5, 0, True),
            Put(2.0, 0, False),
            Put(2.0, 0, True),
            Put(7.0, 0, False),
            Put(7.0, 0, False),
            Put(0.0, 0, True),
        ),
        batch_size=9,
        ack_flushed=False,
        sync_from_oldest=False,
        preload=0,
    )
).via("regression: a put's view of the slaves was taken before its task asked the service")
@example(
    plan=Plan(
        seed=0,
        faults=Faults(max_write=None, max_read=None, max_delay=0.0),
        breaks=(),
        puts=(Put(0.5, 10, True), Put(1.0, 10, True), Put(4.0, 10, True)),
        batch_size=32 * 1024,
        ack_flushed=False,
        sync_from_oldest=False,
        preload=2,
        first_report_delay=JAVA_FIRST_REPORT,
    )
).via("a Java slave: sync puts in its first 5 s wait for its first report")
def test_replication_through_faulty_streams(plan: Plan) -> None:
    events: list[str] = []
    with mock.patch.object(trio.to_thread, "run_sync", run_sync_inline):
        trio.run(run_plan, plan, events, clock=thread_aware_autojump_clock())
    for name in sorted(set(events)):
        event(name)


# --- classic mode: the master loses power; the slave is refused or follows, never spliced -----


@attrs.frozen
class PowerLoss:
    """Messages before the power cut, how many of them the master had flushed, how long the
    slave had to copy them (virtual seconds, so it may hold some, all or none), messages after,
    and the streams' faults."""

    before: tuple[int, ...]
    flushed: int
    copy_for: float
    after: tuple[int, ...]
    faults: Faults
    batch_size: int
    seed: int


power_losses = st.builds(
    PowerLoss,
    before=st.lists(st.integers(0, 300), min_size=1, max_size=12).map(tuple),
    flushed=st.integers(0, 12),
    copy_for=st.sampled_from([0.0, 0.001, 0.01, 0.1, 1.0, 10.0]),
    after=st.lists(st.integers(0, 300), min_size=1, max_size=12).map(tuple),
    faults=st.builds(
        Faults,
        max_write=st.sampled_from([None, 13, 200]),
        max_read=st.sampled_from([None, 7, 300]),
        max_delay=st.sampled_from([0.0, 0.001, 0.05]),
    ),
    batch_size=st.sampled_from([9, 100, 1000]),
    seed=st.integers(0, 1000),
)


async def run_power_loss(case: PowerLoss, root: Path, events: list[str]) -> None:
    rng = random.Random(case.seed)
    master_log = MemoryCommitLog(segment_size=SEGMENT, clock_ms=lambda: 0)
    slave_log = MemoryCommitLog(segment_size=SEGMENT, clock_ms=lambda: 0)
    sent = SentOffsets(root / "haSentOffset", step=97)
    base = BrokerConfig(
        mapped_file_size_commit_log=SEGMENT,
        ha_send_heartbeat_interval=int(HEARTBEAT * 1000),
        ha_housekeeping_interval=int(HOUSEKEEPING * 1000),
        ha_reconnect_backoff_max=int(BACKOFF_MAX * 1000),
    )
    master_config = base.evolve(ha_listen_port=0, ha_transfer_batch_size=case.batch_size)
    slave_config = base.evolve(broker_role=BrokerRole.SLAVE, ha_master_address="127.0.0.1:10912")

    async def replicate(
        service: HAService, client: HAClient, body: Callable[[trio.Nursery], Any]
    ) -> None:
        async with trio.open_nursery() as nursery:

            async def connect(_host: str, _port: int) -> trio.abc.Stream:
                master_end, slave_end = faulty_stream_pair(faults=case.faults, rng=rng)
                nursery.start_soon(service.handle_stream, master_end, "slave")
                return slave_end

            client._connect = connect
            await nursery.start(client.run)
            await body(nursery)
            nursery.cancel_scope.cancel()

    # 1. Replicate, then the power goes: the master keeps only what it flushed.
    service = HAService(master_config, master_log, sent=sent)
    client = HAClient(slave_config, slave_log)

    async def produce_then_cut(_nursery: trio.Nursery) -> None:
        for i, size in enumerate(case.before):
            master_log.append(NewMessage(topic="Before", body=bytes([i]) * size))
            if i + 1 == case.flushed:
                master_log.flush()
            service.notify_log_grew()
            await trio.lowlevel.checkpoint()
        await trio.sleep(case.copy_for)

    await replicate(service, client, produce_then_cut)
    kept = master_log.flushed_offset
    master_log.truncate(kept)
    held = log_bytes(slave_log)
    durable = SentOffsets.open(root).reserved  # what a restart reads back
    assert durable >= slave_log.max_offset, "the slave holds bytes the durable mark misses"
    check_master_history(master_log, sent)  # what a restarting master does
    diverged = slave_log.max_offset > kept
    events.append("slave holds lost bytes" if diverged else "slave holds nothing lost")

    # 2. The master restarts and producers go on at once; the slave comes back.
    service = HAService(master_config, master_log, sent=sent)
    client = HAClient(slave_config, slave_log)

    async def produce_and_watch(_nursery: trio.Nursery) -> None:
        for i, size in enumerate(case.after):
            master_log.append(NewMessage(topic="After", body=bytes([100 + i]) * size))
            service.notify_log_grew()
            await trio.lowlevel.checkpoint()
        with trio.fail_after(CATCH_UP):
            if diverged:
                await client.wait_diverged()
            else:
                await poll_until(lambda: slave_log.max_offset == master_log.max_offset, math.inf)

    await replicate(service, client, produce_and_watch)
    if diverged:
        # Refused, told where the histories part, and not a byte spliced on.
        assert client.divergence is not None
        assert client.divergence.master_offset == kept
        assert log_bytes(slave_log) == held
        assert service.statistics().slaves_refused >= 1
        # 3. The operator's cut: the slave then follows the new history exactly.
        if kept > slave_log.min_offset:
            slave_log.truncate_to_boundary(kept)
        else:  # it started past the fork (served from a last segment): re-seed it empty
            slave_log = MemoryCommitLog(segment_size=SEGMENT, clock_ms=lambda: 0)
        client = HAClient(slave_config, slave_log)

        async def catch_up(_nursery: trio.Nursery) -> None:
            with trio.fail_after(CATCH_UP):
                await poll_until(lambda: slave_log.max_offset == master_log.max_offset, math.inf)

        await replicate(HAService(master_config, master_log, sent=sent), client, catch_up)
        events.append("refused, cut back, caught up")
    end = master_log.max_offset
    start = slave_log.min_offset
    assert bytes(slave_log.read(start, end - start)) == bytes(master_log.read(start, end - start))
    assert [m.body for m in slave_log.iter_messages()] == [
        m.body for m in master_log.iter_messages(start)
    ]


@settings(
    max_examples=max(10, settings().max_examples // 4),
    phases=[p for p in settings().phases if p is not Phase.explain],
)
@given(case=power_losses)
def test_a_master_power_loss_never_splices_the_slave(case: PowerLoss) -> None:
    events: list[str] = []
    with (
        tempfile.TemporaryDirectory() as root,
        mock.patch.object(trio.to_thread, "run_sync", run_sync_inline),
    ):
        trio.run(
            run_power_loss,
            case,
            Path(root),
            events,
            clock=thread_aware_autojump_clock(),
        )
    for name in sorted(set(events)):
        event(name)
