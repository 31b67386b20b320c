"""One slave connection on the master: a reader task and a writer task in one nursery.

Mirrors ``HAConnection`` with its ``ReadSocketService`` and ``WriteSocketService``
(docs/rocketmq-protocol.md §2.2). The two tasks share nothing but the sans-IO
:class:`~trioha.proto.MasterConnection`; either one ending or failing cancels the other, and the
owner (``HAService``) removes the connection from its registry in a ``finally``, so a connection can
never leak (RocketMQ #8875).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Protocol, assert_never

import attrs
import trio

from trioha.net._marks import MarkKeeper
from trioha.net._sendparts import send_parts
from trioha.net._wakeup import Wakeup
from trioha.proto import (
    AckAdvanced,
    Close,
    CloseKind,
    LogView,
    MasterConnection,
    MasterOptions,
    MasterPhase,
    SendHeartbeat,
    SendMasterHandshake,
    SendTransfer,
    Timing,
    frame_header,
)

if TYPE_CHECKING:
    from trioha.store import CommitLog, EpochFile, SentOffsets

log = logging.getLogger("trioha.ha")

#: Bytes asked of the transport per read. Reports are 8 bytes; a burst is coalesced anyway.
READ_SIZE = 64 * 1024
#: Consecutive frames are sent in one write of up to about this many bytes. Every ``send_all``
#: costs a couple of passes through Trio's scheduler; one per 32 KiB frame capped a catch-up
#: at a few hundred MiB/s with the master mostly waiting (docs/performance.md).
WRITE_BATCH = 1024 * 1024


class AckListener(Protocol):
    def on_ack(self, connection: HAConnection, offset: int) -> None: ...


def log_view(
    commitlog: CommitLog, sent: SentOffsets | None = None, epoch_file: EpochFile | None = None
) -> LogView:
    """The log as the core sees it: with *sent* the ranges a classic master lost, with
    *epoch_file* (epoch mode) its epoch history."""
    return LogView(
        commitlog.min_offset,
        commitlog.max_offset,
        commitlog.segment_size,
        lost=sent.lost if sent is not None else (),
        epochs=None if epoch_file is None else epoch_file.history,
    )


class HAConnection:
    """The master's side of one slave connection."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        commitlog: CommitLog,
        listener: AckListener,
        options: MasterOptions,
        timing: Timing,
        peer: str,
        sent: SentOffsets | None = None,
        epoch_file: EpochFile | None = None,
        marks: MarkKeeper | None = None,
    ) -> None:
        self.stream = stream
        self.commitlog = commitlog
        if marks is None and sent is not None:
            marks = MarkKeeper(sent)
        #: The durable marks, reserved before bytes go out (shared by the service's writers).
        self.marks = marks
        #: The durable "highest offset sent" mark (classic mode's divergence check), if kept.
        self.sent = marks.sent if marks is not None else None
        #: Epoch mode: the master's epoch history (None in classic mode).
        self.epoch_file = epoch_file
        #: Epoch mode: the handshake to send, put here by the reader for the writer.
        self.handshake_out: bytes | None = None
        self.listener = listener
        self.peer = peer
        #: The slave's host, what the master remembers it by (the port changes every time).
        self.peer_host = peer.rpartition(":")[0] or peer
        self.proto = MasterConnection(
            now=trio.current_time(), options=options, timing=timing, peer=peer
        )
        self.wakeup = Wakeup()
        self.close_reason: str | None = None
        #: The kind of the close, decided with ``close_reason`` (None while open, or when
        #: the service stopped it: a shutdown).
        self.close_kind: CloseKind | None = None
        self.bytes_sent = 0
        self.frames_sent = 0
        self.heartbeats_sent = 0
        self.refused = False
        self.connected_at = trio.current_time()

    @property
    def ack_offset(self) -> int:
        """The slave's accepted ack, or -1 before its first report."""
        return self.proto.state.ack_offset

    @property
    def transferring(self) -> bool:
        return self.proto.state.phase is MasterPhase.TRANSFER

    async def run(self) -> None:
        """Serve the slave until either task ends; ``close_reason`` says why."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._reader, nursery.cancel_scope)
                nursery.start_soon(self._writer, nursery.cancel_scope)
        finally:
            self.proto.connection_lost()

    def _end(self, kind: CloseKind, reason: str, scope: trio.CancelScope) -> None:
        if self.close_reason is None:
            self.close_reason, self.close_kind = reason, kind
        scope.cancel()

    async def _reader(self, scope: trio.CancelScope) -> None:
        try:
            # One scope for the housekeeping deadline, moved after every read: an ack costs
            # an attribute update rather than a new cancel scope.
            with trio.move_on_at(self.proto.read_deadline) as idle:
                while True:
                    data = await self.stream.receive_some(READ_SIZE)
                    if not data:
                        self._end(CloseKind.PEER_CLOSED, "slave closed the connection", scope)
                        return
                    awaiting = not self.transferring
                    actions = self.proto.receive_data(
                        data, now=trio.current_time(), log=self.view()
                    )
                    for action in actions:
                        match action:
                            case SendMasterHandshake():
                                self.handshake_out = self.proto.handshake_bytes(action)
                                self.wakeup.notify()
                            case AckAdvanced():
                                self.listener.on_ack(self, action.offset)
                            case Close():
                                if action.diverged_at is not None and self.epoch_file is None:
                                    await self._refuse(action.diverged_at, action.reason)
                                elif action.oldest is not None:
                                    await self._push_offset(action.oldest)
                                self._end(action.kind, action.reason, scope)
                                return
                            case SendTransfer() | SendHeartbeat():
                                # Frames are the writer's: the core hands them to next_send.
                                raise AssertionError(f"a frame to send from a read: {action}")
                            case _:
                                assert_never(action)
                    if awaiting and self.transferring:
                        self.wakeup.notify()  # the first report lets the writer start
                    idle.deadline = self.proto.read_deadline
            self._end(
                CloseKind.TIMEOUT,
                f"nothing read from the slave for {self.proto.timing.housekeeping:g} s "
                "(housekeeping)",
                scope,
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(
                CloseKind.BROKEN,
                f"connection broken while reading: {str(exc) or type(exc).__name__}",
                scope,
            )

    async def _refuse(self, diverged_at: int, reason: str) -> None:
        """Tell a diverged slave so in its own protocol, then let the connection close.

        The writer sends nothing before a first report, so the reader may write here. The
        header ``(diverged_at, 0)`` fails every slave's offset check (see ``proto.Close``).
        """
        self.refused = True
        log.error(
            "refusing slave %s: %s. Its log and this master's are not one history; it gets "
            "no data until the operator cuts it back or re-seeds it",
            self.peer,
            reason,
        )
        await self._push_offset(diverged_at)

    async def _push_offset(self, offset: int) -> None:
        """Send a heartbeat header at *offset*, for a refusal the slave's offset check turns
        into an error naming both offsets (``proto.Close``): where the histories part, or the
        master's oldest offset when what the slave needs was deleted (RocketMQ #3388).

        Only before the writer sends anything (the reader's refusals, taken on a first
        report) or from the writer itself, so that frames never interleave. In epoch mode the
        header carries the epoch holding *offset*; none does: nothing is sent.
        """
        if self.epoch_file is None:
            header = frame_header(SendHeartbeat(offset))
        else:
            found = self.epoch_file.history.find_by_offset(offset)
            if found is None:
                return
            entry = found[1]
            header = self.proto.header(
                SendHeartbeat(offset, entry.epoch, entry.start_offset),
                confirm_offset=self.commitlog.max_offset,
            )
        with trio.move_on_after(1.0):
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError
            ):
                await self.stream.send_all(header)

    def view(self) -> LogView:
        return log_view(self.commitlog, self.sent, self.epoch_file)

    async def _sendable_view(self) -> LogView:
        """The log as the writer may send it: up to the durable sent mark.

        What the next write can carry is reserved first (the durable mark before the bytes:
        a crash must never forget bytes a slave holds). While the mark cannot be written the
        view ends at it: the writer sends what it covers and heartbeats, and the reservation
        is tried again at the keeper's retry time. No checkpoint follows the returned view
        before the writer claims what it sends.
        """
        marks = self.marks
        view = self.view()
        if marks is None:
            return view
        start = self.proto.state.next_transfer
        if self.transferring:
            want = min(view.max_offset, start + WRITE_BATCH + self.proto.options.batch_size)
            if want > start and not marks.covers_sent(want):
                await marks.reserve_sent(want)
                view = self.view()
        # Never below where the next frame starts: what lies before it was sent (or the slave
        # has it), and the core must see its position inside the log.
        limit = max(marks.sent.reserved, start, view.min_offset)
        if view.max_offset > limit:
            view = attrs.evolve(view, max_offset=limit)
        return view

    async def _writer(self, scope: trio.CancelScope) -> None:
        try:
            while True:
                if self.handshake_out is not None:
                    handshake, self.handshake_out = self.handshake_out, None
                    await self.stream.send_all(handshake)
                    self.bytes_sent += len(handshake)
                    self.proto.last_write = trio.current_time()
                    continue
                view = await self._sendable_view()
                now = trio.current_time()
                match self.proto.next_send(now=now, log=view):
                    case Close() as close:
                        if close.oldest is not None:
                            await self._push_offset(close.oldest)
                        self._end(close.kind, close.reason, scope)
                        return
                    case None:
                        deadline = self.proto.heartbeat_deadline if self.transferring else math.inf
                        marks = self.marks
                        if marks is not None and marks.sending_paused:
                            deadline = min(deadline, marks.sent_retry_at)  # try the mark again
                        await self.wakeup.wait(deadline)
                        continue
                    case SendTransfer() | SendHeartbeat() as action:
                        pass
                    case unknown:
                        assert_never(unknown)
                # Gather consecutive frames into one write (the bytes on the wire are the same).
                # Nothing awaits until the write, so the log and the clock stand still meanwhile.
                parts: list[bytes | memoryview] = []
                pending = frames = heartbeats = 0
                upto = 0  # the end of the last body in this write
                while True:
                    header = self.proto.header(action, confirm_offset=view.max_offset)
                    parts.append(header)
                    pending += len(header)
                    if not isinstance(action, SendTransfer):
                        heartbeats += 1
                        break
                    body = self.commitlog.read(action.offset, action.size)
                    if len(body) != action.size:
                        # Never put a header on the wire that its body would contradict.
                        self._end(
                            CloseKind.INTERNAL_ERROR,
                            f"commit log returned {len(body)} bytes at {action.offset}, "
                            f"expected {action.size}",
                            scope,
                        )
                        return
                    parts.append(body)
                    pending += action.size
                    upto = action.offset + action.size
                    frames += 1
                    if pending >= WRITE_BATCH or action.offset + action.size >= view.max_offset:
                        break
                    self.proto.frame_written(now=now)
                    following = self.proto.next_send(now=now, log=view)
                    # Short of the log's end, with the view and the clock standing still, the
                    # core always has the next frame: nothing closed it, nothing is pending.
                    assert isinstance(following, SendTransfer), following
                    action = following
                sent = self.sent
                if sent is not None:
                    # Covered by the durable mark (the view stops there), and claimed before
                    # the send with no checkpoint since the view was taken.
                    sent.note_sent(upto)
                await send_parts(self.stream, parts)  # no join over plain TCP
                self.frames_sent += frames
                self.heartbeats_sent += heartbeats
                self.bytes_sent += pending
                self.proto.frame_written(now=trio.current_time())
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._end(
                CloseKind.BROKEN,
                f"connection broken while writing: {str(exc) or type(exc).__name__}",
                scope,
            )
