"""Parity tests for the transition rules, one per RocketMQ behaviour (docs/rocketmq-protocol.md
§1-§2, §9, §11)."""

from __future__ import annotations

import ast
from pathlib import Path

import attrs
import pytest

import trioha.proto
from trioha import LocalProtocolError
from trioha.proto import (
    MASTER_TABLE,
    SLAVE_TABLE,
    AckAdvanced,
    Append,
    AppendConfirmed,
    BodyReceived,
    Close,
    FrameWritten,
    LogView,
    MasterConnection,
    MasterOptions,
    MasterPhase,
    MasterState,
    ReportReceived,
    SendHeartbeat,
    SendReady,
    SendReport,
    SendTransfer,
    SlaveConnection,
    SlavePhase,
    SlaveState,
    Timing,
    encode_header,
    encode_report,
    master_step,
    replicated_offset,
    slave_step,
    slaves_available,
    vouch,
)

SEG = 1000
TIMING = Timing(heartbeat=5.0, housekeeping=20.0)


def view(max_offset: int, min_offset: int = 0) -> LogView:
    return LogView(min_offset, max_offset, SEG)


def master(batch: int = 300, oldest: bool = False) -> MasterConnection:
    return MasterConnection(
        now=0.0, options=MasterOptions(batch_size=batch, sync_from_oldest=oldest), timing=TIMING
    )


def first_transfer(conn: MasterConnection, report: int, log: LogView) -> object:
    conn.receive_data(encode_report(report), now=0.0, log=log)
    return conn.next_send(now=0.0, log=log)


# --- HAConnection.WriteSocketService ----------------------------------------------------------


def test_master_sends_nothing_before_the_first_report() -> None:
    conn = master()
    # Even a due heartbeat waits: the writer sleeps while slaveRequestOffset == -1.
    assert conn.next_send(now=100.0, log=view(2500)) is None
    assert conn.state.phase is MasterPhase.AWAIT_REPORT


def test_slave_reporting_zero_is_served_from_the_start_of_the_last_segment() -> None:
    assert first_transfer(master(), 0, view(2500)) == SendTransfer(2000, 300)


def test_slave_reporting_zero_on_an_empty_master_starts_at_zero() -> None:
    conn = master()
    assert first_transfer(conn, 0, view(0)) is None
    assert conn.state.next_transfer == 0


def test_sync_from_oldest_serves_a_full_copy() -> None:
    assert first_transfer(master(oldest=True), 0, view(2500, 1000)) == SendTransfer(1000, 300)


def test_request_inside_a_file_is_served_from_exactly_there() -> None:
    # Observed against the Java master (docs/rocketmq-protocol.md §11): no alignment to messages.
    assert first_transfer(master(), 1234, view(2500)) == SendTransfer(1234, 300)


def test_frames_never_cross_a_segment_boundary() -> None:
    conn = master(batch=10_000)
    assert first_transfer(conn, 1800, view(2500)) == SendTransfer(1800, 200)
    conn.frame_written(now=0.0)
    assert conn.next_send(now=0.0, log=view(2500)) == SendTransfer(2000, 500)


def test_no_new_frame_until_the_last_one_is_written() -> None:
    # lastWriteOver: an unfinished transfer is resumed before anything else.
    conn = master()
    assert first_transfer(conn, 0, view(2900)) == SendTransfer(2000, 300)
    assert conn.next_send(now=0.0, log=view(2900)) is None
    conn.frame_written(now=0.0)
    assert conn.next_send(now=0.0, log=view(2900)) == SendTransfer(2300, 300)


def test_the_transfer_position_is_chosen_once_per_connection() -> None:
    conn = master()
    first_transfer(conn, 2000, view(2900))
    conn.frame_written(now=0.0)
    conn.receive_data(encode_report(2100), now=0.0, log=view(2900))
    assert conn.state.request_offset == 2000
    assert conn.state.next_transfer == 2300  # later acks never re-seek
    assert conn.next_send(now=0.0, log=view(2900)) == SendTransfer(2300, 300)


def test_heartbeat_after_write_silence_carries_the_next_offset() -> None:
    conn = master()
    assert first_transfer(conn, 2500, view(2500)) is None
    assert conn.next_send(now=4.9, log=view(2500)) is None
    assert conn.next_send(now=5.0, log=view(2500)) == SendHeartbeat(2500)
    conn.frame_written(now=5.0)
    assert conn.next_send(now=9.0, log=view(2500)) is None


def test_every_report_is_an_ack_and_advances_once() -> None:
    conn = master()
    log = view(2900)
    assert conn.receive_data(encode_report(2000), now=0.0, log=log) == (AckAdvanced(2000),)
    conn.next_send(now=0.0, log=log)
    assert conn.receive_data(encode_report(2300), now=0.0, log=log) == (AckAdvanced(2300),)
    assert conn.receive_data(encode_report(2300), now=0.0, log=log) == ()
    assert conn.state.ack_offset == 2300


# --- where trioha is stricter than RocketMQ (§8) ----------------------------------------------


def test_an_ack_beyond_what_was_sent_closes_and_never_counts() -> None:
    # RocketMQ #3015/#1155: any client could inflate push2SlaveMaxOffset with 8 bytes.
    conn = master()
    log = view(2900)
    first_transfer(conn, 2000, log)
    (action,) = conn.receive_data(encode_report(2301), now=0.0, log=log)
    assert isinstance(action, Close) and "beyond what was sent" in action.reason
    assert conn.state.ack_offset == 2000
    assert conn.closed


def test_a_first_report_beyond_the_masters_end_closes() -> None:
    conn = master()
    (action,) = conn.receive_data(encode_report(5000), now=0.0, log=view(2500))
    assert isinstance(action, Close) and "diverged" in action.reason
    assert conn.state.ack_offset == -1


def test_a_request_offset_deleted_on_the_master_is_reported_not_looped() -> None:
    # RocketMQ #3388: the Java master heartbeats such a slave forever.
    conn = master()
    (action,) = conn.receive_data(encode_report(500), now=0.0, log=view(2500, 1000))
    assert isinstance(action, Close) and "#3388" in action.reason


def test_a_segment_deleted_under_a_streaming_slave_closes() -> None:
    conn = master()
    first_transfer(conn, 1000, view(2500, 1000))
    conn.frame_written(now=0.0)
    action = conn.next_send(now=0.0, log=view(2500, 2000))
    assert isinstance(action, Close) and "#3388" in action.reason
    assert action.oldest == 2000  # the IO layer pushes it to the slave


def test_a_deleted_request_offset_names_the_masters_oldest_offset() -> None:
    conn = master()
    (action,) = conn.receive_data(encode_report(500), now=0.0, log=view(2500, 1000))
    assert isinstance(action, Close) and action.oldest == 1000 and action.diverged_at is None


def test_a_heartbeat_past_the_slaves_end_says_its_next_bytes_were_deleted() -> None:
    conn = slave(1500)
    (action,) = conn.receive_data(encode_header(4096, 0), now=0.0)
    assert isinstance(action, Close) and action.oldest == 4096
    assert action.diverged_at is None
    assert "[1500, 4096)" in action.reason and "deleted on the master" in action.reason
    assert conn.closed


def test_a_heartbeat_before_the_slaves_end_is_a_divergence_not_a_deletion() -> None:
    conn = slave(1500)
    (action,) = conn.receive_data(encode_header(1000, 0), now=0.0)
    assert isinstance(action, Close) and action.oldest is None and action.diverged_at == 1000


def test_reports_going_backwards_close() -> None:
    conn = master()
    log = view(2900)
    first_transfer(conn, 2000, log)
    conn.receive_data(encode_report(2200), now=0.0, log=log)
    (action,) = conn.receive_data(encode_report(2100), now=0.0, log=log)
    assert isinstance(action, Close) and "backwards" in action.reason


def test_master_drops_a_silent_slave_after_housekeeping() -> None:
    conn = master()
    assert conn.tick(now=19.9) == ()
    (action,) = conn.tick(now=20.0)
    assert isinstance(action, Close) and "housekeeping" in action.reason


def test_a_closed_connection_ignores_late_bytes() -> None:
    conn = master()
    conn.tick(now=30.0)
    assert conn.receive_data(encode_report(1), now=31.0, log=view(10)) == ()
    assert conn.next_send(now=31.0, log=view(10)) is None


def test_a_frame_written_with_none_pending_is_our_bug() -> None:
    conn = master()
    first_transfer(conn, 0, view(0))
    with pytest.raises(LocalProtocolError, match="none was handed out"):
        master_step(conn.state, FrameWritten(), conn.options)


def test_an_event_the_table_does_not_allow_is_our_bug() -> None:
    with pytest.raises(LocalProtocolError, match="cannot handle FrameWritten in phase"):
        master_step(MasterState(), FrameWritten(), MasterOptions())


# --- HAClient ---------------------------------------------------------------------------------


def slave(log_max: int) -> SlaveConnection:
    return SlaveConnection(log_max=log_max, now=0.0, timing=TIMING)


def frame(offset: int, body: bytes) -> bytes:
    return encode_header(offset, len(body)) + body


def test_slave_reports_its_max_offset_at_once() -> None:
    # RocketMQ waits haSendHeartbeatInterval before the first report (docs/rocketmq-protocol.md
    # §1.2); we don't.
    assert slave(1500).initial_actions() == (SendReport(1500),)


def test_slave_appends_complete_frames_and_reports_after_the_store_confirms() -> None:
    conn = slave(1500)
    actions = conn.receive_data(frame(1500, b"abc") + frame(1503, b"de"), now=0.0)
    assert actions == [Append(1500, 3), Append(1503, 2)]
    assert [a.data for a in actions if isinstance(a, Append)] == [b"abc", b"de"]
    assert conn.appended(1505, now=0.0) == (SendReport(1505),)
    assert conn.appended(1505, now=0.0) == ()


def test_slave_offset_mismatch_closes_with_nothing_appended() -> None:
    conn = slave(1500)
    actions = conn.receive_data(frame(1600, b"xyz"), now=0.0)
    assert len(actions) == 1 and isinstance(actions[0], Close)
    assert "master pushed offset 1600" in actions[0].reason
    assert actions[0].oldest is None  # data past the end: not the deletion signal
    assert conn.closed and conn.buffered == 0


def test_the_offset_check_is_checked_on_the_header_before_the_body_arrives() -> None:
    conn = slave(1500)
    actions = conn.receive_data(encode_header(1499, 1_000_000), now=0.0)
    assert len(actions) == 1 and isinstance(actions[0], Close)


def test_the_offset_check_is_skipped_only_while_the_log_is_empty() -> None:
    conn = slave(0)
    assert conn.receive_data(frame(2000, b"ab"), now=0.0) == [Append(2000, 2)]
    actions = conn.receive_data(frame(2003, b"c"), now=0.0)
    assert isinstance(actions[0], Close)


def test_slave_reassembles_frames_split_anywhere() -> None:
    data = frame(0, b"hello") + frame(5, b"") + frame(5, b"world!")
    conn = slave(0)
    got: list[Append] = []
    for i in range(len(data)):
        got += [a for a in conn.receive_data(data[i : i + 1], now=0.0) if isinstance(a, Append)]
    assert [(a.offset, a.data) for a in got] == [(0, b"hello"), (5, b"world!")]


def test_slave_heartbeats_its_last_report() -> None:
    conn = slave(700)
    conn.initial_actions()
    conn.report_written(now=0.0)
    assert conn.tick(now=4.0) == ()
    assert conn.tick(now=5.0) == (SendReport(700),)


def test_slave_drops_a_master_silent_past_housekeeping() -> None:
    conn = slave(700)
    conn.receive_data(b"", now=0.0)
    conn.report_written(now=19.0)
    (action,) = conn.tick(now=20.0)
    assert isinstance(action, Close)


# --- GroupTransferService / HAService (HAServerTest) -----------------------------------------


def test_replicated_offset_needs_the_required_number_of_slaves() -> None:
    vouches = [(0, 123), (0, 124), (0, 125)]
    assert replicated_offset(vouches, 1) == 125
    assert replicated_offset(vouches, 2) == 124
    assert replicated_offset(vouches, 3) == 123
    assert replicated_offset([(0, 125)], 2) == -1


def test_a_connection_vouches_only_for_bytes_it_carried() -> None:
    # A slave served from the last segment (2000) acks 2500: a put in [1500, 1600) is not on it.
    assert replicated_offset([(2000, 2500)], 1, start=1500) == -1
    assert replicated_offset([(2000, 2500)], 1, start=2100) == 2500
    assert replicated_offset([(0, 1600), (2000, 2500)], 1, start=1500) == 1600


def test_a_first_report_is_where_a_connection_starts_vouching() -> None:
    # model/ finding: any client whose first report is the master's end "acked" waiting puts.
    conn = master()
    conn.receive_data(encode_report(2500), now=0.0, log=view(2500))
    assert vouch(conn.state) == (2500, 2500)
    assert replicated_offset([vouch(conn.state)], 1, start=2400) == -1


def test_slaves_available_is_strictly_within_the_gap() -> None:
    gap = 256 << 20
    assert slaves_available([(0, 124)], 1, 122 + gap, gap)
    assert slaves_available([(0, 124)], 1, 123 + gap, gap)
    assert not slaves_available([(0, 124)], 1, 124 + gap, gap)
    assert not slaves_available([], 1, 0, gap)


# --- structure --------------------------------------------------------------------------------


def test_the_protocol_core_does_no_io() -> None:
    forbidden = {"trio", "socket", "os", "time", "asyncio", "selectors"}
    package = Path(trioha.proto.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path.name} imports {name}"


# --- classic mode's divergence check (trioha's own: docs/replication.md) -----------------------


def lost_view(max_offset: int, *lost: tuple[int, int]) -> LogView:
    return LogView(0, max_offset, SEG, lost=lost)


@pytest.mark.parametrize("report", [1501, 1800, 2000])
def test_a_first_report_inside_a_lost_range_is_refused_with_the_fork(report: int) -> None:
    conn = master()
    actions = conn.receive_data(encode_report(report), now=0.0, log=lost_view(5200, (1500, 2000)))
    assert len(actions) == 1
    close = actions[0]
    assert isinstance(close, Close)
    assert close.diverged_at == 1500
    assert f"requests offset {report}, inside [1500, 2000)" in close.reason
    assert "--truncate-to-master" in close.reason
    assert conn.state.phase is MasterPhase.CLOSED
    assert conn.state.ack_offset == -1  # never counted as an ack


@pytest.mark.parametrize("report", [0, 1200, 1500, 2001, 3000, 5200])
def test_reports_outside_every_lost_range_are_served(report: int) -> None:
    """At the fork, before it, and in the new history beyond the range: one history."""
    conn = master()
    log = lost_view(5200, (1500, 2000), (100, 200))
    conn.receive_data(encode_report(report), now=0.0, log=log)
    assert conn.state.phase is MasterPhase.TRANSFER


def test_a_report_beyond_the_masters_end_tells_the_slave_where_the_master_ends() -> None:
    conn = master()
    (close,) = conn.receive_data(encode_report(2600), now=0.0, log=view(2500))
    assert isinstance(close, Close)
    assert close.diverged_at == 2500


def test_a_slave_told_a_frame_off_its_end_reports_a_divergence() -> None:
    slave = SlaveConnection(log_max=1800, now=0.0, timing=TIMING)
    slave.initial_actions()
    (close,) = slave.receive_data(encode_header(1500, 0), now=0.0)
    assert isinstance(close, Close)
    assert close.diverged_at == 1500
    assert slave.closed


# --- guards that only a bug in the IO layer or in this package can reach ----------------------


def test_asking_what_to_send_mid_write_is_our_bug() -> None:
    conn = master()
    first_transfer(conn, 0, view(10))
    with pytest.raises(LocalProtocolError, match="still being written"):
        master_step(conn.state, SendReady(view(10)), conn.options)


def test_a_closed_master_connection_ignores_a_late_frame_written() -> None:
    conn = master()
    first_transfer(conn, 0, view(10))
    conn.tick(now=30.0)
    assert conn.closed
    conn.frame_written(now=31.0)
    assert conn.closed and conn.last_write == 31.0


def test_a_closed_slave_connection_does_nothing_on_tick() -> None:
    conn = slave(0)
    conn.initial_actions()
    conn.tick(now=30.0)
    assert conn.closed
    assert conn.tick(now=60.0) == ()


def test_slave_events_the_table_does_not_allow_are_our_bug() -> None:
    with pytest.raises(LocalProtocolError, match="cannot handle BodyReceived in phase"):
        slave_step(SlaveState(), BodyReceived())


def test_a_body_with_no_header_is_our_bug() -> None:
    state = SlaveState(phase=SlavePhase.TRANSFER)
    with pytest.raises(LocalProtocolError, match="no header before it"):
        slave_step(state, BodyReceived())


def test_an_append_confirmed_beyond_what_was_handed_out_is_our_bug() -> None:
    state = SlaveState(phase=SlavePhase.TRANSFER, expected=100)
    with pytest.raises(LocalProtocolError, match="beyond what was handed out"):
        slave_step(state, AppendConfirmed(101))


def test_a_rule_reaching_an_undeclared_phase_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    key = (MasterPhase.AWAIT_REPORT, ReportReceived)
    rule = MASTER_TABLE[key]
    monkeypatch.setitem(MASTER_TABLE, key, attrs.evolve(rule, targets=(MasterPhase.CLOSED,)))
    with pytest.raises(AssertionError, match=r"ReportReceived in AWAIT_REPORT led to TRANSFER"):
        master_step(MasterState(), ReportReceived(0, view(10)), MasterOptions())
    key2 = (SlavePhase.TRANSFER, AppendConfirmed)
    rule2 = SLAVE_TABLE[key2]
    monkeypatch.setitem(SLAVE_TABLE, key2, attrs.evolve(rule2, targets=(SlavePhase.HANDSHAKE,)))
    with pytest.raises(AssertionError, match="declares only HANDSHAKE"):
        slave_step(SlaveState(phase=SlavePhase.TRANSFER, expected=5), AppendConfirmed(5))
