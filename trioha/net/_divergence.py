"""What a classic master checks when it starts: did it lose bytes it had sent, or damage?

Classic HA (RocketMQ 4.x) has no epochs: nothing on the wire says which history a slave's
bytes belong to. So the master keeps two durable marks (``trioha.store._sent``): how far it
may have sent its log, and how far its log was surely flushed. On start it compares them with
the end its recovery found:

* **recovered end below the flushed mark**: recovery cut bytes that were on disk, so it met
  damage (a bad record in an old segment), not a power cut's lost tail. Serving as master
  would make new data take offsets slaves already hold. The broker refuses to start, naming
  the offsets and where recovery kept the cut bytes, unless the operator passes
  ``ha_accept_damaged_log`` (``--accept-damaged-log``);
* **recovered end below the sent mark**: bytes ``[end, mark)`` may be on slaves and are gone
  here. The range is recorded for good (a first report inside it is refused, see
  ``proto._state._master_first_report``), and the log is closed with RocketMQ's END_OF_FILE
  blank records up to the first segment boundary beyond the mark
  (:meth:`~trioha.store._logcore.LogCore.skip_past`), so that no record of the new history ever
  takes an offset of the lost one. docs/replication.md explains why this, rather than
  per-slave state, and what it can and cannot detect.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trioha._errors import DamagedLogError
from trioha.store._sent import DEFAULT_RESERVE_STEP, SentOffsets

if TYPE_CHECKING:
    from trioha.store import CommitLog, Store

__all__ = ["check_master_history", "open_master_history"]

log = logging.getLogger("trioha.ha")


def open_master_history(
    store: Store, *, accept_damaged: bool = False, epoch_mode: bool = False
) -> SentOffsets:
    """Check the recovered log against the marks (see the module docstring); blocking.

    Returns the marks for the HA service to keep up to date. Raises
    :class:`DamagedLogError` for a damaged log unless ``accept_damaged``.

    In epoch mode only the damage check applies: the new epoch begins at the recovered end,
    and a slave holding lost bytes truncates to the consistent point that the epochs give, so
    new data must start exactly there (no end-of-file padding past the lost range, which would
    make the old epoch look longer than what this master still has).
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
        commitlog, sent, accept_damaged=accept_damaged, recovery=cut, epoch_mode=epoch_mode
    )


def check_master_history(
    commitlog: CommitLog,
    sent: SentOffsets,
    *,
    accept_damaged: bool = False,
    recovery: str = "recovery found no more",
    epoch_mode: bool = False,
) -> SentOffsets:
    """The checks of :func:`open_master_history` on any commit log; ``recovery`` says what
    recovery did (for the error). Returns ``sent``."""
    end = commitlog.max_offset
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
    if epoch_mode:
        sent.restart_at(end)
        return sent
    lost = sent.note_recovered_end(end)
    if lost is not None:
        lost_from, lost_to = lost
        new_start = commitlog.skip_past(lost_to)
        commitlog.flush()
        log.error(
            "this master may have sent bytes [%d, %d) to slaves before it stopped, and its "
            "log now ends at %d: those bytes are lost here. Slaves reporting an offset in "
            "(%d, %d] will be refused until they are cut back to %d (`trioha slave "
            "--truncate-to-master`) or re-seeded; new messages start at %d, past the lost "
            "range, so that no slave is ever served a spliced log",
            lost_from,
            lost_to,
            end,
            lost_from,
            lost_to,
            lost_from,
            new_start,
        )
    for lost_from, lost_to in sent.lost:
        if lost != (lost_from, lost_to):
            log.info(
                "slaves reporting an offset in (%d, %d] are refused (lost in an earlier crash)",
                lost_from,
                lost_to,
            )
    return sent
