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

Failover mode (docs/failover.md, "The ack rule") asks the same vouches a different question,
:class:`InSyncQuorum`: not "how many slaves" but "which brokers", against the SyncStateSet
that etcd records, so that any member etcd may elect holds every acknowledged write:

* with ``allAckInSyncStateSet`` (RocketMQ's key; trioha's default) a put ``[start, end)`` is
  PUT_OK only when **every member of the effective SyncStateSet holds it** (the master
  counts itself once its own copy is durable), and **at least ``minInSyncReplicas`` brokers
  hold it**; without ``allAckInSyncStateSet`` only the count is asked (RocketMQ's default,
  and a known way to lose acknowledged writes at a failover: model/ shows it);
* both are asked **when the put completes**, against the set in force then, not only before
  the append (RocketMQ checks ``minInSyncReplicas`` only before it appends: a set that shrinks
  meanwhile would let a put through with fewer copies);
* the *effective* set is the union of the committed set and a proposed one while a change is
  pending; the control core (``trioha.failover``) hands it over, this module only counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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


#: ``Long.MAX_VALUE``: "the master's own copy is durable everywhere" (no flush to wait for).
DURABLE_EVERYWHERE = (1 << 63) - 1


@attrs.frozen
class InSyncQuorum:
    """Failover mode's ack rule: which brokers hold a put, and is that the SyncStateSet?

    *members* is the effective SyncStateSet (committed set union proposed set), master
    included; *vouches* maps each slave with a live connection in TRANSFER to what that
    connection vouches for (:func:`vouch`); the master holds bytes below *master_durable*
    (its flushed end: in failover mode an acknowledged write must survive a power cut of any
    member, docs/failover.md "Durability").

    Mirrors RocketMQ 5.x's controller-mode path of ``CommitLog.handleHA`` and
    ``AutoSwitchHAService.getConfirmOffset`` (``allAckInSyncStateSet``,
    ``minInSyncReplicas``), with the checks made at completion (module docstring).
    """

    master: int
    members: frozenset[int]
    vouches: tuple[tuple[int, Vouch], ...]
    min_in_sync: int
    all_ack: bool = True
    master_durable: int = DURABLE_EVERYWHERE

    @classmethod
    def of(
        cls,
        master: int,
        members: Iterable[int],
        vouches: Mapping[int, Vouch] | Iterable[tuple[int, Vouch]],
        min_in_sync: int,
        *,
        all_ack: bool = True,
        master_durable: int = DURABLE_EVERYWHERE,
    ) -> InSyncQuorum:
        items = vouches.items() if isinstance(vouches, Mapping) else vouches
        return cls(
            master,
            frozenset(members),
            tuple(sorted(items)),
            max(1, min_in_sync),
            all_ack,
            master_durable,
        )

    def holders(self, start: int, end: int) -> frozenset[int]:
        """The brokers that hold ``[start, end)``: the master once durable, and every slave
        whose live connection carried it and acked it."""
        held = {broker for broker, v in self.vouches if carried(v, start, end)}
        if self.master_durable >= end:
            held.add(self.master)
        return frozenset(held)

    def holds(self, start: int, end: int) -> bool:
        """May ``[start, end)`` be answered PUT_OK now?"""
        held = self.holders(start, end)
        if len(held) < self.min_in_sync:
            return False
        return not self.all_ack or self.members <= held

    def enough_members(self) -> bool:
        """Before the append: does the set name ``minInSyncReplicas`` brokers at all?

        RocketMQ answers IN_SYNC_REPLICAS_NOT_ENOUGH (and stores nothing) otherwise; trioha
        does the same, and asks :meth:`holds` again when the put completes.
        """
        return len(self.members) >= self.min_in_sync

    def available(self, end: int, fallbehind_max: int) -> bool:
        """May a put ending at *end* wait, or is it SLAVE_NOT_AVAILABLE at once?

        Enough brokers (the master and slaves within ``fallbehind_max``) could come to hold
        it. A member that is not connected is waited for: it may reconnect, or the control
        core may take it out of the set.
        """
        close = sum(1 for _broker, (_served, ack) in self.vouches if end - ack < fallbehind_max)
        return 1 + close >= self.min_in_sync
