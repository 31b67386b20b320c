"""``MasterConnection``'s own bookkeeping: counters, timings, headers, what a close says."""

from __future__ import annotations

import pytest

from trioha import ProtocolError
from trioha.proto import (
    Close,
    CloseKind,
    EpochTransferHeader,
    LogView,
    MasterConnection,
    MasterOptions,
    MasterPhase,
    Report,
    SendHeartbeat,
    SendTransfer,
    SlaveConnection,
    SlaveHandshake,
    Timing,
    encode_header,
    encode_report,
    frame_header,
)
from trioha.proto._epochs import entries_of

LOG = LogView(0, 100, 1024)


def test_attributes_of_a_new_connection() -> None:
    conn = MasterConnection(
        now=5.0, timing=Timing(heartbeat=2.0, housekeeping=9.0), peer="10.0.0.2:4321"
    )
    assert conn.peer == "10.0.0.2:4321"
    assert conn.bytes_received == 0
    assert conn.handshake is None
    assert (conn.heartbeat_deadline, conn.read_deadline) == (7.0, 14.0)
    slave = SlaveConnection(
        log_max=0, now=5.0, timing=Timing(heartbeat=2.0, housekeeping=9.0), peer="10.0.0.1:10912"
    )
    assert slave.peer == "10.0.0.1:10912"
    assert (slave.heartbeat_deadline, slave.read_deadline) == (7.0, 14.0)


def test_bytes_received_counts_every_read() -> None:
    conn = MasterConnection(now=0.0)
    report = encode_report(0)
    conn.receive_data(report[:3], now=1.0, log=LOG)
    conn.receive_data(report[3:], now=2.0, log=LOG)
    assert conn.bytes_received == 8
    assert conn.last_read == 2.0


def test_heartbeat_headers_carry_no_body() -> None:
    assert frame_header(SendHeartbeat(77)) == encode_header(77, 0)
    epoch = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    data = epoch.header(SendHeartbeat(77, epoch=3, epoch_start=40), confirm_offset=90)
    assert EpochTransferHeader.from_bytes(data, max_body=64) == EpochTransferHeader(
        77, 0, epoch=3, epoch_start=40, confirm_offset=90
    )


def test_a_bad_report_closes_naming_it_and_clears_the_pending_write() -> None:
    conn = MasterConnection(now=0.0, options=MasterOptions(batch_size=10))
    conn.receive_data(encode_report(0), now=0.0, log=LOG)
    assert isinstance(conn.next_send(now=0.0, log=LOG), SendTransfer)
    assert conn.state.write_pending
    bad = (-5).to_bytes(8, "big", signed=True)
    with pytest.raises(ProtocolError) as excinfo:
        Report.from_bytes(bad)
    assert conn.receive_data(bad, now=0.0, log=LOG) == (
        Close(str(excinfo.value), kind=CloseKind.PROTOCOL_ERROR),
    )
    assert conn.state.phase is MasterPhase.CLOSED
    assert conn.state.write_pending is False


def test_epoch_handshake_asking_for_the_last_file_is_kept() -> None:
    for last in (True, False):
        conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
        view = LogView(0, 100, 1024, epochs=entries_of([(1, 0)]))
        conn.receive_data(SlaveHandshake(sync_from_last_file=last).to_bytes(), now=0.0, log=view)
        assert conn.handshake == SlaveHandshake(sync_from_last_file=last)
        assert conn.state.from_last_file is last


def test_an_unknown_state_field_closes_as_soon_as_its_four_bytes_arrive() -> None:
    conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    actions = conn.receive_data((7).to_bytes(4, "big"), now=0.0, log=LOG)
    assert len(actions) == 1 and isinstance(actions[0], Close)
    assert "state field 7" in actions[0].reason
    assert "only HANDSHAKE (1) and TRANSFER (2) are valid" in actions[0].reason
