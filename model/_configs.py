"""Named worlds: the three sizes every change is checked at, and known-bad ones that must fail.

The distinct-state count of each configuration is pinned in ``tests/model`` (and, for
``nightly``, in docs/model.md), so any change in the protocol's semantics shows up as a changed
count even when every property still holds.

The failover world's configurations (all named ``failover-...``) are in
``model._failover_configs``; :func:`get` finds either kind.

Known-bad configurations reproduce RocketMQ's documented failure modes. Each must fail on the
named property with a short trace; where a trioha option fixes the problem, its ``fixed-`` twin
turns the option on and must pass.
"""

from __future__ import annotations

from typing import Any

import attrs

from model._failover_configs import FAILOVER_CONFIGS
from model._failover_values import FailoverConfig
from model._values import Config, Faults

_BASE = Config(name="base", doc="")


def _config(name: str, doc: str, **changes: Any) -> Config:
    return attrs.evolve(_BASE, name=name, doc=doc, **changes)


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        # --- the three sizes ---------------------------------------------------------------
        _config(
            "smoke",
            "2 messages in one segment, sync puts, frames of 1 byte; a drop, a slave restart and "
            "a master crash (SYNC_FLUSH). Runs in seconds, in the default test run.",
            faults=Faults(drops=1, restarts=1, crashes=1),
        ),
        _config(
            "ci",
            "2 messages, sync puts; a slave restart, a stale master-side connection whose late "
            "reports still arrive, and a master crash (SYNC_FLUSH). At least 10^5 states.",
            faults=Faults(restarts=1, stale=1, crashes=1),
        ),
        _config(
            "hostile",
            "2 messages, sync puts; bogus reports beyond the master's end (on the slave's "
            "connection and from a rogue client) and an early housekeeping close on either side.",
            faults=Faults(bogus=1, housekeeping=1),
        ),
        _config(
            "nightly",
            "2 messages, sync and async puts; a drop, a stale connection, a slave restart, a "
            "master crash and a bogus report (early housekeeping behaves as a drop; hostile "
            "has it). 10^6+ states.",
            async_puts=True,
            faults=Faults(drops=1, stale=1, restarts=1, crashes=1, bogus=1),
        ),
        _config(
            "multi-segment",
            "3 messages over two segments with ha_sync_from_oldest: the slave must always be "
            "able to get the whole log; a drop and a slave restart.",
            messages=3,
            sync_from_oldest=True,
            full_copy_goal=True,
            faults=Faults(drops=1, restarts=1),
        ),
        # --- second round: what the sizes above could not see ---------------------------------
        _config(
            "odd-frames",
            "3 messages over two segments in frames of 3 bytes: frames end inside messages and "
            "are cut short at segment ends (a frame crossing one fails FrameWithinLog); a drop "
            "and a slave restart.",
            messages=3,
            batch_size=3,
            faults=Faults(drops=1, restarts=1),
        ),
        _config(
            "hostile-anywhere",
            "2 messages in frames of 1 byte; one bogus report on the slave's connection at any "
            "offset that is wrong for it: beyond what was sent up to the master's end (an ack "
            "checked against the log end, #3015's half-fix, passes these), below the accepted "
            "ack (backwards), or beyond any end; or from a rogue client.",
            bogus_anywhere=True,
            faults=Faults(bogus=1),
        ),
        _config(
            "fallbehind-edge",
            "3 messages with ha_slave_fallbehind_max 3 bytes: sync puts meet the slave exactly "
            "fallbehind_max behind (refused) and one byte closer (may wait); a drop.",
            messages=3,
            fallbehind_max=3,
            faults=Faults(drops=1),
        ),
        # --- known-bad, and the option that fixes each -----------------------------------------
        _config(
            "ack-written-restart",
            "RocketMQ's slave acks what it has written, not flushed; a slave restart loses the "
            "page cache, so a PUT_OK message is gone from the slave.",
            slave_ack_flushed=False,
            batch_size=2,
            time=False,
            faults=Faults(restarts=1),
            expect="SyncAckedOnSlave",
        ),
        _config(
            "fixed-ack-flushed-restart",
            "The same with ha_slave_ack_flushed: the slave reports only what it flushed.",
            batch_size=2,
            time=False,
            faults=Faults(restarts=1),
        ),
        _config(
            "async-flush-crash",
            "ASYNC_FLUSH master crashes: it loses what the slave already has and writes new "
            "messages at the same offsets; classic HA cannot truncate the slave (#323).",
            master_sync_flush=False,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            faults=Faults(crashes=1),
            expect="NoDivergence",
        ),
        _config(
            "fixed-sync-flush-crash",
            "The same with SYNC_FLUSH on the master: a crash loses nothing the slave has.",
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            faults=Faults(crashes=1),
        ),
        _config(
            "epoch-flush-crash",
            "async-flush-crash in epoch mode: the restarted master begins a new epoch, and the "
            "slave holding its lost tail cuts back to the consistent point before it reports.",
            epoch_mode=True,
            master_sync_flush=False,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            faults=Faults(crashes=1),
        ),
        _config(
            "classic-lost-records",
            "The master loses its last records after sending them (recovery cut a damaged "
            "record, or a power cut took a sent tail) and writes new ones at those offsets; "
            "classic HA has no way to tell the slave.",
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            faults=Faults(tail_losses=1),
            expect="NoDivergence",
        ),
        _config(
            "epoch-lost-records",
            "The same in epoch mode, with a slave restart and a drop: the slave is a prefix "
            "of the master whenever it streams.",
            epoch_mode=True,
            messages=3,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            faults=Faults(tail_losses=1, restarts=1, drops=1),
        ),
        _config(
            "epoch-smoke",
            "smoke's world in epoch mode: sync puts, frames of 1 byte; a drop, a slave restart "
            "and a master crash (SYNC_FLUSH), each connection starting with the handshakes.",
            epoch_mode=True,
            faults=Faults(drops=1, restarts=1, crashes=1),
        ),
        _config(
            "epoch-ci",
            "ci's world in epoch mode: sync puts, a slave restart, a stale master-side "
            "connection whose late reports still arrive, and a master crash (SYNC_FLUSH). "
            "About 3 * 10^5 states; slow tier.",
            epoch_mode=True,
            faults=Faults(restarts=1, stale=1, crashes=1),
        ),
        _config(
            "segment-deletion",
            "The master deletes the segment a disconnected slave still needs; the slave can "
            "never catch up again and must be re-seeded (#3388).",
            messages=3,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            faults=Faults(deletions=1),
            expect="EventuallyCaughtUp",
        ),
        _config(
            "last-segment-copy",
            "An empty slave is served from the start of the master's last segment, so it never "
            "gets the older history (#3661).",
            messages=3,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            full_copy_goal=True,
            expect="EventuallyFullCopy",
        ),
        _config(
            "fixed-oldest-copy",
            "The same with ha_sync_from_oldest: an empty slave gets the whole log.",
            messages=3,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            full_copy_goal=True,
            sync_from_oldest=True,
        ),
        _config(
            "empty-slave-gap",
            "A sync put waits; the slave reconnects empty and, by the last-segment rule, is "
            "served from a later segment; its acks must not cover the waiting put it never "
            "got (a connection vouches only for bytes it carried: trioha.proto.vouch).",
            messages=3,
            batch_size=2,
            time=False,
            faults=Faults(drops=1),
        ),
        _config(
            "rogue-at-end",
            "A client that is not a slave connects and reports exactly the master's end; its "
            "first report must not release a waiting sync put no slave holds (the rest of "
            "#3015; a first report vouches for nothing).",
            batch_size=2,
            time=False,
            rogue_reports_end=True,
            faults=Faults(bogus=1),
        ),
        # --- classic-mode divergence check (trioha's own; docs/replication.md) -------------
        _config(
            "classic-refusal",
            "async-flush-crash with trioha's classic refusal: the master records what it "
            "sent, a crash that loses sent bytes starts the new history past them, and a "
            "slave holding them is refused until the operator cuts it back; it is never "
            "served a spliced log (NoSilentReattach) and no new message lands where it holds "
            "another (NoMessageDivergence).",
            master_sync_flush=False,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            classic_refusal=True,
            faults=Faults(crashes=1),
        ),
        _config(
            "classic-lost-sent",
            "The master loses the last N records it had sent (ASYNC_FLUSH: any flushed "
            "prefix of 3 messages survives); a drop may cut a slave off while it receives "
            "the END_OF_FILE padding, and a slave restart may cut its log anywhere.",
            messages=3,
            master_sync_flush=False,
            sync_puts=False,
            async_puts=True,
            batch_size=2,
            time=False,
            classic_refusal=True,
            faults=Faults(crashes=1, drops=1, restarts=1),
        ),
    )
}


def get(name: str) -> Config | FailoverConfig:
    """The configuration named *name*, of either world."""
    found = CONFIGS.get(name) or FAILOVER_CONFIGS.get(name)
    if found is None:
        known = ", ".join([*CONFIGS, *FAILOVER_CONFIGS])
        raise KeyError(f"no configuration {name!r}; known: {known}")
    return found
