"""``trioha slave --truncate-to-master`` and ``--truncate-to OFFSET``: cut a stopped slave's
store back to its master's history.

A slave refused by its master (classic mode: the master lost bytes it had sent, or the slave
holds more than the master) records the divergence in ``<store>/haDiverged`` and stops
replicating. ``--truncate-to-master``, run with the slave stopped, cuts its commit log back to
the offset the master named (where the two histories part), with the consume queues, the
message index and their build checkpoint following (``truncate_replica``), keeps the cut
bytes in ``<store>/lost+found``, and clears the record; the next start replicates the master's
history from there.

A Java RocketMQ slave records nothing: a trioha master that refuses it names the offset in its
own log (and the Java slave logs ``master pushed offset not equal the max phy offset in slave``
with both offsets). ``--truncate-to OFFSET`` makes the same cut at an offset given by hand, on
any stopped store in RocketMQ's layout, a Java broker's included (trioha reads and writes it as
RocketMQ 4.9.7 does; files keep their size, the cut bytes are zeroed as Java's
``truncateDirtyFiles`` does). Java's own recovery then starts at the cut.

The cut happens only at a message boundary: an offset inside one of the slave's records
means the logs part earlier than the master could tell, and the command refuses, naming the
nearest boundaries; the slave must then be re-seeded (a copy of the master's store, or an
empty store).
"""

from __future__ import annotations

import logging

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.broker import CHECKPOINT_FILE, truncate_replica
from trioha.net import DIVERGED_FILE, Divergence
from trioha.store import (
    SENT_OFFSET_FILE,
    ConsumeQueueStore,
    IndexService,
    SentOffsets,
    open_store,
)

__all__ = ["truncate_to_master", "truncate_to_offset"]

log = logging.getLogger("trioha.ha")


def truncate_to_master(config: BrokerConfig) -> str:
    """Cut the stopped slave's store back to its recorded divergence; returns a summary."""
    root = config.store_root
    marker = root / DIVERGED_FILE
    divergence = Divergence.read(marker)
    if divergence is None:
        raise ConfigError(
            f"{root} records no divergence ({marker} does not exist): this slave was never "
            "refused by its master, so there is nothing to cut back (for a store a refusal "
            "left no record in, a Java slave's, give the offset the master named: "
            "--truncate-to OFFSET)"
        )
    return _cut(config, divergence.master_offset, f"master {divergence.master}'s")


def truncate_to_offset(config: BrokerConfig, offset: int) -> str:
    """Cut the stopped store back to ``offset`` (a message boundary); returns a summary."""
    if offset < 0:
        raise ConfigError(f"--truncate-to needs an offset of 0 or more, not {offset}")
    return _cut(config, offset, "its master's")


def _cut(config: BrokerConfig, offset: int, whose: str) -> str:
    root = config.store_root
    marker = root / DIVERGED_FILE
    if not config.commitlog_dir.is_dir():
        raise ConfigError(f"{config.commitlog_dir} does not exist: no commit log to cut")
    # The segment size is the files' own: a store written by another broker (or with another
    # mappedFileSizeCommitLog than this command line's) is cut as it is laid out.
    with open_store(
        root, segment_size=None, create=False, commitlog_dir=config.commitlog_dir
    ) as store:
        queues = ConsumeQueueStore(root)
        queues.load()
        index = (
            IndexService(root, slots=config.max_hash_slot_num, max_index=config.max_index_num)
            if config.message_index_enable and (root / "index").is_dir()
            else None
        )
        try:
            if index is not None:
                index.load(flushed_up_to=None)
            end = store.commitlog.max_offset
            if offset > end:
                raise ConfigError(
                    f"the master's history ends at {offset}, beyond this slave's log end "
                    f"{end}: nothing to cut; remove {marker} if the slave was re-seeded"
                )
            kept = truncate_replica(
                store.commitlog, queues, root / "config" / CHECKPOINT_FILE, offset, index=index
            )
            if (root / SENT_OFFSET_FILE).exists():  # a former master's flushed mark
                SentOffsets.open(root).cut_to(offset)
        finally:
            queues.close()
            if index is not None:
                index.close()
    marker.unlink(missing_ok=True)
    where = ", ".join(k.where for k in kept) or "nothing (the log already ended there)"
    summary = (
        f"cut the commit log of {root} back from {end} to {offset}, where its history and "
        f"{whose} part; the cut bytes are kept in {where}. Start the slave again to "
        "replicate the master's history from there."
    )
    log.warning("%s", summary)
    return summary
