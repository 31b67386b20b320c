"""The rules the control core decides by, as small pure functions over plain numbers.

* **Fencing** (:func:`fence_deadline`): a master may acknowledge puts only while its clock
  reads less than the *send* time of its last successful keepalive plus 4/5 of the lease's
  TTL. etcd restarted the lease's countdown when it *received* that keepalive, no earlier than
  it was sent, and lets the lease live the full TTL from there; so, as long as neither clock
  runs more than 20% off the other over one TTL, the deadline passes before etcd can expire
  the lease, and before anybody else can hold the master key (docs/failover.md, "Fencing").
* **Ranking** (:func:`rank`, :func:`campaign_decision`): when the master key is vacant, only
  eligible brokers (SyncStateSet members; any live broker in an unclean election or when the
  group has no set yet) may campaign, and among the live ones the greatest
  ``(epoch, max offset)`` goes first, ties to the lowest broker id. Each first reports its
  log in its registration, and backs off while a better candidate is alive (its lease not
  expired). Ranking decides which *unacknowledged* bytes survive; safety never rests on it
  (any member holds every acknowledged write).
* **SyncStateSet maintenance** (:func:`sss_change`): a member leaves when its broker is gone
  from etcd (its lease expired) or has not caught up within ``haMaxTimeSlaveNotCatchup``; a
  live slave joins once it holds everything the master has acknowledged (its acked offset
  reaches the master's confirm offset). A lone master may so shrink the set to itself: with
  ``minInSyncReplicas=1`` it then goes on acknowledging alone, availability over redundancy.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from trioha.failover._keys import GroupKeys, Registration

__all__ = [
    "FENCE_DENOMINATOR",
    "FENCE_NUMERATOR",
    "Decision",
    "FailoverOptions",
    "Unsafe",
    "campaign_decision",
    "fence_deadline",
    "keepalive_interval",
    "rank",
    "sss_change",
]

#: The share of the TTL a master acknowledges for after each keepalive is sent: 4/5.
FENCE_NUMERATOR = 4
FENCE_DENOMINATOR = 5


def fence_deadline(sent_at: int, ttl_s: int) -> int:
    """When a master must stop acknowledging: *sent_at* (ms) plus 4/5 of *ttl_s* seconds."""
    return sent_at + ttl_s * 1000 * FENCE_NUMERATOR // FENCE_DENOMINATOR


def keepalive_interval(ttl_s: int) -> int:
    """How often (ms) a lease of *ttl_s* seconds is kept alive: three times per TTL."""
    return max(1, ttl_s * 1000 // 3)


@attrs.frozen
class Unsafe:
    """Deliberate mistakes, each off by default, each one of the known-bad twins that
    docs/failover.md and ``model/`` show failing. They exist so that the checkers can be shown
    to catch them (here and, with real processes, in the nemesis runs); never set them in a
    broker that holds data anyone cares about."""

    #: Change the SyncStateSet without comparing the master key's create_revision.
    sss_without_token: bool = False
    #: Keep acknowledging after the lease deadline (no self-fence).
    no_self_fence: bool = False
    #: While an expansion is pending, wait only for the committed set, not the union.
    expand_without_union: bool = False

    @property
    def any(self) -> bool:
        return self.sss_without_token or self.no_self_fence or self.expand_without_union


@attrs.frozen
class FailoverOptions:
    """What one broker's control core needs to know (part of ``BrokerConfig`` in the broker).

    RocketMQ's names where RocketMQ has the setting: ``allAckInSyncStateSet`` and
    ``minInSyncReplicas`` shape the ack rule (``trioha.proto.InSyncQuorum``; the core only
    passes the set on), ``enableElectUncleanMaster`` and ``haMaxTimeSlaveNotCatchup`` are
    the core's own.
    """

    broker_id: int
    keys: GroupKeys
    broker_addr: str = ""
    ha_addr: str = ""
    #: The lease's TTL in seconds (etcd counts leases in whole seconds).
    lease_ttl: int = 3
    #: ``haMaxTimeSlaveNotCatchup``: a member that has not caught up this long (ms) leaves.
    ha_max_time_slave_not_catchup: int = 15_000
    #: ``enableElectUncleanMaster``: with no live SyncStateSet member, elect any live broker
    #: (and say how many bytes that loses, at least).
    enable_elect_unclean_master: bool = False
    unsafe: Unsafe = Unsafe()

    def __attrs_post_init__(self) -> None:
        if self.broker_id <= 0:
            raise ValueError(f"a failover broker id must be positive, got {self.broker_id}")
        if self.lease_ttl < 1:
            raise ValueError(f"the lease TTL must be at least 1 second, got {self.lease_ttl}")


# --- ranking ----------------------------------------------------------------------------------


def rank(broker_id: int, epoch: int, max_offset: int) -> tuple[int, int, int]:
    """Greater is better: the newest epoch, then the longest log, then the lowest id."""
    return epoch, max_offset, -broker_id


class Decision(enum.Enum):
    """What a follower does about a vacant master key."""

    CAMPAIGN = "campaign"
    #: A better candidate is alive: let it go first.
    BACK_OFF = "back off"
    #: Rivals are alive and this broker's registration does not show its log as it is now:
    #: update it first, so that they rank it on current numbers.
    REPORT = "report"


def campaign_decision(
    me: int,
    mine: tuple[int, int],
    registered: Registration | None,
    rivals: Mapping[int, Registration | None],
) -> Decision:
    """Campaign, or leave the vacancy to someone else for now.

    *mine* is this broker's ``(epoch, max_offset)`` now and *registered* what its registration
    in etcd says (None: none, or not under its current lease); *rivals* are the other live
    brokers that may campaign, with their registrations (None: unreadable, and such a rival
    never outranks). Alone, a broker campaigns at once; a rival that has not reported yet is
    ranked on what it last registered (the registration is updated at every vacancy, so it
    lags by one report at most).
    """
    if not rivals:
        return Decision.CAMPAIGN
    if registered is None or (registered.epoch, registered.max_offset) != mine:
        return Decision.REPORT
    me_rank = rank(me, *mine)
    for rival, reg in rivals.items():
        if reg is not None and rank(rival, reg.epoch, reg.max_offset) > me_rank:
            return Decision.BACK_OFF
    return Decision.CAMPAIGN


# --- SyncStateSet maintenance -----------------------------------------------------------------


@attrs.frozen(order=True)
class Replica:
    """What the master knows of one slave's connection (from the data plane's facts)."""

    broker_id: int
    #: The newest offset its live connection vouches for; -1 while it is not connected.
    acked: int = -1
    #: The last time (ms) it had caught up with the master (RocketMQ's ``lastCaughtUpTime``).
    caught_up_at: int = 0


def sss_change(
    me: int,
    members: frozenset[int],
    *,
    replicas: Iterable[Replica],
    live: Iterable[int],
    now: int,
    ha_max: int,
    confirm_offset: int | None,
) -> frozenset[int] | None:
    """The set the master should propose now, or None to leave it as it is.

    A member leaves when its broker is not alive in etcd, or has not caught up within
    *ha_max* ms. A live slave that has caught up within *ha_max* joins when its acked offset
    reaches *confirm_offset*, the end of the last put the master acknowledged (so it holds
    every acknowledged write; None: do not consider joins now; the caller passes
    the confirm offset only together with a fresh ack, read from the data plane at that very
    moment, so that no put can be acknowledged between the judgement and the union taking
    effect).
    """
    alive = set(live)
    by_id = {r.broker_id: r for r in replicas}
    keep = {me}  # the master is always a member of its own set
    for member in members:
        if member == me:
            keep.add(member)
            continue
        replica = by_id.get(member)
        caught_up_at = replica.caught_up_at if replica is not None else now
        if member in alive and now - caught_up_at < ha_max:
            keep.add(member)
    if confirm_offset is not None:
        for replica in by_id.values():
            bid = replica.broker_id
            if (
                bid not in members
                and bid in alive
                and replica.acked >= confirm_offset
                and now - replica.caught_up_at < ha_max
            ):
                keep.add(bid)
    new = frozenset(keep)
    return None if new == members else new
