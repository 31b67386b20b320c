"""Epoch mode (RocketMQ 5.x AutoSwitch) at the byte level: layouts, handshake, truncation.

The expected bytes are written out from ``AutoSwitchHAClient`` / ``AutoSwitchHAConnection``'s
layouts (big-endian; state = ``HAConnectionState`` ordinal), not produced by the code under test.
"""

from __future__ import annotations

import itertools
import re
import struct
from collections.abc import Callable, Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioha import LocalProtocolError, RemoteProtocolError
from trioha.proto import (
    AckAdvanced,
    Append,
    Close,
    CloseKind,
    EpochHistory,
    EpochTransferHeader,
    HeaderReceived,
    LogView,
    MasterConnection,
    MasterHandshakeHeader,
    MasterOptions,
    MasterPhase,
    RecordEpoch,
    SendMasterHandshake,
    SendReport,
    SendSlaveHandshake,
    SendTransfer,
    SlaveConnection,
    SlaveHandshake,
    SlavePhase,
    SlaveState,
    Truncate,
    encode_epoch_report,
    encode_master_handshake,
    slave_step,
)
from trioha.proto._epochframes import decode_epoch_report
from trioha.proto._epochs import entries_of

SEG = 64


def test_slave_handshake_bytes() -> None:
    data = SlaveHandshake(sync_from_last_file=True, async_learner=False, broker_id=7).to_bytes()
    assert data == bytes.fromhex("00000001000100000000000000000007")
    assert SlaveHandshake.from_bytes(data) == SlaveHandshake(True, False, 7)


def test_slave_report_bytes() -> None:
    assert encode_epoch_report(0x0102030405) == bytes.fromhex("000000020000000102030405")


def test_master_handshake_bytes() -> None:
    data = encode_master_handshake(0x2000, entries_of([(1, 0), (3, 0x1000)]))
    assert data == bytes.fromhex(
        "00000001"
        "00000018"
        "0000000000002000"
        "00000003"  # state, bodySize 24, max, epoch
        "00000001"
        "0000000000000000"
        "00000003"
        "0000000000001000"
    )


def test_transfer_header_bytes() -> None:
    header = EpochTransferHeader(
        offset=0x1000, size=0x20, epoch=3, epoch_start=0x800, confirm_offset=0x1020
    )
    data = header.to_bytes()
    assert data == bytes.fromhex(
        "000000020000002000000000000010000000000300000000000008000000000000001020"
    )
    assert len(data) == 36
    assert EpochTransferHeader.from_bytes(data, max_body=64) == header


# --- a master and a slave over bytes ------------------------------------------------------------


@attrs.define
class Replica:
    """A log as bytes plus its epoch history (what the store and epoch file hold)."""

    data: bytearray = attrs.field(factory=bytearray)
    epochs: EpochHistory = attrs.field(factory=EpochHistory)

    @property
    def end(self) -> int:
        return len(self.data)


def master_view(master: Replica) -> LogView:
    return LogView(0, master.end, SEG, epochs=master.epochs)


@attrs.define
class Run:
    closes: list[Close] = attrs.field(factory=list)
    truncated: list[int] = attrs.field(factory=list)
    frames: list[tuple[int, int, int, int]] = attrs.field(factory=list)


def replicate(master: Replica, slave: Replica, *, batch: int = 16, rounds: int = 200) -> Run:
    """One connection from handshake to caught up, executing actions as the net layer does."""
    run = Run()
    mconn = MasterConnection(now=0.0, options=MasterOptions(batch_size=batch, epoch_mode=True))
    sconn = SlaveConnection(log_max=slave.end, now=0.0, epochs=slave.epochs, max_body=batch)
    to_master = b"".join(
        sconn.encode(a)
        for a in sconn.initial_actions()
        if isinstance(a, SendSlaveHandshake | SendReport)
    )
    to_slave = b""

    def slave_do(actions: Sequence[object]) -> bytes:
        out = b""
        for action in actions:
            if isinstance(action, Truncate):
                del slave.data[action.offset :]
                slave.epochs = slave.epochs.truncate_suffix(action.offset)
                run.truncated.append(action.offset)
            elif isinstance(action, RecordEpoch):
                slave.epochs = slave.epochs.append(action.epoch, action.start_offset)
            elif isinstance(action, Append):
                assert slave.end in (action.offset, 0)
                slave.data += action.data
                out += b"".join(
                    sconn.encode(a)
                    for a in sconn.appended(slave.end, now=0.0)
                    if isinstance(a, SendReport)
                )
            elif isinstance(action, SendReport | SendSlaveHandshake):
                out += sconn.encode(action)
            elif isinstance(action, Close):
                run.closes.append(action)
        return out

    for _ in range(rounds):
        progressed = False
        if to_master:
            data, to_master = to_master, b""
            for action in mconn.receive_data(data, now=0.0, log=master_view(master)):
                if isinstance(action, SendMasterHandshake):
                    to_slave += mconn.handshake_bytes(action)
                elif isinstance(action, Close):
                    run.closes.append(action)
                else:
                    assert isinstance(action, AckAdvanced)
            progressed = True
        send = mconn.next_send(now=0.0, log=master_view(master))
        if isinstance(send, SendTransfer):
            to_slave += mconn.header(send, confirm_offset=master.end)
            to_slave += bytes(master.data[send.offset : send.offset + send.size])
            run.frames.append((send.offset, send.size, send.epoch, send.epoch_start))
            mconn.frame_written(now=0.0)
            progressed = True
        elif isinstance(send, Close):
            run.closes.append(send)
        if to_slave:
            data, to_slave = to_slave, b""
            to_master += slave_do(sconn.receive_data(data, now=0.0))
            progressed = True
        if run.closes or not progressed:
            break
    return run


def grow(replica: Replica, n: int, fill: int) -> None:
    replica.data += bytes([fill]) * n


def test_new_slave_copies_everything_and_rebuilds_the_history() -> None:
    master = Replica()
    master.epochs = master.epochs.begin_epoch(0)
    grow(master, 40, 1)
    master.epochs = master.epochs.begin_epoch(master.end)  # a restart
    grow(master, 40, 2)
    slave = Replica()
    run = replicate(master, slave)
    assert not run.closes
    assert slave.data == master.data
    assert slave.epochs == master.epochs
    # No frame crosses an epoch's end, and each carries its epoch.
    assert all(off + size <= 40 for off, size, epoch, _ in run.frames if epoch == 1)
    assert {(e, s) for _o, _n, e, s in run.frames} == {(1, 0), (2, 40)}


def test_slave_holding_lost_bytes_truncates_to_the_consistent_point() -> None:
    master, slave = Replica(), Replica()
    master.epochs = master.epochs.begin_epoch(0)
    grow(master, 48, 1)
    assert not replicate(master, slave).closes
    assert slave.data == master.data
    # The master loses its unflushed tail [32, 48), restarts, and writes new data there.
    del master.data[32:]
    master.epochs = master.epochs.begin_epoch(master.end)
    grow(master, 30, 9)
    run = replicate(master, slave)
    assert not run.closes
    assert run.truncated == [32]
    assert slave.data == master.data
    assert slave.epochs == entries_of([(1, 0), (2, 32)])


def test_no_common_history_closes_as_diverged() -> None:
    master = Replica(bytearray(b"\1" * 20), entries_of([(5, 4)]))
    slave = Replica(bytearray(b"\2" * 10), entries_of([(1, 0)]))
    run = replicate(master, slave)
    assert len(run.closes) == 1 and run.closes[0].diverged_at == 0
    assert "no consistent point" in run.closes[0].reason
    assert slave.data == b"\2" * 10  # nothing cut when nothing is known


def test_a_master_that_lost_every_epoch_the_slave_knows_starts_it_over() -> None:
    # The master lost everything since its first epoch and began epoch 2 at 0: the only
    # shared prefix is the empty one.
    master = Replica(bytearray(b"\1" * 20), entries_of([(2, 0)]))
    slave = Replica(bytearray(b"\2" * 10), entries_of([(1, 0)]))
    run = replicate(master, slave)
    assert not run.closes
    assert run.truncated == [0]
    assert slave.data == master.data and slave.epochs == master.epochs


def test_log_without_history_is_refused_not_trusted() -> None:
    master = Replica(bytearray(b"\1" * 20), entries_of([(1, 0)]))
    slave = Replica(bytearray(b"\1" * 10))
    run = replicate(master, slave)
    assert run.closes and run.closes[0].diverged_at == 0
    assert "no epoch history" in run.closes[0].reason


def test_frame_in_an_unknown_epoch_over_held_bytes_is_divergence() -> None:
    slave = SlaveConnection(log_max=30, now=0.0, epochs=entries_of([(1, 0)]), max_body=64)
    slave.initial_actions()
    slave.receive_data(encode_master_handshake(30, entries_of([(1, 0)])), now=0.0)
    assert slave.state.phase is SlavePhase.TRANSFER
    frame = EpochTransferHeader(30, 4, epoch=2, epoch_start=20, confirm_offset=34).to_bytes()
    actions = slave.receive_data(frame + b"abcd", now=0.0)
    assert isinstance(actions[-1], Close) and actions[-1].diverged_at == 20
    assert not any(isinstance(a, Append | RecordEpoch) for a in actions)


# --- hostile handshakes -------------------------------------------------------------------------


def slave_after(data: bytes, *, log_max: int = 10) -> tuple[SlaveConnection, list[object]]:
    conn = SlaveConnection(log_max=log_max, now=0.0, epochs=entries_of([(1, 0)]), max_body=64)
    conn.initial_actions()
    return conn, list(conn.receive_data(data, now=0.0))


def handshake(
    body_size: int, max_offset: int, last_epoch: int, entries: bytes, state: int = 1
) -> bytes:
    return struct.pack(">iiqi", state, body_size, max_offset, last_epoch) + entries


def entry(epoch: int, start: int) -> bytes:
    return struct.pack(">iq", epoch, start)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (handshake(12, 100, 1, entry(1, 0), state=2), "state 2 .TRANSFER.; expected 1"),
        (handshake(12, 100, 1, entry(1, 0), state=9), "state 9"),
        (handshake(13, 100, 1, entry(1, 0) + b"\0"), "not a multiple of 12"),
        (handshake(-12, 100, 1, b""), "not a multiple of 12"),
        (handshake(12 * 1001, 100, 1, b""), "1001 epoch entries; at most 1000"),
        (handshake(24, 100, 2, entry(2, 0) + entry(1, 50)), "out of order"),
        (handshake(24, 100, 2, entry(1, 50) + entry(2, 50)), "out of order"),
        (handshake(12, 100, 4, entry(1, 0)), "last epoch 4"),
        (handshake(12, 100, 1, entry(1, 200)), "beyond the master's max offset"),
        (handshake(0, -1, 0, b""), "negative max offset"),
    ],
)
def test_malformed_master_handshake_closes(data: bytes, reason: str) -> None:
    conn, actions = slave_after(data)
    assert len(actions) == 1 and isinstance(actions[0], Close), actions
    assert re.search(reason, actions[0].reason), actions[0].reason
    assert conn.closed and conn.buffered == 0


def test_short_master_handshake_waits() -> None:
    full = handshake(24, 100, 2, entry(1, 0) + entry(2, 5))
    conn, actions = slave_after(full[:19])
    assert actions == [] and conn.state.phase is SlavePhase.HANDSHAKE
    assert conn.receive_data(full[19:30], now=0.0) == []
    actions2 = conn.receive_data(full[30:], now=0.0)
    assert actions2 == [Truncate(5), SendReport(5)]  # epoch 2 began inside what it holds


def master_after(data: bytes) -> tuple[MasterConnection, tuple[object, ...]]:
    conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    view = LogView(0, 100, SEG, epochs=entries_of([(1, 0)]))
    return conn, conn.receive_data(data, now=0.0, log=view)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (struct.pack(">ihhq", 1, 2, 0, 1), "isSyncFromLastFile is 2"),
        (struct.pack(">ihhq", 1, 0, -1, 1), "isAsyncLearner is -1"),
        (struct.pack(">iq", 2, 5), "before its handshake"),
        (struct.pack(">iq", 0, 5), "state field 0 .READY."),
        (struct.pack(">iq", 77, 5), "state field 77"),
        (
            SlaveHandshake().to_bytes() + struct.pack(">iq", 2, 0) + SlaveHandshake().to_bytes(),
            "handshake on a connection already transferring",
        ),
        (SlaveHandshake().to_bytes() + struct.pack(">iq", 2, 101), "holds data this master"),
        (SlaveHandshake().to_bytes() + struct.pack(">iq", 2, -5), "negative offset"),
    ],
)
def test_malformed_slave_messages_close(data: bytes, reason: str) -> None:
    conn, actions = master_after(data)
    assert isinstance(actions[-1], Close), actions
    assert re.search(reason, actions[-1].reason), actions[-1].reason
    assert conn.closed


def test_short_slave_handshake_waits() -> None:
    data = SlaveHandshake(broker_id=3).to_bytes() + encode_epoch_report(0)
    conn, actions = master_after(data[:12])  # Java would read it at 12; we wait for 16
    assert actions == ()
    assert conn.state.phase.value == "HANDSHAKE"
    actions = conn.receive_data(
        data[12:], now=0.0, log=LogView(0, 100, SEG, epochs=entries_of([(1, 0)]))
    )
    assert isinstance(actions[0], SendMasterHandshake)
    assert conn.handshake == SlaveHandshake(broker_id=3)
    assert conn.state.phase is MasterPhase.TRANSFER and conn.state.next_transfer == 0


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """*data* in pieces of the given lengths (the rest last): how reads may cut a stream."""
    pieces, rest = [], data
    for cut in cuts:
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return [*pieces, rest]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(1, 40), max_size=8))
def test_garbage_to_either_side_closes_cleanly(data: bytes, cuts: list[int]) -> None:
    pieces = split(data, cuts)
    sconn = SlaveConnection(log_max=0, now=0.0, epochs=EpochHistory(), max_body=64)
    sconn.initial_actions()
    mconn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True, batch_size=64))
    view = LogView(0, 100, SEG, epochs=entries_of([(1, 0)]))
    for piece in pieces:
        for action in sconn.receive_data(piece, now=0.0):
            assert isinstance(action, Append | RecordEpoch | SendReport | Close | Truncate)
            assert not isinstance(action, Truncate), "an empty slave has nothing to cut"
        assert sconn.buffered <= 12000 + 36 + 64
        for maction in mconn.receive_data(piece, now=0.0, log=view):
            assert isinstance(maction, SendMasterHandshake | AckAdvanced | Close)
        assert mconn._buffer.__len__() < 16


def reference_handshake(data: bytes) -> str:
    """How an honest slave reads a master handshake (from RocketMQ's layout, not the code):
    "wait", "accept" or "close"."""
    if len(data) < 20:
        return "wait"
    state, body_size, max_offset, last = struct.unpack_from(">iiqi", data)
    if state != 1 or body_size < 0 or body_size % 12 or body_size > 12000 or max_offset < 0:
        return "close"
    if len(data) < 20 + body_size:
        return "wait"
    entries = [struct.unpack_from(">iq", data, 20 + 12 * i) for i in range(body_size // 12)]
    for (e1, s1), (e2, s2) in itertools.pairwise(entries):
        if e2 <= e1 or s2 <= s1:
            return "close"
    if entries and (entries[-1][0] != last or entries[-1][1] > max_offset):
        return "close"
    if any(e < 0 or s_ < 0 for e, s_ in entries):
        return "close"
    return "accept"


@st.composite
def hostile_handshakes(draw: st.DrawFn) -> bytes:
    """A master handshake, well-formed or not, maybe cut short."""
    count = draw(st.one_of(st.integers(0, 5), st.sampled_from([999, 1000, 1001, 1100])))
    state = draw(st.sampled_from([1, 1, 1, 0, 2, 3, 4, 77, -1]))
    if count <= 5:
        starts = sorted(
            draw(st.lists(st.integers(0, 300), min_size=count, max_size=count, unique=True))
        )
    else:
        starts = list(range(0, 2 * count, 2))
    epochs = list(range(1, count + 1))
    if count > 1 and draw(st.booleans()):
        epochs = draw(st.permutations(epochs))
    entries = b"".join(entry(e, s) for e, s in zip(epochs, starts, strict=True))
    max_offset = draw(st.one_of(st.integers(-2, 400), st.just(2500)))
    last = epochs[-1] if epochs else draw(st.integers(0, 3))
    body_size = len(entries) + draw(st.sampled_from([0, 0, 0, 1, -12, 12]))
    data = handshake(body_size, max_offset, last, entries, state=state)
    if draw(st.booleans()):  # short: the rest has not arrived (yet)
        data = data[: draw(st.integers(0, len(data)))]
    return data


@settings(max_examples=150, deadline=None)
@given(hostile_handshakes(), st.lists(st.integers(1, 5000), max_size=4))
def test_hostile_master_handshakes(data: bytes, cuts: list[int]) -> None:
    pieces = split(data, cuts)
    conn = SlaveConnection(log_max=0, now=0.0, epochs=EpochHistory(), max_body=64)
    conn.initial_actions()
    actions: list[object] = []
    for piece in pieces:
        actions += conn.receive_data(piece, now=0.0)
        assert conn.buffered <= 20 + 12 * 1000 + 36
    expected = reference_handshake(data)
    if expected == "accept":
        assert actions == [SendReport(0)]
        assert conn.state.phase is SlavePhase.TRANSFER
    elif expected == "close":
        assert len(actions) == 1 and isinstance(actions[0], Close), actions
        assert conn.closed and conn.buffered == 0
    else:
        assert actions == []
        assert conn.state.phase is SlavePhase.HANDSHAKE


def test_mismatched_modes_close_loudly_on_both_sides() -> None:
    """A classic peer and an epoch-mode peer never replicate by accident."""
    view = LogView(0, 100, SEG, epochs=entries_of([(1, 0)]))
    # An epoch-mode slave's handshake read by a classic master: it takes the newest 8 bytes
    # (the broker id) as a report, as a Java 4.x master would, and serves a classic frame,
    # which the epoch-mode slave refuses as a handshake with state 0.
    classic_master = MasterConnection(now=0.0)
    classic_view = LogView(0, 100, SEG)
    classic_master.receive_data(SlaveHandshake(broker_id=1).to_bytes(), now=0.0, log=classic_view)
    send = classic_master.next_send(now=0.0, log=classic_view)
    assert isinstance(send, SendTransfer)
    epoch_slave = SlaveConnection(log_max=0, now=0.0, epochs=EpochHistory(), max_body=64)
    epoch_slave.initial_actions()
    refused = epoch_slave.receive_data(classic_master.header(send) + b"x" * send.size, now=0.0)
    assert isinstance(refused[-1], Close) and "state 0" in refused[-1].reason
    # A classic slave's 8-byte report read by an epoch-mode master: state field 0 (READY).
    epoch_master = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    actions = epoch_master.receive_data(struct.pack(">q", 64), now=0.0, log=view)
    assert isinstance(actions[-1], Close) and "state field 0" in actions[-1].reason
    # A classic master's frame read by an epoch-mode slave waiting for the handshake.
    slave = SlaveConnection(log_max=0, now=0.0, epochs=EpochHistory(), max_body=64)
    slave.initial_actions()
    frame = struct.pack(">qi", 0, 4) + b"abcd" + struct.pack(">qi", 4, 4) + b"efgh"
    actions2 = slave.receive_data(frame, now=0.0)
    assert len(actions2) == 1 and isinstance(actions2[0], Close)
    assert "master handshake carries state 0" in actions2[0].reason


def test_a_repeated_handshake_before_the_first_report_is_answered_again() -> None:
    """AutoSwitchHAClient sends its handshake again after 5 s without an answer."""
    conn, actions = master_after(SlaveHandshake().to_bytes() * 2)
    assert [type(a) for a in actions] == [SendMasterHandshake, SendMasterHandshake]
    assert not conn.closed and conn.state.phase is MasterPhase.AWAIT_REPORT


# --- epoch checks no round trip above happens to reach ------------------------------------------


def test_transfer_header_end_and_an_epoch_starting_after_the_frame_is_refused() -> None:
    header = EpochTransferHeader(offset=100, size=20, epoch=2, epoch_start=50, confirm_offset=0)
    assert header.end == 120
    for start in (101, -1):
        bad = attrs.evolve(header, epoch_start=start).to_bytes()
        with pytest.raises(RemoteProtocolError, match=f"in epoch 2 starting at {start}"):
            EpochTransferHeader.from_bytes(bad, max_body=64)


def test_an_epoch_mode_master_without_a_history_is_our_bug() -> None:
    conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    with pytest.raises(LocalProtocolError, match="needs the master's epoch history"):
        conn.receive_data(SlaveHandshake().to_bytes(), now=0.0, log=LogView(0, 100, SEG))


def epoch_master(report: int, view: LogView) -> tuple[MasterConnection, list[object]]:
    conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    actions: list[object] = list(conn.receive_data(SlaveHandshake().to_bytes(), now=0.0, log=view))
    actions += conn.receive_data(encode_epoch_report(report), now=0.0, log=view)
    return conn, actions


def test_a_request_before_the_masters_first_epoch_closes() -> None:
    conn, actions = epoch_master(10, LogView(0, 100, SEG, epochs=entries_of([(3, 50)])))
    assert isinstance(actions[-1], Close) and conn.closed
    assert "offset 10, which no epoch of the master holds (its first epoch: 3-50)" in (
        actions[-1].reason
    )


def test_bytes_the_master_wrote_outside_every_epoch_are_never_sent() -> None:
    # The request is the master's end (allowed before any epoch covers it); the log then grows
    # with no epoch recorded for the new bytes: a local inconsistency, so no frame goes out.
    conn, _ = epoch_master(10, LogView(0, 10, SEG, epochs=entries_of([(3, 50)])))
    assert not conn.closed
    grown = LogView(0, 40, SEG, epochs=entries_of([(3, 50)]))
    close = conn.next_send(now=0.0, log=grown)
    assert close == Close(
        "no epoch of the master holds offset 10", False, kind=CloseKind.PROTOCOL_ERROR
    )


def transferring(expected: int, history: Sequence[tuple[int, int]]) -> SlaveState:
    return SlaveState(phase=SlavePhase.TRANSFER, expected=expected, epochs=entries_of(history))


@pytest.mark.parametrize(
    ("state", "header", "diverged_at", "reason"),
    [
        # Same epoch number, another start: two masters both called their epoch 2.
        (transferring(120, [(1, 0), (2, 100)]), (120, 2, 110), 100, "starts elsewhere"),
        # An epoch older than the slave's newest: this master is behind the slave's history.
        (transferring(120, [(1, 0), (2, 100)]), (120, 1, 0), 0, "older than the slave's last"),
        # A new epoch that does not begin after the slave's newest one.
        (transferring(100, [(1, 0), (2, 100)]), (100, 3, 100), 100, "not after the slave's last"),
    ],
)
def test_frames_contradicting_the_slaves_history_close_as_diverged(
    state: SlaveState, header: tuple[int, int, int], diverged_at: int, reason: str
) -> None:
    offset, epoch, start = header
    new, actions = slave_step(state, HeaderReceived(offset, 4, epoch, start))
    assert new.phase is SlavePhase.DISCONNECTED and new.expected == state.expected
    (close,) = actions
    assert isinstance(close, Close) and close.diverged_at == diverged_at
    assert reason in close.reason


def test_a_header_fed_while_a_body_is_expected_is_our_bug() -> None:
    state = SlaveState(phase=SlavePhase.TRANSFER, expected=10, receiving=(10, 4))
    with pytest.raises(LocalProtocolError, match="while a body was still expected"):
        slave_step(state, HeaderReceived(14, 4))


# --- the state field and the bounds of each message, named exactly ----------------------------


@pytest.mark.parametrize(
    ("decode", "data", "message"),
    [
        (
            SlaveHandshake.from_bytes,
            struct.pack(">ihhq", 2, 0, 0, 1),
            "slave handshake carries state 2 (TRANSFER); expected 1 (HANDSHAKE)",
        ),
        (
            decode_epoch_report,
            struct.pack(">iq", 1, 5),
            "slave report carries state 1 (HANDSHAKE); expected 2 (TRANSFER)",
        ),
        (
            lambda data: EpochTransferHeader.from_bytes(data, max_body=64),
            struct.pack(">iiqiqq", 7, 0, 0, 1, 0, 0),
            "master frame carries state 7 (unknown state 7); expected 2 (TRANSFER)",
        ),
        (
            lambda data: EpochTransferHeader.from_bytes(data, max_body=64),
            EpochTransferHeader(10, 4, epoch=2, epoch_start=11, confirm_offset=14).to_bytes(),
            "master sent a frame at 10 in epoch 2 starting at 11: an epoch cannot start after "
            "the bytes it holds",
        ),
    ],
)
def test_a_message_with_the_wrong_state_or_epoch_says_which_and_why(
    decode: Callable[[bytes], object], data: bytes, message: str
) -> None:
    with pytest.raises(RemoteProtocolError, match=f"^{re.escape(message)}$"):
        decode(data)


def test_a_master_handshake_holds_at_most_a_thousand_epoch_entries() -> None:
    # The Java handshake buffer holds 1000 entries of 12 bytes; one more is refused.
    header = MasterHandshakeHeader.from_bytes(struct.pack(">iiqi", 1, 12_000, 0, 1))
    assert header.entry_count == 1000
    with pytest.raises(
        RemoteProtocolError,
        match=r"^master handshake announces 1001 epoch entries; at most 1000 fit a RocketMQ "
        r"handshake$",
    ):
        MasterHandshakeHeader.from_bytes(struct.pack(">iiqi", 1, 12_012, 0, 1))
