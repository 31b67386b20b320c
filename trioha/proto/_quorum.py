"""Which acks vouch for which bytes, and whether a sync put is replicated: the one rule.

Mirrors what RocketMQ spreads over ``HAService.push2SlaveMaxOffset``, ``isSlaveOK`` and
``GroupTransferService.doWaitTransfer``, and is the only place trioha decides it: the master's
HA service (``trioha.net.HAService``), the in-memory protocol pair (``trioha.testing``) and the
model checker (``model/``) all ask a :class:`Quorum`. Changing the ack policy means changing
this file (and its tests); docs/replication.md says why the policy is what it is.

The rule, in three parts:

* **A vouch is what one live connection can answer for**: ``(served_from, ack_offset)``, the
  bytes ``[served_from, ack_offset)`` that this connection carried and the slave acknowledged
  (:func:`vouch`). A first report vouches for nothing beyond where serving started: a slave
  served from the master's last segment, or a client whose first report is the master's end,
  never received the bytes before it.
* **A put ``[start, end)`` is replicated** once *needed* live connections vouch for all of it:
  each was served from at or before *start* and has acked at least *end*. RocketMQ 4.x uses
  the maximum ack ever seen from any slave, which a departed slave or a bogus report keeps
  inflated (RocketMQ #3015); trioha counts only live connections' accepted acks, and needs
  *needed* of them (5.x ``inSyncReplicas`` - 1).
* **A put can be waited for** only if *needed* live slaves are within ``fallbehind_max`` of its
  end (``HAService.isSlaveOK``, per slave); otherwise it is answered SLAVE_NOT_AVAILABLE at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeAlias

import attrs

from trioha.proto._state import MasterState

Vouch: TypeAlias = tuple[int, int]
"""One live connection as sync replication sees it: ``(served_from, ack_offset)``."""


def vouch(state: MasterState) -> Vouch:
    """What a connection in TRANSFER vouches for (see :data:`Vouch`)."""
    return state.served_from, state.ack_offset


def needed_acks(required_slave_acks: int) -> int:
    """How many vouches a put waits for, given the configured count (at least one).

    With ``required_slave_acks`` 0 a SYNC_MASTER put waits for nobody and never asks; the
    statistics still report what one slave holds.
    """
    return max(1, required_slave_acks)


def carried(v: Vouch, start: int, end: int) -> bool:
    """Did the connection behind *v* carry ``[start, end)`` and ack all of it?"""
    served_from, ack = v
    return served_from <= start and ack >= end


def replicated_offset(vouches: Iterable[Vouch], needed: int, start: int | None = None) -> int:
    """The highest end that *needed* live connections have acked; -1 if too few.

    With *start* (where a put's bytes begin), only connections served from at or before it
    count: a connection vouches only for bytes it carried itself. Without that, a slave served
    from the master's last segment (or any client whose first report is the master's end)
    would "ack" puts it never received (found by model/; RocketMQ has the same hole through
    ``push2SlaveMaxOffset``).
    """
    if needed <= 0:
        raise ValueError("needed must be positive")
    ordered = sorted(
        (ack for served, ack in vouches if start is None or served <= start), reverse=True
    )
    if len(ordered) < needed:
        return -1
    return ordered[needed - 1]


def slaves_available(vouches: Iterable[Vouch], needed: int, end: int, fallbehind_max: int) -> bool:
    """``HAService.isSlaveOK`` per slave: are *needed* live slaves within ``fallbehind_max``?"""
    close_enough = sum(1 for _served, ack in vouches if end - ack < fallbehind_max)
    return close_enough >= needed


@attrs.frozen
class Quorum:
    """The live connections' vouches at one moment, and what follows for every sync put.

    Build one with :meth:`of` after each ack or registry change; asking it about many waiting
    puts then costs a comparison each in the common case (a put after every connection's start).
    """

    vouches: tuple[Vouch, ...]
    needed: int
    #: ``replicated_offset(vouches, needed)``: the most any put can be covered to (-1: none).
    highest: int
    #: The latest ``served_from`` among the vouches (0 without any).
    latest_served_from: int

    @classmethod
    def of(cls, vouches: Iterable[Vouch], needed: int) -> Quorum:
        held = tuple(vouches)
        return cls(
            held,
            needed,
            replicated_offset(held, needed),
            max((served_from for served_from, _ack in held), default=0),
        )

    def holds(self, start: int, end: int) -> bool:
        """Do *needed* connections that carried ``[start, end)`` vouch for it?"""
        # A put starting at or after every connection's served_from is covered by all of them;
        # otherwise only the connections that carried it count: one served from later on (a
        # slave that reconnected empty) does not vouch for it, and the put stays until one that
        # did acks it, or it times out.
        if start >= self.latest_served_from:
            return self.highest >= end
        return replicated_offset(self.vouches, self.needed, start) >= end

    def available(self, end: int, fallbehind_max: int) -> bool:
        """May a put ending at *end* wait for acks, or is it SLAVE_NOT_AVAILABLE at once?"""
        return slaves_available(self.vouches, self.needed, end, fallbehind_max)

    def vouchers(self, start: int, end: int) -> list[int]:
        """Indices (into :attr:`vouches`) of the connections that carried and acked the put."""
        return [i for i, v in enumerate(self.vouches) if carried(v, start, end)]
