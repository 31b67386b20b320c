"""What must hold in every failover world, what must be reached, and what must stay possible.

docs/model.md ("Failover") has the table of properties and what each protects. State
invariants are functions of one :class:`FailoverWorld`; transition invariants are judged
while a step is applied (``model._failover_steps``) and reported with the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from model._engine import Edge, Goal, Invariant, Probe
from model._failover_steps import FailoverModel, FStep
from model._failover_values import Broker, FailoverConfig, FailoverWorld, Role
from trioha.failover import Phase
from trioha.proto import find_consistent_point

# --- state invariants -------------------------------------------------------------------------


def _holder(w: FailoverWorld) -> tuple[int, Broker] | None:
    """The broker etcd names master, if it runs as master at that epoch and token."""
    key = w.master_key()
    if key is None:
        return None
    i = key[0] - 1
    b = w.brokers[i]
    if not b.up or b.role is not Role.MASTER or b.epoch != key[1] or b.core.token != key[2]:
        return None
    return i, b


def one_acking_master_per_epoch(w: FailoverWorld) -> str | None:
    """Every PUT_OK given while etcd's master key was at epoch E came from one broker."""
    by_epoch: dict[int, int] = {}
    for a in w.acked:
        other = by_epoch.setdefault(a.coordinator_epoch, a.broker)
        if other != a.broker:
            return (
                f"brokers {other} and {a.broker} both answered PUT_OK while etcd's master key "
                f"was at epoch {a.coordinator_epoch}"
            )
    return None


def no_acked_write_lost(w: FailoverWorld) -> str | None:
    """LeaderCompleteness: a master of epoch E holds every write acknowledged in an epoch up
    to E, at the offset it was acknowledged at."""
    for i, b in enumerate(w.brokers):
        if not b.up or b.role is not Role.MASTER:
            continue
        for a in w.acked:
            if a.entry[0] > b.epoch:
                continue
            if a.offset >= b.end or b.log[a.offset] != a.entry:
                held = b.log[a.offset] if a.offset < b.end else "nothing"
                return (
                    f"message {a.entry[1]} was answered PUT_OK at offset {a.offset} in epoch "
                    f"{a.entry[0]}, but b{i + 1}, master of epoch {b.epoch}, holds {held} there"
                )
    return None


def sss_superset(w: FailoverWorld) -> str | None:
    """The acting master waits for at least every broker etcd's SyncStateSet names
    (RocketMQ's ReplicationQuorumSupersetProperty): any member etcd may elect holds every
    write it acknowledges."""
    found = _holder(w)
    if found is None:
        return None
    i, b = found
    if b.ack_until <= 0:
        return None
    stored = w.coordinator_sss()
    if not stored <= b.sss:
        return (
            f"b{i + 1}, master of epoch {b.epoch}, waits for {sorted(b.sss)} but etcd's "
            f"SyncStateSet is {sorted(stored)}"
        )
    return None


def _streams_from(w: FailoverWorld, j: int) -> int:
    b = w.brokers[j]
    if b.link is None or b.role is not Role.SLAVE or not b.leader:
        return -1
    m = b.leader - 1
    leader = w.brokers[m]
    if not leader.up or leader.role is not Role.MASTER or leader.epoch != b.epoch:
        return -1
    return m


def slave_is_prefix_of_master(w: FailoverWorld) -> str | None:
    """A slave streaming from its master holds a prefix of the master's log (so in
    particular everything below the master's confirm offset, once it got that far)."""
    for j, b in enumerate(w.brokers):
        m = _streams_from(w, j)
        if m < 0:
            continue
        leader = w.brokers[m]
        if b.end > leader.end or leader.log[: b.end] != b.log:
            return f"b{j + 1} streams from b{m + 1} but its log is not a prefix of b{m + 1}'s"
    return None


def no_divergence(w: FailoverWorld) -> str | None:
    """Below its consistent point with the acting master's history (what it keeps when it
    next connects), every broker's log is the master's."""
    found = _holder(w)
    if found is None:
        return None
    m, master = found
    for j, b in enumerate(w.brokers):
        if j == m or not b.log:
            continue
        mine = b.epochs.truncate_suffix(b.end)
        point = find_consistent_point(mine, b.end, master.epochs, master.end) if mine else 0
        for offset in range(max(0, min(point, b.end, master.end))):
            if b.log[offset] != master.log[offset]:
                return (
                    f"b{j + 1} would keep {b.log[offset]} at offset {offset} where b{m + 1}, "
                    f"master of epoch {master.epoch}, has {master.log[offset]}"
                )
    return None


def epoch_monotonic_state(w: FailoverWorld) -> str | None:
    """No broker holds or serves an epoch etcd has not handed out."""
    counter = w.counter()
    for i, b in enumerate(w.brokers):
        if b.last_epoch() > counter or b.epoch > counter:
            return (
                f"b{i + 1} is at epoch {max(b.last_epoch(), b.epoch)}, ahead of etcd's counter "
                f"{counter}"
            )
    return None


STATE_INVARIANTS: tuple[Invariant[FailoverWorld], ...] = (
    Invariant(
        "OneAckingMasterPerEpoch",
        one_acking_master_per_epoch,
        "PUT_OK only from the holder of etcd's master key, one broker per epoch",
    ),
    Invariant(
        "NoAckedWriteLost",
        no_acked_write_lost,
        "a master of epoch E holds every write acknowledged up to E (LeaderCompleteness)",
    ),
    Invariant(
        "SSSSuperset",
        sss_superset,
        "the acting master waits for every member of etcd's SyncStateSet",
    ),
    Invariant(
        "SlaveIsPrefixOfMaster",
        slave_is_prefix_of_master,
        "a streaming slave's log is a prefix of its master's",
    ),
    Invariant(
        "NoDivergence",
        no_divergence,
        "below its consistent point with the master, every log is the master's",
    ),
    Invariant(
        "EpochMonotonic", epoch_monotonic_state, "no broker is ahead of etcd's epoch counter"
    ),
)

#: Judged while a step is applied (``model._failover_steps``).
TRANSITION_INVARIANTS: tuple[tuple[str, str], ...] = (
    ("OneAckingMasterPerEpoch", "every PUT_OK comes from etcd's master at its epoch"),
    ("PutOkHasMinCopies", "a PUT_OK write is durable on at least minInSyncReplicas brokers"),
    ("EpochMonotonic", "etcd's counter and each broker's followed epoch never go back"),
    ("NoFrameRejected", "a slave never refuses its master's next entry"),
    ("NoLocalProtocolError", "the core never refuses an event the IO layer feeds it"),
)

# --- probes -----------------------------------------------------------------------------------


@attrs.frozen
class FailoverProbe:
    name: str
    doc: str
    needed: Callable[[FailoverConfig], bool]


def _always(c: FailoverConfig) -> bool:
    return True


def _steady(c: FailoverConfig) -> bool:
    return bool(c.initial_sss)


PROBES: tuple[FailoverProbe, ...] = (
    FailoverProbe("failover_put_ok", "a put was answered PUT_OK", _always),
    FailoverProbe(
        "failover_new_master",
        "a broker other than the first became master",
        lambda c: c.faults.crashes + c.faults.pauses + c.faults.cuts > 0,
    ),
    FailoverProbe(
        "failover_put_ok_new_master",
        "a new master answered PUT_OK",
        lambda c: c.faults.crashes + c.faults.pauses + c.faults.cuts > 0,
    ),
    FailoverProbe(
        "failover_lease_expired",
        "etcd expired a lease",
        lambda c: c.faults.crashes + c.faults.pauses + c.faults.cuts > 0,
    ),
    FailoverProbe(
        "failover_self_fenced",
        "a master passed its lease deadline and fenced itself",
        lambda c: (c.faults.pauses + c.faults.cuts > 0) and not c.unsafe.no_self_fence,
    ),
    FailoverProbe(
        "failover_failed_in_flight",
        "a waiting put was failed at a fence or step-down",
        lambda c: (c.faults.pauses + c.faults.cuts > 0) and not c.unsafe.no_self_fence,
    ),
    FailoverProbe("failover_sss_changed", "a SyncStateSet change was committed", _always),
    FailoverProbe(
        "failover_slave_truncated",
        "a slave cut its log back to the consistent point",
        lambda c: c.faults.crashes + c.faults.pauses + c.faults.cuts > 0 and c.messages > 0,
    ),
    FailoverProbe(
        "failover_compare_failed",
        "a campaign or SyncStateSet transaction failed its compare",
        lambda c: c.faults.losses + c.faults.duplicates + c.faults.cuts > 0,
    ),
    FailoverProbe(
        "failover_crash_lost_unflushed",
        "a crash took an unflushed tail",
        lambda c: c.faults.crashes > 0 and c.messages > 0,
    ),
    FailoverProbe(
        "failover_stale_watch",
        "a watch batch came again, after newer news",
        lambda c: c.faults.stale_watches > 0,
    ),
    FailoverProbe(
        "failover_message_lost", "a request or reply was lost", lambda c: c.faults.losses > 0
    ),
    FailoverProbe(
        "failover_handover_requested",
        "an operator asked the master to hand its role over",
        lambda c: c.faults.handovers > 0,
    ),
    FailoverProbe(
        "failover_handed_over",
        "a master released its key to the broker an operator chose",
        lambda c: c.faults.handovers > 0,
    ),
    FailoverProbe(
        "failover_handover_ended",
        "a handover ended without a release (refused, withdrawn, or the key lost)",
        lambda c: c.faults.handovers > 0,
    ),
)


def required_probes(config: FailoverConfig) -> list[FailoverProbe]:
    return [p for p in PROBES if p.needed(config)]


# --- liveness ---------------------------------------------------------------------------------


def master_can_ack(w: FailoverWorld, config: FailoverConfig) -> bool:
    """Some master can acknowledge: it holds etcd's master key, runs unfenced, and every
    member of the set it waits for (at least minInSyncReplicas brokers) streams from it."""
    found = _holder(w)
    if found is None:
        return False
    i, b = found
    if b.paused or b.ack_until <= 0 or b.core.phase is not Phase.MASTER:
        return False
    if len(b.sss) < config.min_in_sync_replicas:
        return False
    for member in b.sss:
        if member == i + 1:
            continue
        if _streams_from(w, member - 1) != i:
            return False
    return True


# --- the spec the engine explores -------------------------------------------------------------


class FailoverSpec:
    """Adapts :class:`FailoverModel` and the properties above to :mod:`model._engine`."""

    def __init__(self, config: FailoverConfig) -> None:
        self.config = config
        self.model = FailoverModel(config)

    def initial_states(self) -> Sequence[FailoverWorld]:
        return (self.model.initial(),)

    def successors(self, state: FailoverWorld) -> Iterable[Edge[FailoverWorld, FStep]]:
        for step, out in self.model.successors(state):
            yield Edge(step, out.world, step.fault, out.violations, out.marks)

    def invariants(self) -> Sequence[Invariant[FailoverWorld]]:
        return STATE_INVARIANTS

    def transition_invariants(self) -> Sequence[str]:
        return tuple(name for name, _ in TRANSITION_INVARIANTS)

    def probes(self) -> Sequence[Probe[FailoverWorld]]:
        return [Probe(p.name) for p in required_probes(self.config)]

    def goals(self) -> Sequence[Goal[FailoverWorld]]:
        config = self.config
        return [
            Goal(
                "MasterCanAck",
                lambda w: master_can_ack(w, config),
                "some master can acknowledge again, without further faults",
                within=config.liveness_bound,
            )
        ]


__all__ = [
    "PROBES",
    "STATE_INVARIANTS",
    "TRANSITION_INVARIANTS",
    "FailoverSpec",
    "master_can_ack",
]
