"""What must hold in every reachable world, what must be reached, and what must stay possible.

Each property names the RocketMQ behaviour, code or issue it protects (docs/model.md has the
table). State invariants are functions of one :class:`World`; transition invariants are checked
while a step is applied (``model._checks``) and reported with the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from model._engine import Edge, Goal, Invariant, Probe
from model._steps import HAModel
from model._values import Config, Step, World, caught_up, divergence, full_copy, serving
from trioha.proto import MasterPhase, SlavePhase, find_consistent_point

# --- state invariants -------------------------------------------------------------------------


def no_divergence(w: World) -> str | None:
    """Where both logs hold an offset, they hold the same byte (RocketMQ #323).

    Epoch mode (the master keeps an epoch history): a slave that is not streaming may still
    hold bytes of an epoch the master has since lost; it cuts them at its next handshake,
    before it reports. What it keeps, everything below its consistent point with the master's
    current history, must be the master's.
    """
    limit = None
    if w.mepochs and w.slave.phase is not SlavePhase.TRANSFER and w.slog:
        mine = w.sepochs.truncate_suffix(w.send)
        limit = max(0, find_consistent_point(mine, w.send, w.mepochs, w.mmax)) if mine else 0
    offset = divergence(w)
    if offset is None or (limit is not None and offset >= limit):
        return None
    return (
        f"master and slave disagree at offset {offset}: master has message "
        f"{w.mlog[offset]}, slave has message {w.slog[offset - w.sbase]}"
    )


def slave_is_prefix_of_master(w: World) -> str | None:
    """While the slave streams from the master, its log is a prefix of the master's current log.

    Checked whenever the slave's core is in TRANSFER (after any handshake and truncation):
    it holds nothing beyond the master's end and nothing different below it (only the
    master's stored part, ``[mmin, mmax)``, can be compared). NoDivergence compares what both
    hold; this also refuses a slave that holds more than the master (a spliced future).
    """
    if w.slave.phase is not SlavePhase.TRANSFER or not w.slog:
        return None
    if w.send > w.mmax:
        return (
            f"the slave streams with its log ending at {w.send}, beyond the master's end "
            f"{w.mmax}: it holds bytes the master does not"
        )
    offset = divergence(w)
    if offset is not None:
        return f"the slave streams but its byte at {offset} is not the master's"
    return None


def sync_acked_on_slave(w: World) -> str | None:
    """A sync put answered PUT_OK is held by the slave (what SYNC_MASTER promises)."""
    for start, end, mid in w.acked:
        held = w.slog[start - w.sbase : end - w.sbase] if w.slog and w.sbase <= start else ()
        if end > w.send or any(b != mid for b in held) or not held:
            return (
                f"message {mid} at [{start}, {end}) was answered PUT_OK but the slave's log "
                f"is [{w.sbase}, {w.send}) and does not hold it"
            )
    return None


def sync_acked_on_master(w: World) -> str | None:
    """A sync put answered PUT_OK is still on the master (unless retention deleted it)."""
    for start, end, mid in w.acked:
        if start < w.mmin:
            continue
        if end > w.mmax or any(b != mid for b in w.mlog[start:end]):
            return (
                f"message {mid} at [{start}, {end}) was answered PUT_OK but the master "
                f"lost it (its log now ends at {w.mmax})"
            )
    return None


def ack_not_ahead(w: World) -> str | None:
    """The master never believes a slave holds more than that slave held on the connection.

    RocketMQ #3015/#1155: a report beyond what the slave holds must never count as an ack.
    What the master trusts of a connection is ``[served_from, ack_offset)``, the bytes it
    carried and had acked (``trioha.proto.vouch``); a first report vouches for nothing.
    """
    for i, conn in enumerate(w.conns):
        truth = w.send if conn.attached else conn.truth
        ack = conn.master.ack_offset
        if ack >= 0 and ack > conn.master.served_from and ack > truth:
            who = "its slave holds" if conn.attached else "its slave held on it"
            return f"master c{i} trusts an ack of {ack} but {who} only up to {truth}"
    return None


def well_formed(w: World) -> str | None:
    """Type and bounds sanity: flushed <= written, one attached connection, cores agree."""
    if not 0 <= w.mflushed <= w.mmax or not 0 <= w.mmin <= w.mmax:
        return f"master bounds broken: min {w.mmin} flushed {w.mflushed} max {w.mmax}"
    if w.slog and not w.sbase <= w.sflushed <= w.send:
        return f"slave bounds broken: base {w.sbase} flushed {w.sflushed} end {w.send}"
    if not w.slog and (w.sbase or w.sflushed):
        return "an empty slave log has a base or a flushed end"
    attached = [i for i, c in enumerate(w.conns) if c.attached]
    if len(attached) > 1:
        return f"the slave is on {len(attached)} connections at once"
    in_transfer = w.slave.phase is SlavePhase.TRANSFER
    if bool(attached) != (w.slave.phase is not SlavePhase.DISCONNECTED):
        return f"slave core is {w.slave.phase.value} but attached to {len(attached)} connections"
    if in_transfer and w.slave.expected != w.send:
        return f"slave core expects {w.slave.expected} but its log ends at {w.send}"
    if in_transfer and w.slave.reported > w.send:
        return f"slave reported {w.slave.reported} beyond its log end {w.send}"
    for i, conn in enumerate(w.conns):
        m = conn.master
        if m.phase is MasterPhase.CLOSED:
            return f"master c{i} is CLOSED but still registered"
        if m.phase is MasterPhase.TRANSFER and not m.ack_offset <= m.next_transfer:
            return f"master c{i} acked {m.ack_offset} beyond what it sent ({m.next_transfer})"
        if m.write_pending:
            return f"master c{i} has a frame handed out but not written between steps"
    return None


# --- classic-mode divergence check (Config.classic_refusal) ------------------------------------


def no_silent_reattach(w: World) -> str | None:
    """A slave being served holds a prefix of the master's log (no splice, ever).

    The trace the classic refusal exists to rule out: a master loses bytes it had sent, and a
    slave holding them is served again, its old bytes followed by the new history.
    """
    i = w.attached()
    if i < 0 or w.conns[i].master.phase is not MasterPhase.TRANSFER or not w.slog:
        return None
    held = w.mlog[w.sbase : w.send]
    if w.send > w.mmax or held != w.slog:
        return (
            f"master c{i} serves the slave, whose log [{w.sbase}, {w.send}) is not the "
            f"master's (which ends at {w.mmax}): the slave was silently re-attached to a "
            "history that differs from its own"
        )
    return None


def no_message_divergence(w: World) -> str | None:
    """NoDivergence, except where the master holds END_OF_FILE padding over a lost range.

    With the classic refusal the slave may still hold bytes the master lost (nothing can
    undo a crash); what must never happen is a *message* of the new history at an offset the
    slave holds with another byte.
    """
    if not w.slog:
        return None
    for offset in range(max(w.mmin, w.sbase), min(w.mmax, w.send)):
        mine, theirs = w.mlog[offset], w.slog[offset - w.sbase]
        if mine not in (theirs, 0):
            return (
                f"master and slave disagree at offset {offset}: master has message {mine}, "
                f"slave has message {theirs}"
            )
    return None


STATE_INVARIANTS: tuple[Invariant[World], ...] = (
    Invariant("NoDivergence", no_divergence, "both logs agree where both hold an offset"),
    Invariant(
        "NoSilentReattach", no_silent_reattach, "a served slave holds a prefix of the master"
    ),
    Invariant(
        "SlaveIsPrefixOfMaster",
        slave_is_prefix_of_master,
        "a streaming slave's log is a prefix of the master's current log",
    ),
    Invariant("SyncAckedOnSlave", sync_acked_on_slave, "a PUT_OK sync put is on the slave"),
    Invariant("SyncAckedOnMaster", sync_acked_on_master, "a PUT_OK sync put is on the master"),
    Invariant("AckNotAhead", ack_not_ahead, "the master never trusts more than the slave held"),
    Invariant("WellFormed", well_formed, "bounds and cross-component sanity"),
)

#: Checked while a step is applied; see ``model._checks``.
TRANSITION_INVARIANTS: tuple[tuple[str, str], ...] = (
    ("FramesContiguous", "frames on a connection continue exactly from the slave's request"),
    ("FrameWithinLog", "a frame lies in one segment of the master's stored log, <= batch size"),
    ("RequestOffsetOnce", "the request offset is taken once; the transfer never rewinds"),
    ("ReportsMonotonePerConnection", "reports sent and acks accepted never go backwards"),
    ("AppendAtEnd", "the slave appends only at the end of its log"),
    ("FramingIntact", "the slave's receive buffer stays aligned with frame boundaries"),
    ("NoFrameRejected", "the slave's offset check never fires: the master resumes exactly"),
    ("HeartbeatsKeepLinkOpen", "housekeeping never closes a healthy, idle link"),
    ("NoLocalProtocolError", "the core never rejects an event the IO layer feeds it"),
    ("TruncateAligned", "epoch mode cuts the slave's log only at a message boundary"),
    # --- second round ---
    (
        "HonestReportsAccepted",
        "the master never closes its slave's connection over a report the slave itself sent",
    ),
    (
        "HonestSlaveAvailable",
        "a sync put is never SLAVE_NOT_AVAILABLE while the streaming slave is within "
        "fallbehind_max",
    ),
    (
        "OneConnectionWhenHealthy",
        "with no fault injected, the slave's connection never ends: a healthy catch-up uses one",
    ),
)

# --- probes -----------------------------------------------------------------------------------


@attrs.frozen
class ProbeSpec:
    """A probe and the configurations that must reach it."""

    name: str
    doc: str
    needed: Callable[[Config], bool]
    #: A predicate on states (else a mark a transition sets).
    state: bool = False


def _always(c: Config) -> bool:
    return True


PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("caught_up_with_data", "the slave holds data and caught up", _always, state=True),
    ProbeSpec("sync_acked", "a sync put answered PUT_OK", lambda c: c.sync_puts),
    ProbeSpec("sync_timeout", "a sync put answered FLUSH_SLAVE_TIMEOUT", lambda c: c.sync_puts),
    ProbeSpec("heartbeat_received", "the slave received a heartbeat frame", lambda c: c.time),
    ProbeSpec(
        "reports_coalesced",
        "one read took several reports, the newest counted",
        lambda c: not c.epoch_mode,
    ),
    ProbeSpec(
        "sync_acked_after_drop",
        "a sync put was answered PUT_OK after a connection drop",
        lambda c: c.sync_puts and c.faults.drops > 0,
    ),
    ProbeSpec(
        "drop_mid_frame",
        "a drop cut a frame between its header and its body",
        lambda c: c.faults.drops > 0,
    ),
    ProbeSpec(
        "caught_up_after_restart",
        "the slave holds data and caught up after a restart",
        lambda c: c.faults.restarts > 0,
        True,
    ),
    ProbeSpec(
        "restart_lost_unflushed",
        "a slave restart lost written, unflushed bytes",
        lambda c: c.faults.restarts > 0,
    ),
    ProbeSpec(
        "restart_cut_mid_message",
        "a slave restart cut its log inside a message",
        lambda c: c.faults.restarts > 0 and c.message_size > 1,
    ),
    ProbeSpec(
        "late_report_on_stale_connection",
        "a report arrived on a connection whose slave had gone",
        lambda c: c.faults.stale > 0,
    ),
    ProbeSpec(
        "master_closed:ack_beyond_sent",
        "an ack beyond what was sent was refused",
        lambda c: c.faults.bogus > 0 and not c.rogue_reports_end,
    ),
    ProbeSpec(
        "master_closed:request_beyond_end",
        "a first report beyond the master's end was refused",
        lambda c: c.faults.bogus > 0 and not c.rogue_reports_end,
    ),
    ProbeSpec(
        "master_closed:housekeeping",
        "housekeeping closed a connection",
        lambda c: c.faults.housekeeping > 0,
    ),
    ProbeSpec(
        "stale_connection_reaped",
        "time reaped a stale connection",
        lambda c: c.time and c.faults.stale > 0,
    ),
    ProbeSpec(
        "master_lost_unflushed",
        "a master crash lost unflushed bytes",
        lambda c: c.faults.crashes > 0 and not c.master_sync_flush,
    ),
    ProbeSpec(
        "master_lost_sent",
        "a master crash lost bytes it had sent (classic refusal)",
        lambda c: c.classic_refusal and c.faults.crashes > 0 and not c.master_sync_flush,
    ),
    ProbeSpec(
        "slave_refused",
        "a slave holding a lost history was refused (classic refusal)",
        lambda c: c.classic_refusal and c.faults.crashes > 0 and not c.master_sync_flush,
    ),
    ProbeSpec(
        "slave_refused_holding_master_bytes",
        "a slave cut off while receiving the padding was refused though it held the master's "
        "bytes (the false alarm docs/replication.md describes)",
        lambda c: c.classic_refusal and c.faults.drops > 0 and not c.master_sync_flush,
    ),
    ProbeSpec(
        "slave_truncated_to_master",
        "the operator cut a refused slave back, and it went on (classic refusal)",
        lambda c: c.classic_refusal and c.faults.crashes > 0 and not c.master_sync_flush,
    ),
    ProbeSpec(
        "master_lost_records",
        "a master crash lost records it may have sent",
        lambda c: c.faults.tail_losses > 0,
    ),
    ProbeSpec(
        "slave_truncated",
        "epoch mode: the slave cut its log back to the consistent point",
        lambda c: (
            c.epoch_mode
            and (c.faults.tail_losses > 0 or (c.faults.crashes > 0 and not c.master_sync_flush))
        ),
    ),
    ProbeSpec(
        "master_closed:report_backwards",
        "a report below the accepted ack was refused",
        lambda c: c.faults.bogus > 0 and c.bogus_anywhere,
    ),
    ProbeSpec(
        "refused_at_fallbehind_max",
        "a sync put was refused with the slave exactly fallbehind_max behind",
        lambda c: c.sync_puts and c.fallbehind_edge,
    ),
    ProbeSpec(
        "available_just_inside_fallbehind_max",
        "a sync put could wait with the slave one byte less than fallbehind_max behind",
        lambda c: c.sync_puts and c.fallbehind_edge,
    ),
    ProbeSpec(
        "frame_cut_at_segment_end",
        "a frame shorter than the batch ended at a segment end",
        lambda c: c.odd_frames,
    ),
    ProbeSpec(
        "frame_ends_mid_message",
        "a frame ended inside a message",
        lambda c: c.odd_frames,
    ),
    ProbeSpec(
        "master_closed:deleted_offset",
        "a slave's offset had been deleted on the master (#3388)",
        lambda c: c.faults.deletions > 0,
    ),
    ProbeSpec(
        "slave_fell_behind",
        "the slave was told its next bytes were deleted on the master, and stopped",
        lambda c: c.faults.deletions > 0,
    ),
)


def _state_probe(name: str, config: Config) -> Probe[World]:
    if name == "caught_up_with_data":
        return Probe(name, lambda w: bool(w.slog) and caught_up(w, config))
    if name == "caught_up_after_restart":
        restarts = config.faults.restarts
        return Probe(
            name,
            lambda w: w.budget.restarts < restarts and bool(w.slog) and caught_up(w, config),
        )
    raise KeyError(name)


def required_probes(config: Config) -> list[ProbeSpec]:
    return [p for p in PROBES if p.needed(config)]


# --- the spec the engine explores -------------------------------------------------------------


class HASpec:
    """Adapts :class:`HAModel` and the properties above to :mod:`model._engine`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.model = HAModel(config)

    def initial_states(self) -> Sequence[World]:
        return (self.model.initial(),)

    def successors(self, state: World) -> Iterable[Edge[World, Step]]:
        for step, out in self.model.successors(state):
            yield Edge(step, out.world, step.fault, out.violations, out.marks)

    def invariants(self) -> Sequence[Invariant[World]]:
        if self.config.classic_refusal:
            # The loss itself cannot be undone (see above), and a classic slave streams from
            # the moment it connects: the master learns where it stands only from its first
            # report, and refuses it then. So the slave-side SlaveIsPrefixOfMaster cannot hold
            # in classic mode; its master-side form, NoSilentReattach, is what is promised.
            return tuple(
                Invariant(
                    "NoMessageDivergence",
                    no_message_divergence,
                    "no new message at an offset the slave holds otherwise",
                )
                if i.name == "NoDivergence"
                else i
                for i in STATE_INVARIANTS
                if i.name != "SlaveIsPrefixOfMaster"
            )
        return STATE_INVARIANTS

    def transition_invariants(self) -> Sequence[str]:
        return tuple(name for name, _ in TRANSITION_INVARIANTS)

    def probes(self) -> Sequence[Probe[World]]:
        out: list[Probe[World]] = []
        for spec in required_probes(self.config):
            out.append(_state_probe(spec.name, self.config) if spec.state else Probe(spec.name))
        return out

    def goals(self) -> Sequence[Goal[World]]:
        config = self.config
        goals: list[Goal[World]] = [
            Goal(
                "EventuallyCaughtUp",
                lambda w: caught_up(w, config),
                "the slave can always catch up without further faults",
            )
        ]
        if config.honest_goal:
            goals.append(
                Goal(
                    "HonestSlaveNeverRefused",
                    serving,
                    "the master can always come to stream to the slave again without faults",
                )
            )
        if config.full_copy_goal:
            goals.append(
                Goal("EventuallyFullCopy", full_copy, "the slave can always get the whole log")
            )
        return goals
