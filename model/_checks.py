"""The checks a transition must pass, shared by the checker and the byte-level replay.

Each returns ``(property, message)`` pairs for what the transition broke; :mod:`model._steps`
runs them while applying a step, :mod:`model._replay` after feeding the same events to the
production objects with real bytes.
"""

from __future__ import annotations

from model._values import Conn
from trioha.proto import LogView, MasterPhase, MasterState


def check_master_transition(before: MasterState, after: MasterState) -> list[tuple[str, str]]:
    """RequestOffsetOnce and the master half of ReportsMonotonePerConnection."""
    out = []
    if before.request_offset >= 0 and after.request_offset != before.request_offset:
        out.append(
            (
                "RequestOffsetOnce",
                f"request offset changed from {before.request_offset} to {after.request_offset}"
                " on one connection",
            )
        )
    if (
        before.next_transfer >= 0
        and after.phase is not MasterPhase.CLOSED
        and after.next_transfer < before.next_transfer
    ):
        out.append(
            (
                "RequestOffsetOnce",
                f"the transfer position went back from {before.next_transfer} to "
                f"{after.next_transfer}: the master re-chose where to resume",
            )
        )
    if after.phase is not MasterPhase.CLOSED and after.ack_offset < before.ack_offset:
        out.append(
            (
                "ReportsMonotonePerConnection",
                f"the accepted ack went back from {before.ack_offset} to {after.ack_offset}",
            )
        )
    return out


def check_frame(
    conn: Conn, offset: int, size: int, log: LogView, batch: int
) -> list[tuple[str, str]]:
    """FramesContiguous and FrameWithinLog for a frame the master sends on *conn*."""
    out = []
    request = conn.master.request_offset
    if conn.sent_end >= 0:
        if offset != conn.sent_end:
            out.append(
                (
                    "FramesContiguous",
                    f"frame at {offset} after a frame ending at {conn.sent_end}",
                )
            )
    elif request > 0 and offset != request:
        out.append(
            (
                "FramesContiguous",
                f"first frame at {offset} but the slave asked for {request}",
            )
        )
    elif request == 0 and (offset % log.segment_size or offset < log.min_offset):
        out.append(
            (
                "FramesContiguous",
                f"first frame for an empty slave at {offset}, not at a segment start >= "
                f"{log.min_offset}",
            )
        )
    if size:
        end = offset + size
        if (
            offset < log.min_offset
            or end > log.max_offset
            or size > batch
            or log.segment_start(offset) != log.segment_start(end - 1)
        ):
            out.append(
                (
                    "FrameWithinLog",
                    f"frame [{offset}, {end}) is not within one segment of the master's log "
                    f"[{log.min_offset}, {log.max_offset}) or exceeds the batch size {batch}",
                )
            )
    elif offset > log.max_offset:
        out.append(("FrameWithinLog", f"heartbeat at {offset}, beyond the log end"))
    return out


def check_report(conn: Conn, offset: int) -> list[tuple[str, str]]:
    """The slave half of ReportsMonotonePerConnection."""
    if offset < conn.last_report:
        return [
            (
                "ReportsMonotonePerConnection",
                f"slave reported {offset} after {conn.last_report} on one connection",
            )
        ]
    return []
