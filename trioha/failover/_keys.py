"""Where a broker group keeps its state in etcd, and how each value is written.

One group (a RocketMQ *broker name*: one master and its slaves) owns every key under one
prefix, ``<root>/<cluster>/<brokerName>/`` (``/trioha/DefaultCluster/broker-a/`` by default):

=====================  ===========================================  =========================
key                    value                                        bound to
=====================  ===========================================  =========================
``master``             :class:`MasterRecord`: the master's broker   the master's lease
                       id, addresses and epoch
``epoch``              the last epoch handed out, a decimal number  nothing (it never goes)
``syncStateSet``       :class:`SyncStateSet`: the members and the   nothing
                       set's own version
``brokers/<id>``       :class:`Registration`: a broker's            that broker's lease
                       addresses, last epoch and max offset
``handover``           :class:`Handover`: an operator's request     the requester's lease
                       to hand the master role to one member, and
                       how far it got
=====================  ===========================================  =========================

Values are compact JSON with RocketMQ's camelCase names (the epoch counter is a bare decimal),
so ``etcdctl get --prefix /trioha/`` is readable. Decoding is strict: anything else raises
:class:`~trioha._errors.CoordinatorDataError` naming the key and what was wrong, and the control
core treats that key as unreadable (it never campaigns or changes the set over a value it
cannot read).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable
from typing import Any

import attrs

from trioha._errors import CoordinatorDataError

__all__ = [
    "GroupKeys",
    "Handover",
    "HandoverState",
    "MasterRecord",
    "Registration",
    "SyncStateSet",
    "decode_epoch",
    "encode_epoch",
]

_NAME = re.compile(r"[A-Za-z0-9_.:%@-]+")


def _check_name(what: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} cannot be part of an etcd key: use letters, digits and "
            "_ . : % @ - only (no '/')"
        )
    return value


@attrs.frozen
class GroupKeys:
    """The keys of one broker group (see the module docstring)."""

    prefix: bytes

    @classmethod
    def of(cls, cluster: str, broker_name: str, *, root: str = "/trioha") -> GroupKeys:
        """``<root>/<cluster>/<brokerName>/``; *root* may be any absolute path."""
        if not root.startswith("/") or "//" in root:
            raise ValueError(
                f"the failover key root {root!r} must be an absolute path like /trioha"
            )
        _check_name("the cluster name", cluster)
        _check_name("the broker name", broker_name)
        return cls(f"{root.rstrip('/')}/{cluster}/{broker_name}/".encode())

    @property
    def master(self) -> bytes:
        return self.prefix + b"master"

    @property
    def epoch(self) -> bytes:
        return self.prefix + b"epoch"

    @property
    def sync_state_set(self) -> bytes:
        return self.prefix + b"syncStateSet"

    @property
    def handover(self) -> bytes:
        return self.prefix + b"handover"

    @property
    def brokers(self) -> bytes:
        """The prefix of every registration."""
        return self.prefix + b"brokers/"

    def broker(self, broker_id: int) -> bytes:
        return self.brokers + str(broker_id).encode()

    def broker_id_of(self, key: bytes) -> int | None:
        """The broker id a registration key names; None for any other key."""
        if not key.startswith(self.brokers):
            return None
        tail = key[len(self.brokers) :]
        if not tail.isdigit() or (len(tail) > 1 and tail.startswith(b"0")):
            return None
        return int(tail)


# --- values -----------------------------------------------------------------------------------


def _load(key: bytes, raw: bytes, fields: dict[str, type]) -> dict[str, Any]:
    where = key.decode(errors="replace")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CoordinatorDataError(f"etcd key {where}: not JSON ({exc}): {raw[:80]!r}") from None
    if not isinstance(value, dict):
        raise CoordinatorDataError(f"etcd key {where}: expected a JSON object, got {raw[:80]!r}")
    missing = sorted(set(fields) - set(value))
    if missing:
        raise CoordinatorDataError(
            f"etcd key {where}: missing {', '.join(missing)} in {raw[:80]!r}"
        )
    for name, kind in fields.items():
        item = value[name]
        if kind is int and (not isinstance(item, int) or isinstance(item, bool) or item < 0):
            raise CoordinatorDataError(
                f"etcd key {where}: {name} must be a non-negative integer, got {item!r}"
            )
        if kind is str and not isinstance(item, str):
            raise CoordinatorDataError(f"etcd key {where}: {name} must be a string, got {item!r}")
    return value


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


@attrs.frozen
class MasterRecord:
    """The ``master`` key: who is master, where to reach it, and its epoch."""

    broker_id: int
    epoch: int
    broker_addr: str = ""
    ha_addr: str = ""

    def encode(self) -> bytes:
        return _dump(
            {
                "brokerId": self.broker_id,
                "epoch": self.epoch,
                "brokerAddr": self.broker_addr,
                "haAddr": self.ha_addr,
            }
        )

    @classmethod
    def decode(cls, key: bytes, raw: bytes) -> MasterRecord:
        v = _load(key, raw, {"brokerId": int, "epoch": int, "brokerAddr": str, "haAddr": str})
        return cls(v["brokerId"], v["epoch"], v["brokerAddr"], v["haAddr"])


def _members(value: Iterable[int]) -> frozenset[int]:
    return frozenset(value)


@attrs.frozen
class SyncStateSet:
    """The ``syncStateSet`` key: the brokers that hold every acknowledged write.

    *version* counts the changes (RocketMQ's ``syncStateSetEpoch``); *master_epoch* is the
    epoch of the master that wrote it (for people reading it; the control core compares
    revisions, never these numbers).
    """

    members: frozenset[int] = attrs.field(converter=_members)
    version: int
    master_epoch: int = 0

    def encode(self) -> bytes:
        return _dump(
            {
                "members": sorted(self.members),
                "version": self.version,
                "masterEpoch": self.master_epoch,
            }
        )

    @classmethod
    def decode(cls, key: bytes, raw: bytes) -> SyncStateSet:
        v = _load(key, raw, {"version": int, "masterEpoch": int})
        members = v.get("members")
        where = key.decode(errors="replace")
        if not isinstance(members, list) or not all(
            isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in members
        ):
            raise CoordinatorDataError(
                f"etcd key {where}: members must be a list of positive broker ids, got {members!r}"
            )
        if not members:
            raise CoordinatorDataError(f"etcd key {where}: an empty SyncStateSet names no broker")
        return cls(frozenset(members), v["version"], v["masterEpoch"])


@attrs.frozen
class Registration:
    """A ``brokers/<id>`` key: a live broker, where to reach it, and how far its log goes.

    *epoch* and *max_offset* rank candidates when the master key is vacant: the greatest
    ``(epoch, max_offset)`` among the live SyncStateSet members wins.
    """

    broker_id: int
    epoch: int
    max_offset: int
    broker_addr: str = ""
    ha_addr: str = ""

    def encode(self) -> bytes:
        return _dump(
            {
                "brokerId": self.broker_id,
                "epoch": self.epoch,
                "maxOffset": self.max_offset,
                "brokerAddr": self.broker_addr,
                "haAddr": self.ha_addr,
            }
        )

    @classmethod
    def decode(cls, key: bytes, raw: bytes) -> Registration:
        v = _load(
            key,
            raw,
            {"brokerId": int, "epoch": int, "maxOffset": int, "brokerAddr": str, "haAddr": str},
        )
        return cls(v["brokerId"], v["epoch"], v["maxOffset"], v["brokerAddr"], v["haAddr"])


class HandoverState(enum.Enum):
    """How far a handover got (the ``state`` field of the ``handover`` key)."""

    #: Written by the operator's command: the master of *epoch* is asked to hand over.
    REQUESTED = "requested"
    #: Written by that master: it stopped acknowledging, the target holds its whole log, and
    #: the master key is gone; only the target campaigns while this stands.
    RELEASED = "released"
    #: Written by that master: it will not hand over (``reason`` says why) and acknowledges
    #: again.
    REFUSED = "refused"


@attrs.frozen
class Handover:
    """The ``handover`` key: hand the master role of *epoch* to broker *target* on purpose.

    Mirrors what ``mqadmin electMaster`` asks of RocketMQ 5.x's controller, in etcd's terms
    (docs/failover.md, "Handing the master role over"). *timeout_ms* bounds how long the
    master may stay fenced waiting for the target to catch up.
    """

    target: int
    epoch: int
    state: HandoverState = HandoverState.REQUESTED
    timeout_ms: int = 5000
    reason: str = ""

    def encode(self) -> bytes:
        return _dump(
            {
                "target": self.target,
                "epoch": self.epoch,
                "state": self.state.value,
                "timeoutMs": self.timeout_ms,
                "reason": self.reason,
            }
        )

    @classmethod
    def decode(cls, key: bytes, raw: bytes) -> Handover:
        v = _load(
            key,
            raw,
            {"target": int, "epoch": int, "state": str, "timeoutMs": int, "reason": str},
        )
        try:
            state = HandoverState(v["state"])
        except ValueError:
            where = key.decode(errors="replace")
            known = ", ".join(s.value for s in HandoverState)
            raise CoordinatorDataError(
                f"etcd key {where}: state must be one of {known}, got {v['state']!r}"
            ) from None
        if v["target"] == 0:
            where = key.decode(errors="replace")
            raise CoordinatorDataError(f"etcd key {where}: target must be a broker id (1 and up)")
        return cls(v["target"], v["epoch"], state, v["timeoutMs"], v["reason"])


def encode_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_epoch(key: bytes, raw: bytes) -> int:
    if not raw.isdigit() or (len(raw) > 1 and raw.startswith(b"0")):
        where = key.decode(errors="replace")
        raise CoordinatorDataError(
            f"etcd key {where}: the epoch counter must be a decimal number, got {raw[:40]!r}"
        )
    return int(raw)
