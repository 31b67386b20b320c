"""The failover world as values: brokers, the coordinator, the network, the ghosts.

Only frozen, hashable data and the small queries the properties ask; what can happen to it is
in :mod:`model._failover_steps`. The coordinator is the in-memory etcd's store itself
(:class:`trioha.testing.EtcdState`), the brokers' control cores are the production
:class:`trioha.failover.ReplicaState`, and the data plane is an abstract log of
``(epoch, message id)`` entries, one per offset, with the production
:class:`trioha.proto.EpochHistory` as its epoch file.

Time: every world is seen from ``now = 0``. Timestamps in it (lease expiries, deadlines,
keepalive times) are relative to the present, and a tick shifts them all back by one
tick; what lies far enough in the past to make no difference any more is clamped
(``model._failover_steps.canonical``), so that worlds that differ only in when they happen
are one world.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from trioha.failover import (
    FailoverOptions,
    GroupKeys,
    MasterRecord,
    Purpose,
    ReplicaState,
    Request,
    Response,
    SyncStateSet,
    Unsafe,
    WatchEvent,
)
from trioha.proto import EpochHistory
from trioha.testing import EtcdState

_MAKERS: dict[type, Callable[..., Any]] = {}
_UNCHANGED = object()


def but(value: T, **changes: Any) -> T:
    """``attrs.evolve`` without its per-call introspection (the checker calls it a lot).

    For each class a small function is written once, as attrs writes its ``__init__``:
    ``lambda v, a=_UNCHANGED, ...: cls(v.a if a is _UNCHANGED else a, ...)``.
    """
    cls = type(value)
    maker = _MAKERS.get(cls)
    if maker is None:
        maker = _MAKERS[cls] = _maker(cls)
    return maker(value, **changes)  # type: ignore[no-any-return]


def _maker(cls: type) -> Callable[..., Any]:
    names = [f.name for f in attrs.fields(cls)]
    params = ", ".join(f"{n}=_UNCHANGED" for n in names)
    args = ", ".join(f"v.{n} if {n} is _UNCHANGED else {n}" for n in names)
    namespace: dict[str, Any] = {"cls": cls, "_UNCHANGED": _UNCHANGED}
    exec(f"def but(v, {params}):\n    return cls({args})\n", namespace)
    return namespace["but"]  # type: ignore[no-any-return]


#: One entry of an abstract log: ``(epoch it was written in, message id)``; offsets count
#: entries.
Entry = tuple[int, int]

KEYS = GroupKeys.of("model", "broker-a")
T = TypeVar("T")


@attrs.frozen
class FailoverFaults:
    """How many of each fault a run may inject (0 = never)."""

    #: A broker loses power: its unflushed tail and everything in memory are gone.
    crashes: int = 0
    #: A broker stops taking steps (GC, SIGSTOP) while time goes on; it resumes later.
    pauses: int = 0
    #: A broker is cut off from the coordinator (its requests, replies and watch wait).
    cuts: int = 0
    #: The data-plane link between two brokers breaks and stays down until healed.
    links: int = 0
    #: A request to the coordinator, or its reply, is lost.
    losses: int = 0
    #: A request reaches the coordinator twice (a retry below the client).
    duplicates: int = 0
    #: A broker's watch stream gets stuck while its requests still work: its events come
    #: late, after newer news from replies.
    stale_watches: int = 0
    #: Not a fault: an operator asks the master to hand its role to another broker
    #: (``failover-elect``), at any moment, naming any broker (in the set or not).
    handovers: int = 0

    def total(self) -> int:
        return sum(attrs.astuple(self))


@attrs.frozen
class FailoverConfig:
    """One named failover world: its size, the settings under test, and the fault budgets."""

    name: str
    doc: str
    brokers: int = 2
    #: Puts the producers make in total.
    messages: int = 2
    #: Start from a running group (broker 1 master at epoch 1, the others following) with
    #: this SyncStateSet, or from an empty etcd (``()``: the group's first election).
    initial_sss: tuple[int, ...] = (1, 2)
    #: In the running group, the slaves not in the set have not connected yet.
    lagging_outside_sss: bool = True
    # --- the settings under test (RocketMQ's names) ---
    min_in_sync_replicas: int = 1
    all_ack_in_sync_state_set: bool = True
    enable_elect_unclean_master: bool = False
    #: A slave acknowledges only flushed bytes (trioha's ``ha_slave_ack_flushed``); the
    #: master counts its own copy once flushed (every put is flushed at once here).
    ack_flushed: bool = True
    lease_ttl: int = 2
    ha_max_time_slave_not_catchup: int = 2000
    tick: int = 1000
    unsafe: Unsafe = attrs.field(factory=Unsafe)
    # --- known-bad data-plane twins ---
    #: A slave that (re)connects cuts its log to the highest confirm offset it has heard of
    #: (a high watermark) instead of the epochs' consistent point.
    truncate_to_high_watermark: bool = False
    #: The put's completion asks only "every member holds it", not ``minInSyncReplicas``.
    min_in_sync_before_append_only: bool = False
    #: A keepalive's reply travels as a message (a cut or a pause may hold it up after etcd
    #: renewed the lease); otherwise it arrives with the request's effect, at once.
    keepalive_replies_travel: bool = False
    faults: FailoverFaults = attrs.field(factory=FailoverFaults)
    #: Known-bad configurations: the property that must fail.
    expect: str | None = None
    #: Bounded liveness: a master can acknowledge within this many fault-free steps.
    liveness_bound: int | None = None
    #: Kept for the shared ``--no-symmetry`` switch; the failover world has no symmetry.
    symmetry: bool = False

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.brokers <= 4:
            raise ValueError("the failover world has one to four brokers")
        if any(not 1 <= b <= self.brokers for b in self.initial_sss):
            raise ValueError(f"initial_sss names a broker beyond {self.brokers}")
        if self.initial_sss and 1 not in self.initial_sss:
            raise ValueError("broker 1 starts as master, so it is in the initial set")

    def options(self, broker_id: int) -> FailoverOptions:
        return FailoverOptions(
            broker_id,
            KEYS,
            broker_addr=f"b{broker_id}",
            ha_addr=f"b{broker_id}:ha",
            lease_ttl=self.lease_ttl,
            ha_max_time_slave_not_catchup=self.ha_max_time_slave_not_catchup,
            enable_elect_unclean_master=self.enable_elect_unclean_master,
            unsafe=self.unsafe,
        )


class Role(enum.Enum):
    """What a broker's data plane is doing."""

    NONE = "none"
    MASTER = "master"
    SLAVE = "slave"


@attrs.frozen(cache_hash=True)
class Broker:
    """One broker: its control core and its data plane (index ``i`` is broker id ``i + 1``)."""

    core: ReplicaState
    up: bool = True
    paused: bool = False
    # --- the data plane ---
    role: Role = Role.NONE
    #: The epoch it serves (master) or was told to follow (slave).
    epoch: int = 0
    log: tuple[Entry, ...] = ()
    flushed: int = 0
    #: The epoch file (durable).
    epochs: EpochHistory = attrs.field(factory=EpochHistory)
    #: Slave: the broker id it follows (0: none).
    leader: int = 0
    #: Slave: streaming from its leader: ``(served_from, acked)`` of its connection.
    link: tuple[int, int] | None = None
    #: Slave: the highest confirm offset heard from a master (the high-watermark twin).
    hw: int = 0
    # --- master side ---
    #: The brokers the ack rule waits for (``SetSyncStateSet``).
    sss: frozenset[int] = frozenset()
    #: Acknowledge while ``now < ack_until`` (``Unfence``; 0: fenced).
    ack_until: int = 0
    #: Sync puts waiting: ``(start, end, message id)``.
    pending: tuple[tuple[int, int, int], ...] = ()
    #: The end of the last put answered PUT_OK (the master's confirm offset).
    confirm: int = 0
    #: Watch events not yet delivered (None: no watch open).
    watch: tuple[WatchEvent, ...] | None = None

    @property
    def end(self) -> int:
        return len(self.log)

    def last_epoch(self) -> int:
        return self.epochs.last_epoch


class MsgKind(enum.Enum):
    REQUEST = "request"
    REPLY = "reply"


@attrs.frozen(cache_hash=True)
class Msg:
    """A request on its way to the coordinator, or a reply on its way back.

    ``request_id`` 0 marks a request whose sender crashed since: it may still land, and its
    reply goes nowhere.
    """

    kind: MsgKind
    broker: int
    request_id: int
    purpose: Purpose
    payload: Request | Response

    def sort_key(self) -> tuple[str, int, int, str]:
        """An order for the bag; ties (orphaned requests) are broken by :func:`sort_net`."""
        return (self.kind.value, self.broker, self.request_id, self.purpose.value)


def sort_net(msgs: list[Msg] | tuple[Msg, ...]) -> tuple[Msg, ...]:
    """The bag in one order that depends only on its contents (so the world's form is one)."""
    out = sorted(msgs, key=Msg.sort_key)
    for a, b in itertools.pairwise(out):
        if a.sort_key() == b.sort_key() and a != b:
            return tuple(sorted(out, key=lambda m: (m.sort_key(), hash(m.payload))))
    return tuple(out)


@attrs.frozen(order=True)
class Acked:
    """A put answered PUT_OK (a ghost for the properties)."""

    offset: int
    entry: Entry
    #: Who answered it, and the coordinator's master key epoch at that moment.
    broker: int
    coordinator_epoch: int


@attrs.frozen(cache_hash=True)
class FailoverWorld:
    """Everything: the coordinator, the brokers, the messages, the cuts, the ghosts."""

    etcd: EtcdState
    brokers: tuple[Broker, ...]
    #: Messages in flight, sorted (a bag: any may be delivered next).
    net: tuple[Msg, ...] = ()
    #: Brokers (indexes) cut off from the coordinator.
    cut: frozenset[int] = frozenset()
    #: Data-plane links down: pairs of broker indexes, low first.
    down: frozenset[tuple[int, int]] = frozenset()
    #: Brokers (indexes) whose watch stream is stuck: its events wait, replies still come.
    stalled: frozenset[int] = frozenset()
    puts: int = 0
    acked: tuple[Acked, ...] = ()
    budget: FailoverFaults = attrs.field(factory=FailoverFaults)

    def master_key(self) -> tuple[int, int, int] | None:
        return master_key(self.etcd)

    def coordinator_sss(self) -> frozenset[int]:
        kv = self.etcd.get(KEYS.sync_state_set)
        if kv is None:
            return frozenset()
        members = _SSS_CACHE.get(kv.value)
        if members is None:
            members = _SSS_CACHE[kv.value] = SyncStateSet.decode(kv.key, kv.value).members
        return members

    def counter(self) -> int:
        kv = self.etcd.get(KEYS.epoch)
        return int(kv.value) if kv is not None else 0


def master_key(etcd: EtcdState) -> tuple[int, int, int] | None:
    """The coordinator's master: ``(broker id, epoch, create_revision)``, or None."""
    kv = etcd.get(KEYS.master)
    if kv is None:
        return None
    record = _MASTER_CACHE.get(kv.value)
    if record is None:
        record = _MASTER_CACHE[kv.value] = MasterRecord.decode(kv.key, kv.value)
    return record.broker_id, record.epoch, kv.create_revision


_MASTER_CACHE: dict[bytes, MasterRecord] = {}
_SSS_CACHE: dict[bytes, frozenset[int]] = {}
