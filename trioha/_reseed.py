"""``trioha slave --truncate-to-master``: cut a diverged slave back to its master's history.

A slave refused by its master (classic mode: the master lost bytes it had sent, or the slave
holds more than the master) records the divergence in ``<store>/haDiverged`` and stops
replicating. This command, run with the slave stopped, cuts its commit log back to the offset
the master named (where the two histories part), with the consume queues, the message index
and their build checkpoint following (``truncate_replica``), keeps the cut bytes in
``<store>/lost+found``, and clears the record; the next start replicates the master's history
from there.

The cut happens only at a message boundary: an offset inside one of the slave's records
means the logs part earlier than the master could tell, and the command refuses, naming the
nearest boundaries; the slave must then be re-seeded (a copy of the master's store, or an
empty store).
"""

from __future__ import annotations

import logging

from trioha._config import BrokerConfig
from trioha._errors import ConfigError
from trioha.broker._reput import CHECKPOINT_FILE, truncate_replica
from trioha.net._client import DIVERGED_FILE, Divergence
from trioha.store import open_store
from trioha.store._consumequeue import ConsumeQueueStore
from trioha.store._index import IndexService
from trioha.store._sent import SENT_OFFSET_FILE, SentOffsets

__all__ = ["truncate_to_master"]

log = logging.getLogger("trioha.ha")


def truncate_to_master(config: BrokerConfig) -> str:
    """Cut the stopped slave's store back to its recorded divergence; returns a summary."""
    root = config.store_root
    marker = root / DIVERGED_FILE
    divergence = Divergence.read(marker)
    if divergence is None:
        raise ConfigError(
            f"{root} records no divergence ({marker} does not exist): this slave was never "
            "refused by its master, so there is nothing to cut back"
        )
    offset = divergence.master_offset
    with open_store(root, segment_size=config.mapped_file_size_commit_log, create=False) as store:
        queues = ConsumeQueueStore(root)
        queues.load()
        index = (
            IndexService(root, slots=config.max_hash_slot_num, max_index=config.max_index_num)
            if config.message_index_enable
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
    marker.unlink()
    where = ", ".join(k.where for k in kept) or "nothing (the log already ended there)"
    summary = (
        f"cut the commit log of {root} back from {end} to {offset}, where its history and "
        f"master {divergence.master}'s part; the cut bytes are kept in {where}. Start the "
        "slave again to replicate the master's history from there."
    )
    log.warning("%s", summary)
    return summary
