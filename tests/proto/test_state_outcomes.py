"""What each transition rule leaves behind: the whole next state and the exact close.

The model checker tells states apart by equality, so a rule that leaves ``write_pending=None``
where ``False`` belongs, or forgets where the slave's log ends, makes different states of the
same situation; and a close's reason is what an operator reads in the log to decide what to do
(re-seed, cut back, check the network), so it is checked whole, not by a keyword.
"""

from __future__ import annotations

import re

import attrs
import pytest

from trioha import LocalProtocolError
from trioha.proto import (
    MASTER_TABLE,
    SLAVE_TABLE,
    BodyReceived,
    Close,
    CloseKind,
    ConnectionLost,
    EpochHistory,
    FrameWritten,
    HandshakeReceived,
    HeaderReceived,
    LogView,
    MasterConnection,
    MasterHandshakeReceived,
    MasterOptions,
    MasterPhase,
    MasterState,
    ReadIdle,
    ReportReceived,
    SendHeartbeat,
    SendReady,
    SendTransfer,
    SlaveHandshake,
    SlavePhase,
    SlaveState,
    Timing,
    encode_epoch_report,
    master_step,
    slave_step,
    transition_table_mermaid,
)
from trioha.proto._epochs import entries_of

SEG = 1000
OPTIONS = MasterOptions(batch_size=300)


def exactly(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for the whole of *message*."""
    return f"^{re.escape(message)}$"


def streaming(log: LogView, report: int) -> MasterState:
    """A master connection that accepted *report* and handed out its first frame."""
    state, _ = master_step(MasterState(), ReportReceived(report, log), OPTIONS)
    state, (frame,) = master_step(state, SendReady(log), OPTIONS)
    assert isinstance(frame, SendTransfer) and state.write_pending
    return state


# --- the master side -----------------------------------------------------------------------


def test_a_close_mid_write_leaves_nothing_pending() -> None:
    log = LogView(0, 2900, SEG)
    state = streaming(log, 2000)
    closed, actions = master_step(state, ReportReceived(2301, log), OPTIONS)
    assert closed == attrs.evolve(state, phase=MasterPhase.CLOSED, write_pending=False)
    assert actions == (
        Close(
            "slave acks offset 2301, beyond what was sent to it (2300; master's log ends at "
            "2900); the ack is not trusted (RocketMQ #3015)",
            remote=True,
            kind=CloseKind.PROTOCOL_ERROR,
        ),
    )
    lost, actions = master_step(state, ConnectionLost(), OPTIONS)
    assert lost == closed and actions == ()
    idle, actions = master_step(state, ReadIdle(), OPTIONS)
    assert idle == closed
    assert actions == (
        Close(
            "nothing read from the slave within the housekeeping interval", kind=CloseKind.TIMEOUT
        ),
    )


def test_a_frame_written_clears_exactly_the_pending_write() -> None:
    state = streaming(LogView(0, 2900, SEG), 2000)
    written, actions = master_step(state, FrameWritten(), OPTIONS)
    assert written == attrs.evolve(state, write_pending=False) and actions == ()


def test_first_reports_refused_say_why_and_what_to_do() -> None:
    cases = [
        (
            LogView(0, 5200, SEG, lost=((1500, 2000),)),
            1800,
            Close(
                "slave requests offset 1800, inside [1500, 2000): bytes this master may have "
                "sent before it crashed and lost them, or, promoted from a slave, bytes of the "
                "history it took over that it never had (its log was recovered to 1500); the "
                "slave's log after 1500 is a history the master does not have. Cut the slave "
                "back to 1500 (a trioha slave: `trioha slave --truncate-to-master`; a Java "
                "slave, stopped: `trioha slave --store-dir <its store> --truncate-to 1500`) or "
                "re-seed it",
                diverged_at=1500,
                kind=CloseKind.DIVERGED,
            ),
        ),
        (
            LogView(0, 2500, SEG),
            5000,
            Close(
                "slave requests offset 5000 but the master's log ends at 2500: the slave holds "
                "data this master does not (diverged history or a wrong master). Cut the slave "
                "back to 2500 (a trioha slave: `trioha slave --truncate-to-master`; a Java "
                "slave, stopped: `trioha slave --store-dir <its store> --truncate-to 2500`) or "
                "re-seed it",
                diverged_at=2500,
                kind=CloseKind.DIVERGED,
            ),
        ),
        (
            # Ahead of a master whose latest history begins past a lost (or promotion) range:
            # nothing this master sent lies past its end, so the histories part there at the
            # latest, not at the end (a cut to the end would keep the slave's own bytes).
            LogView(0, 9000, SEG, lost=((1500, 2000), (5000, 8191))),
            9500,
            Close(
                "slave requests offset 9500 but the master's log ends at 9000: the slave holds "
                "data this master does not (diverged history or a wrong master) (from 5000, "
                "where its latest history begins). Cut the slave back to 5000 (a trioha slave: "
                "`trioha slave --truncate-to-master`; a Java slave, stopped: `trioha slave "
                "--store-dir <its store> --truncate-to 5000`) or re-seed it",
                diverged_at=5000,
                kind=CloseKind.DIVERGED,
            ),
        ),
        (
            LogView(1000, 2500, SEG),
            500,
            Close(
                "slave requests offset 500, which no longer exists on the master (oldest "
                "offset 1000); the slave cannot catch up and must be re-seeded (RocketMQ #3388)",
                oldest=1000,
                kind=CloseKind.DELETED,
            ),
        ),
    ]
    for log, report, close in cases:
        state, actions = master_step(MasterState(), ReportReceived(report, log), OPTIONS)
        assert state == MasterState(phase=MasterPhase.CLOSED) and actions == (close,)


# --- epoch mode: where a report of 0 is served from -----------------------------------------


def epoch_start_of_first_frame(log: LogView, *, last_file: bool) -> int:
    conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True, batch_size=100))
    data = SlaveHandshake(sync_from_last_file=last_file).to_bytes() + encode_epoch_report(0)
    assert not any(isinstance(a, Close) for a in conn.receive_data(data, now=0.0, log=log))
    frame = conn.next_send(now=0.0, log=log)
    assert isinstance(frame, SendTransfer)
    return frame.offset


def test_an_epoch_slave_reporting_zero_gets_a_full_copy_unless_it_asks_for_the_last_file() -> None:
    # AutoSwitchHAConnection: a full copy from the oldest offset is 5.x's default; a slave's
    # handshake with isSyncFromLastFile asks for the start of the master's last segment.
    log = LogView(500, 2500, SEG, epochs=entries_of([(1, 0), (2, 1200)]))
    assert epoch_start_of_first_frame(log, last_file=False) == 500
    assert epoch_start_of_first_frame(log, last_file=True) == 2000
    small = LogView(0, 700, SEG, epochs=entries_of([(1, 0)]))
    assert epoch_start_of_first_frame(small, last_file=True) == 0
    assert epoch_start_of_first_frame(small, last_file=False) == 0


def test_a_master_with_no_epoch_at_all_refuses_a_request_and_says_so() -> None:
    conn = MasterConnection(now=0.0, options=MasterOptions(epoch_mode=True))
    log = LogView(0, 100, SEG, epochs=EpochHistory())
    data = SlaveHandshake().to_bytes() + encode_epoch_report(40)
    actions = conn.receive_data(data, now=0.0, log=log)
    assert actions[-1] == Close(
        "slave requests offset 40, which no epoch of the master holds (its first epoch: none)",
        kind=CloseKind.PROTOCOL_ERROR,
    )


def test_an_epoch_mode_master_without_a_history_names_what_is_missing() -> None:
    state = MasterState(phase=MasterPhase.HANDSHAKE)
    event = HandshakeReceived(LogView(0, 100, SEG))
    with pytest.raises(
        LocalProtocolError,
        match=exactly("epoch mode needs the master's epoch history in its LogView"),
    ):
        master_step(state, event, MasterOptions(epoch_mode=True))


def test_a_second_handshake_while_transferring_closes_and_says_why() -> None:
    state = streaming(LogView(0, 2900, SEG), 2000)
    closed, actions = master_step(state, HandshakeReceived(LogView(0, 2900, SEG)), OPTIONS)
    assert closed == attrs.evolve(state, phase=MasterPhase.CLOSED, write_pending=False)
    assert actions == (
        Close(
            "slave sent a handshake on a connection already transferring",
            kind=CloseKind.PROTOCOL_ERROR,
        ),
    )


# --- the slave side ------------------------------------------------------------------------


def transferring(expected: int, history: list[tuple[int, int]] | None = None) -> SlaveState:
    epochs = None if history is None else entries_of(history)
    return SlaveState(
        phase=SlavePhase.TRANSFER, expected=expected, reported=expected, epochs=epochs
    )


def test_every_slave_close_keeps_where_the_log_ends() -> None:
    # The next connection starts from the log's end; a close never forgets or moves it.
    state = transferring(1500)
    gone = SlaveState(phase=SlavePhase.DISCONNECTED, expected=1500)
    assert slave_step(state, ConnectionLost()) == (gone, ())
    assert slave_step(state, ReadIdle()) == (
        gone,
        (
            Close(
                "nothing read from the master within the housekeeping interval",
                kind=CloseKind.TIMEOUT,
            ),
        ),
    )
    assert slave_step(state, HeaderReceived(1600, 3)) == (
        gone,
        (
            Close(
                "master pushed offset 1600 but the slave's log ends at 1500; nothing appended",
                diverged_at=1600,
                kind=CloseKind.DIVERGED,
            ),
        ),
    )


HISTORY5 = [(1, 0), (2, 10), (3, 20), (4, 30), (5, 40)]


@pytest.mark.parametrize(
    ("local", "masters", "shown"),
    [
        # The newest four epochs of a longer history, and where the master's begins.
        (
            HISTORY5,
            [(9, 5)],
            "... 2-10 3-20 4-30 5-40 (log end 50) share no epoch with the master's 9-5",
        ),
        (
            HISTORY5[1:],
            [(9, 5)],
            "2-10 3-20 4-30 5-40 (log end 50) share no epoch with the master's 9-5",
        ),
        (
            HISTORY5[1:],
            [],
            "2-10 3-20 4-30 5-40 (log end 50) share no epoch with the master's (none)",
        ),
    ],
)
def test_no_consistent_point_shows_both_histories(
    local: list[tuple[int, int]], masters: list[tuple[int, int]], shown: str
) -> None:
    state = SlaveState(phase=SlavePhase.HANDSHAKE, expected=50, epochs=entries_of(local))
    new, actions = slave_step(state, MasterHandshakeReceived(60, entries_of(masters)))
    assert new == SlaveState(phase=SlavePhase.DISCONNECTED, expected=50)
    assert actions == (
        Close(
            f"no consistent point: the slave's epochs {shown} (log end 60); the slave must be "
            "re-seeded",
            diverged_at=0,
            kind=CloseKind.DIVERGED,
        ),
    )


def test_a_log_without_epoch_history_is_refused_with_what_to_do() -> None:
    state = SlaveState(phase=SlavePhase.HANDSHAKE, expected=10, epochs=EpochHistory())
    new, actions = slave_step(state, MasterHandshakeReceived(20, entries_of([(1, 0)])))
    assert new == SlaveState(phase=SlavePhase.DISCONNECTED, expected=10)
    assert actions == (
        Close(
            "the slave's log ends at 10 but it has no epoch history, so nothing proves its "
            "bytes are the master's; re-seed it (or truncate it) before it replicates in "
            "epoch mode",
            diverged_at=0,
            kind=CloseKind.DIVERGED,
        ),
    )


@pytest.mark.parametrize(
    ("expected", "history", "header", "diverged_at", "reason"),
    [
        (
            120,
            [(1, 0), (2, 100)],
            (120, 2, 110),
            100,
            "but the slave's epoch 2-100 starts elsewhere: the histories differ",
        ),
        (
            220,
            [(1, 0), (2, 100), (3, 200)],
            (220, 2, 100),
            100,
            "older than the slave's last epoch 3-200",
        ),
        (100, [(1, 0), (2, 100)], (100, 3, 100), 100, "not after the slave's last epoch 2-100"),
        (30, [(1, 0)], (30, 2, 20), 20, "but the slave's log already ends at 30 in epoch 1-0"),
        (0, [], (0, 1, 10), 0, "but the slave's log already ends at 0 in epoch (none)"),
    ],
)
def test_a_frame_contradicting_the_history_names_both_epochs(
    expected: int,
    history: list[tuple[int, int]],
    header: tuple[int, int, int],
    diverged_at: int,
    reason: str,
) -> None:
    offset, epoch, start = header
    state = transferring(expected, history)
    new, actions = slave_step(state, HeaderReceived(offset, 4, epoch, start))
    assert new == SlaveState(phase=SlavePhase.DISCONNECTED, expected=expected)
    where = f"master's frame at {offset} is in epoch {epoch} from {start}"
    assert actions == (
        Close(f"{where}, {reason}", diverged_at=diverged_at, kind=CloseKind.DIVERGED),
    )


# --- errors only a bug in the IO layer can cause: the message names the misuse ----------------


def test_misuse_of_the_core_is_named_exactly() -> None:
    state = streaming(LogView(0, 2900, SEG), 2000)
    with pytest.raises(
        LocalProtocolError, match=exactly("asked what to send while a frame is still being written")
    ):
        master_step(state, SendReady(LogView(0, 2900, SEG)), OPTIONS)
    idle = attrs.evolve(state, write_pending=False)
    with pytest.raises(
        LocalProtocolError, match=exactly("a frame was reported written but none was handed out")
    ):
        master_step(idle, FrameWritten(), OPTIONS)
    with pytest.raises(
        LocalProtocolError, match=exactly("a body was fed with no header before it")
    ):
        slave_step(transferring(10), BodyReceived())
    receiving = attrs.evolve(transferring(10), receiving=(10, 4))
    with pytest.raises(
        LocalProtocolError, match=exactly("a header was fed while a body was still expected")
    ):
        slave_step(receiving, HeaderReceived(14, 4))


def test_a_rule_reaching_an_undeclared_phase_names_side_event_and_phases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = (MasterPhase.AWAIT_REPORT, ReportReceived)
    monkeypatch.setitem(
        MASTER_TABLE, key, attrs.evolve(MASTER_TABLE[key], targets=(MasterPhase.CLOSED,))
    )
    with pytest.raises(
        AssertionError,
        match=exactly(
            "master rule for ReportReceived in AWAIT_REPORT led to TRANSFER, but the table "
            "declares only CLOSED"
        ),
    ):
        master_step(MasterState(), ReportReceived(0, LogView(0, 10, SEG)), OPTIONS)
    key2 = (SlavePhase.TRANSFER, HeaderReceived)
    targets = (SlavePhase.HANDSHAKE, SlavePhase.DISCONNECTED)
    monkeypatch.setitem(SLAVE_TABLE, key2, attrs.evolve(SLAVE_TABLE[key2], targets=targets))
    with pytest.raises(
        AssertionError,
        match=exactly(
            "slave rule for HeaderReceived in TRANSFER led to TRANSFER, but the table declares "
            "only HANDSHAKE, DISCONNECTED"
        ),
    ):
        slave_step(transferring(5), HeaderReceived(5, 3))


# --- the drawing -----------------------------------------------------------------------------


EDGE = re.compile(r"        (master|slave)_(\w+) --> \1_(\w+): (\w+)")


def test_the_drawing_has_every_allowed_transition_and_nothing_else() -> None:
    text = transition_table_mermaid()
    assert text.endswith("}\n") and not text.endswith("\n\n")
    lines = text.split("\n")[:-1]
    assert lines[0] == "stateDiagram-v2"
    drawn: dict[str, set[tuple[str, str, str]]] = {}
    side = None
    for line in lines[1:]:
        if opening := re.fullmatch(r"    state (master|slave) \{", line):
            assert side is None
            side = opening.group(1)
            drawn[side] = set()
        elif line == "    }":
            side = None
        else:
            edge = EDGE.fullmatch(line)
            assert edge is not None and edge.group(1) == side, line
            drawn[side].add((edge.group(2), edge.group(4), edge.group(3)))
    assert side is None
    for title, table in (("master", MASTER_TABLE), ("slave", SLAVE_TABLE)):
        allowed = {
            (phase.value, event.__name__, target.value)
            for (phase, event), rule in table.items()
            for target in rule.targets
        }
        assert drawn[title] == allowed


def test_an_epoch_mode_heartbeat_carries_the_epoch_and_its_start() -> None:
    # AutoSwitchHAConnection's transfer header: even an empty one names the epoch it is in.
    log = LogView(0, 100, SEG, epochs=entries_of([(1, 0), (2, 50)]))
    options = MasterOptions(epoch_mode=True)
    state, _ = master_step(MasterState(), ReportReceived(100, log), options)
    state, actions = master_step(state, SendReady(log, heartbeat_due=True), options)
    assert actions == (SendHeartbeat(100, 2, 50),) and state.write_pending


def test_timings_configured_in_milliseconds_become_seconds() -> None:
    # MessageStoreConfig's haSendHeartbeatInterval and haHousekeepingInterval are in ms.
    assert Timing.from_millis(2500, 7000) == Timing(heartbeat=2.5, housekeeping=7.0)
