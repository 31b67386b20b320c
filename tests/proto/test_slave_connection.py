"""``SlaveConnection``'s own bookkeeping: counters, epoch-mode offsets, what a close keeps."""

from __future__ import annotations

import pytest

from trioha import ProtocolError
from trioha.proto import (
    Append,
    Close,
    CloseKind,
    EpochTransferHeader,
    SlaveConnection,
    SlavePhase,
    TransferHeader,
    encode_header,
    encode_master_handshake,
)
from trioha.proto._epochs import entries_of


def test_bytes_received_counts_every_read() -> None:
    conn = SlaveConnection(log_max=0, now=0.0)
    conn.initial_actions()
    frame = encode_header(0, 4) + b"abcd"
    conn.receive_data(frame[:5], now=1.0)
    conn.receive_data(frame[5:], now=2.0)
    assert conn.bytes_received == len(frame)
    assert conn.last_read == 2.0


def test_epoch_offsets_start_unknown_and_follow_the_master() -> None:
    conn = SlaveConnection(log_max=30, now=0.0, epochs=entries_of([(1, 0)]), max_body=64)
    assert (conn.confirm_offset, conn.master_max_offset) == (-1, -1)
    conn.initial_actions()
    frame = EpochTransferHeader(30, 4, epoch=1, epoch_start=0, confirm_offset=34).to_bytes()
    # The handshake and a frame in one read: the frame is not left waiting for the next read.
    actions = conn.receive_data(
        encode_master_handshake(40, entries_of([(1, 0)])) + frame + b"abcd", now=0.0
    )
    assert conn.master_max_offset == 40
    assert conn.confirm_offset == 34
    assert conn.state.phase is SlavePhase.TRANSFER
    assert [a for a in actions if isinstance(a, Append)] == [Append(30, 4, b"abcd")]


def test_a_bad_header_closes_naming_it_and_keeps_where_the_log_ends() -> None:
    conn = SlaveConnection(log_max=100, now=0.0)
    conn.initial_actions()
    bad = encode_header(100, 8)[:8] + (-1).to_bytes(4, "big", signed=True)
    with pytest.raises(ProtocolError) as excinfo:
        TransferHeader.from_bytes(bad, max_body=conn.max_body)
    actions = conn.receive_data(bad + b"more", now=0.0)
    assert actions == [Close(str(excinfo.value), kind=CloseKind.PROTOCOL_ERROR)]
    assert conn.state.phase is SlavePhase.DISCONNECTED
    assert conn.state.expected == 100
    assert conn.buffered == 0


@pytest.mark.parametrize("master_epochs", [[(1, 0)], [(1, 0), (3, 20)]])
def test_a_master_at_another_epoch_than_etcd_names_is_refused_before_any_cut(
    master_epochs: list[tuple[int, int]],
) -> None:
    conn = SlaveConnection(
        log_max=30, now=0.0, epochs=entries_of([(1, 0)]), peer="m:1", master_epoch=2
    )
    conn.initial_actions()
    actions = conn.receive_data(encode_master_handshake(40, entries_of(master_epochs)), now=0.0)
    last = master_epochs[-1][0]
    assert actions == [
        Close(
            f"refused master m:1: its last epoch is {last}, not 2 as the master etcd names",
            kind=CloseKind.PROTOCOL_ERROR,
        )
    ]
    assert conn.state.phase is SlavePhase.DISCONNECTED


def test_a_master_at_the_epoch_etcd_names_is_followed() -> None:
    conn = SlaveConnection(log_max=30, now=0.0, epochs=entries_of([(1, 0)]), master_epoch=2)
    conn.initial_actions()
    conn.receive_data(encode_master_handshake(40, entries_of([(1, 0), (2, 30)])), now=0.0)
    assert conn.state.phase is SlavePhase.TRANSFER
