"""What a master checks when it starts: did it lose bytes it had sent or acknowledged, or
meet damage, and does its store continue another master's history?

Classic HA (RocketMQ 4.x) has no epochs: nothing on the wire says which history a slave's
bytes belong to. So the master keeps durable marks (``trioha.store._sent``): how far it may
have sent its log, how far it may have answered PUT_OK, and how far its log was surely
flushed. On start it compares them with the end its recovery found, in this order:

* **recovered end below the flushed mark**: recovery cut bytes that were on disk, so it met
  damage (a bad record in an old segment), not a power cut's lost tail. Serving as master
  would make new data take offsets slaves already hold. The broker refuses to start, naming
  the offsets and where recovery kept the cut bytes, unless the operator passes
  ``ha_accept_damaged_log`` (``--accept-damaged-log``);
* **recovered end below the acknowledged mark** (both modes): messages answered PUT_OK are
  gone here. When the sent mark says they had been sent, a slave may still hold them: the
  broker refuses to start as master (:class:`~trioha.LostAcknowledgedError`), naming the
  range, the slaves it served and what to do (promote the slave, start this broker as its
  slave), unless the operator passes ``ha_accept_lost_acknowledged``
  (``--accept-lost-acknowledged``). When no slave was sent them (an ASYNC_MASTER whose
  slave was away) nothing can bring them back: it starts and says at ERROR what was lost;
* **recovered end below the sent mark** (classic): bytes ``[end, mark)`` may be on slaves
  and are gone here. The range is recorded for good (a first report inside it is refused,
  see ``proto._state._master_first_report``), and the log is closed with RocketMQ's
  END_OF_FILE blank records up to the first segment boundary beyond the mark
  (:meth:`~trioha.store._logcore.LogCore.skip_past`), so that no record of the new history
  ever takes an offset of the lost one. Said at WARNING: the mark is reserved ahead, so the
  bytes may never have gone out; a slave that really holds them is refused at ERROR;
* **no marks, but a log** (classic): the store did not last run as a trioha master: a
  promoted slave (a slave removes the marks before it replicates), or a store another
  broker wrote. A former master or a sibling slave may hold bytes beyond its end that it
  never had, so it treats them as lost: the range from its end to the first segment
  boundary past half a segment beyond it is recorded and padded as above. Its own slaves
  reconnect normally: they report its end or less, or offsets past the padding.

docs/replication.md explains why this, rather than per-slave state, and what it can and
cannot detect.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trioha._errors import DamagedLogError, LostAcknowledgedError
from trioha.net._client import Divergence
from trioha.store import DEFAULT_RESERVE_STEP, SentOffsets

if TYPE_CHECKING:
    from trioha.store import CommitLog, Store

__all__ = [
    "check_master_history",
    "former_master_divergence",
    "open_master_history",
    "promotion_end",
]

log = logging.getLogger("trioha.ha")


def open_master_history(
    store: Store,
    *,
    accept_damaged: bool = False,
    accept_lost_acknowledged: bool = False,
    epoch_mode: bool = False,
) -> SentOffsets:
    """Check the recovered log against the marks (see the module docstring); blocking.

    Returns the marks for the HA service to keep up to date. Raises
    :class:`DamagedLogError` for a damaged log unless ``accept_damaged``, and
    :class:`LostAcknowledgedError` for acknowledged messages a slave may hold unless
    ``accept_lost_acknowledged``.

    In epoch mode the lost-range checks do not apply: the new epoch begins at the recovered
    end, and a slave holding lost bytes truncates to the consistent point that the epochs
    give, so new data must start exactly there (no end-of-file padding past the lost range,
    which would make the old epoch look longer than what this master still has).
    """
    commitlog = store.commitlog
    step = max(1, min(DEFAULT_RESERVE_STEP, commitlog.segment_size // 8))
    sent = SentOffsets.open(store.root, step=step)
    report = store.recovery
    kept = ", ".join(str(p) for p in report.kept_aside) or "nowhere (nothing was readable)"
    cut = (
        f"recovery of {store.root} ended there ({report.reason or 'a clean end'}) and kept "
        f"{report.cut_bytes} cut bytes in {kept}"
    )
    if report.earlier_aside:
        cut += (
            f"; bytes from {report.valid_end} on that an earlier start or cut took out of the "
            f"log are in {', '.join(str(p) for p in report.earlier_aside)}"
        )
    return check_master_history(
        commitlog,
        sent,
        accept_damaged=accept_damaged,
        accept_lost_acknowledged=accept_lost_acknowledged,
        recovery=cut,
        epoch_mode=epoch_mode,
        store_dir=str(store.root),
    )


def promotion_end(end: int, segment_size: int) -> int:
    """Where a promoted master's own history starts: the first segment boundary strictly
    beyond half a segment past its recovered ``end``."""
    return ((end + segment_size // 2) // segment_size + 1) * segment_size


def check_master_history(
    commitlog: CommitLog,
    sent: SentOffsets,
    *,
    accept_damaged: bool = False,
    accept_lost_acknowledged: bool = False,
    recovery: str = "recovery found no more",
    epoch_mode: bool = False,
    store_dir: str = "DIR",
) -> SentOffsets:
    """The checks of :func:`open_master_history` on any commit log; ``recovery`` says what
    recovery did (for the error), ``store_dir`` names the store in the commands the errors
    give. Returns ``sent``. A refusal changes nothing on disk."""
    end = commitlog.max_offset
    promoted = not sent.existed and end > 0  # no marks: it did not last run as a master
    if sent.flushed > end:
        what = (
            f"the commit log ends at {end}, below {sent.flushed}, which had been flushed: that "
            f"is damage, not a lost tail. Bytes [{end}, {sent.flushed}) are out of the log; "
            f"{recovery}"
        )
        if not accept_damaged:
            raise DamagedLogError(
                f"refusing to start as master: {what}. New data would take offsets that "
                "slaves hold with the old bytes. Repair or restore the store (or promote a "
                "slave); to start anyway, knowing slaves beyond "
                f"{end} will be refused, pass --accept-damaged-log (ha_accept_damaged_log)"
            )
        log.error("%s; starting as master anyway (ha_accept_damaged_log)", what)
        sent.cut_to(end)
    _check_acknowledged(
        sent,
        end,
        accept=accept_lost_acknowledged,
        epoch_mode=epoch_mode,
        store_dir=store_dir,
    )
    if epoch_mode:
        sent.restart_at(end)
        return sent
    new = _promoted(commitlog, sent, end) if promoted else _lost_sent(commitlog, sent, end)
    for lost_from, lost_to in sent.lost:
        if new != (lost_from, lost_to):
            log.info(
                "slaves reporting an offset in (%d, %d] are refused (lost in an earlier crash)",
                lost_from,
                lost_to,
            )
    if not sent.existed:  # from now on the file says that this store runs as a master
        sent.write_settled()
    return sent


def _check_acknowledged(
    sent: SentOffsets, end: int, *, accept: bool, epoch_mode: bool, store_dir: str
) -> None:
    """The acknowledged mark against the recovered ``end`` (see the module docstring)."""
    acked = sent.acked_reserved
    if acked <= end:
        return
    held = min(acked, sent.reserved)
    slack = (
        f"the mark is reserved up to {sent.step} bytes ahead of the last answer, so the loss "
        "may end earlier"
    )
    if held <= end:
        log.error(
            "this master answered PUT_OK for messages up to offset %d and its log now ends at "
            "%d: the acknowledged messages in [%d, %d) are lost (%s). It never sent them to a "
            "slave, so no copy of them exists; starting as master, new messages start at %d",
            acked,
            end,
            end,
            acked,
            slack,
            end,
        )
        sent.accept_acked(end)
        return
    holders = _holders(sent, end)
    host = holders[0][0] if holders else "<its host>"
    served = (
        "; ".join(f"slave {h}, which acknowledged at least up to {offset}" for h, offset in holders)
        or "this master recorded no slave host"
    )
    what = (
        f"this master answered PUT_OK for messages up to offset {acked}, and its log now ends "
        f"at {end}: the acknowledged bytes [{end}, {held}) are lost here, and it had sent them "
        f"to its slaves, which may still hold them ({served}; {slack})"
    )
    if not accept:
        raise LostAcknowledgedError(
            f"refusing to start as master: {what}. Promote the slave that holds them: stop it "
            "and start it as master (`trioha master --store-dir <its store>`), then start "
            f"this broker as its slave (`trioha slave --store-dir {store_dir} --master-ha "
            f"{host}:<its HA port>`), which copies them back. To start this broker as master "
            "anyway and discard them, pass --accept-lost-acknowledged "
            "(haAcceptLostAcknowledged)"
        )
    fate = (
        "slaves holding them cut their logs back to this master's history"
        if epoch_mode
        else "slaves holding them will be refused until cut back or re-seeded"
    )
    log.error("%s; starting as master anyway (haAcceptLostAcknowledged): %s", what, fate)
    sent.accept_acked(end)


def _holders(sent: SentOffsets, end: int) -> list[tuple[str, int]]:
    """The slaves recorded, those known to hold bytes past ``end`` first, most first."""
    return sorted(sent.slaves.items(), key=lambda item: (item[1] <= end, -item[1]))


def _lost_sent(commitlog: CommitLog, sent: SentOffsets, end: int) -> tuple[int, int] | None:
    """Classic mode: bytes this master may have sent past its recovered end; the new lost
    range, if any."""
    lost = sent.note_recovered_end(end)
    if lost is None:
        return None
    lost_from, lost_to = lost
    new_start = commitlog.skip_past(lost_to)
    commitlog.flush()
    log.warning(
        "this master may have sent bytes [%d, %d) to slaves before it stopped, and its log now "
        "ends at %d: those bytes are lost here (the mark is reserved ahead, so fewer may have "
        "gone out). A slave reporting an offset in (%d, %d] will be refused, with an ERROR "
        "naming it, until it is cut back to %d (`trioha slave --truncate-to-master`) or "
        "re-seeded; new messages start at %d, past the lost range, so that no slave is ever "
        "served a spliced log",
        lost_from,
        lost_to,
        end,
        lost_from,
        lost_to,
        lost_from,
        new_start,
    )
    return lost


def _promoted(commitlog: CommitLog, sent: SentOffsets, end: int) -> tuple[int, int]:
    """Classic mode: a store that did not last run as a trioha master starts as one; the
    range recorded as lost."""
    upto = promotion_end(end, commitlog.segment_size) - 1
    sent.note_promoted(end, upto)
    new_start = commitlog.skip_past(upto)
    commitlog.flush()
    log.warning(
        "this store holds data but did not last run as a trioha master (a promoted slave, or "
        "a store another broker wrote): a former master or another slave may hold bytes past "
        "its end %d that it never had. A broker reporting an offset in (%d, %d] is refused "
        "until it is cut back to %d (`trioha slave --truncate-to-master`) or re-seeded; this "
        "master's own messages start at %d, so that its slaves reconnect normally",
        end,
        end,
        upto,
        end,
        new_start,
    )
    return end, upto


def former_master_divergence(
    commitlog: CommitLog, sent: SentOffsets, master: str
) -> Divergence | None:
    """A classic slave's store that last ran as a trioha master: does it hold bytes no other
    broker can hold?

    Its marks say how far it may have sent its log. Bytes past that were never sent to
    anyone, so no master's history can hold them: a master serving this store from its end
    would splice its own history onto them. Such a store starts diverged, sticky, cut back
    with ``--truncate-to-master`` to the last message boundary at or below the mark (where
    the master's own check decides, at the next connection, whether that is far enough).
    None when there are no marks or nothing past them.
    """
    end = commitlog.max_offset
    if not sent.existed or end <= sent.reserved:
        return None
    mark = max(sent.reserved, commitlog.min_offset)
    cut, _ = commitlog.boundaries_around(mark)
    return Divergence(
        cut,
        end,
        master,
        f"this store last ran as a trioha master and never sent bytes [{mark}, {end}) to a "
        f"slave: no other broker holds them, so master {master}'s history cannot continue "
        "this log",
    )
