"""What a broker knows of its group's keys in etcd, and how news is merged into it.

News comes in three shapes, in any order and possibly more than once: a snapshot (the reply
of a read, or the range inside a transaction's reply), a watch event, and the revision a reply
was made at. Each key remembers the revision its knowledge is *as of*; news about a key counts
only if it is newer than that, so a stale or duplicated watch event, or a snapshot that was
overtaken by the watch, changes nothing. A key deleted at revision *r* stays known as deleted
at *r*, so an older put cannot bring it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import attrs

from trioha._errors import CoordinatorDataError
from trioha.failover._etcd import EventType, KeyValue, WatchEvent
from trioha.failover._keys import (
    GroupKeys,
    Handover,
    MasterRecord,
    Registration,
    SyncStateSet,
    decode_epoch,
)

__all__ = ["Entry", "GroupView"]

T = TypeVar("T")


@attrs.frozen(cache_hash=True)
class Entry(Generic[T]):
    """One key as known *as of* a revision.

    ``value`` keeps the last decoded value even after the key is deleted (``present`` False);
    ``error`` says why a present value could not be decoded (its ``value`` is then the last
    good one, or None).
    """

    as_of: int = 0
    present: bool = False
    value: T | None = None
    create_revision: int = 0
    mod_revision: int = 0
    lease: int = 0
    error: str = ""

    @property
    def current(self) -> T | None:
        """The value if the key exists and could be read, else None."""
        return self.value if self.present and not self.error else None

    def news(
        self, revision: int, kv: KeyValue | None, decode: Callable[[bytes, bytes], T]
    ) -> Entry[T]:
        """This entry after learning that, as of *revision*, the key is *kv* (None: absent).

        A present key is known as of its ``mod_revision`` (nothing about it changed since),
        an absent one as of the revision that showed it absent.
        """
        if revision <= self.as_of:
            return self
        if kv is None:
            return Entry(revision, False, self.value)
        if kv.mod_revision <= self.as_of:
            return self
        try:
            value: T | None = decode(kv.key, kv.value)
            error = ""
        except CoordinatorDataError as exc:
            value, error = self.value, str(exc)
        return Entry(
            kv.mod_revision, True, value, kv.create_revision, kv.mod_revision, kv.lease, error
        )


_EMPTY: Entry[object] = Entry()


def _empty() -> Entry[T]:
    return _EMPTY  # type: ignore[return-value]


@attrs.frozen(cache_hash=True)
class GroupView:
    """The group's keys as this broker knows them (module docstring)."""

    master: Entry[MasterRecord] = attrs.field(factory=_empty)
    epoch: Entry[int] = attrs.field(factory=_empty)
    sss: Entry[SyncStateSet] = attrs.field(factory=_empty)
    #: Registrations by broker id, in id order (deleted ones kept, as deleted).
    brokers: tuple[tuple[int, Entry[Registration]], ...] = ()
    #: An operator's request to hand the master role over (``_keys.Handover``).
    handover: Entry[Handover] = attrs.field(factory=_empty)

    def broker(self, broker_id: int) -> Entry[Registration]:
        for bid, entry in self.brokers:
            if bid == broker_id:
                return entry
        return _empty()

    def live(self) -> dict[int, Entry[Registration]]:
        """Registrations that exist now (their broker's lease is alive), by broker id."""
        return {bid: e for bid, e in self.brokers if e.present}

    def counter(self) -> int:
        """The epoch counter's value (0 while the key does not exist)."""
        return self.epoch.current or 0

    # --- merging news ------------------------------------------------------------------------
    def snapshot(self, keys: GroupKeys, revision: int, kvs: Iterable[KeyValue]) -> GroupView:
        """Merge a read of the whole prefix made at *revision*."""
        found = {kv.key: kv for kv in kvs}
        brokers = dict(self.brokers)
        for key in found:
            bid = keys.broker_id_of(key)
            if bid is not None:
                brokers.setdefault(bid, _empty())
        handover = self.handover
        if keys.handover in found or handover.as_of:
            # A group that never saw a handover keeps the empty entry: reading the key absent
            # tells nothing new, and the view stays the same value it always was. (A stale
            # watch event could then show a request that a later event withdraws; the key
            # only decides who goes first, and every campaign compares it.)
            handover = handover.news(revision, found.get(keys.handover), Handover.decode)
        return GroupView(
            self.master.news(revision, found.get(keys.master), MasterRecord.decode),
            self.epoch.news(revision, found.get(keys.epoch), decode_epoch),
            self.sss.news(revision, found.get(keys.sync_state_set), SyncStateSet.decode),
            tuple(
                (bid, e.news(revision, found.get(keys.broker(bid)), Registration.decode))
                for bid, e in sorted(brokers.items())
            ),
            handover,
        )

    def event(self, keys: GroupKeys, event: WatchEvent) -> GroupView:
        """Merge one watch event (ignored when not newer than what is known of its key)."""
        kv = event.kv if event.type is EventType.PUT else None
        revision = event.revision
        key = event.kv.key
        if key == keys.master:
            return attrs.evolve(self, master=self.master.news(revision, kv, MasterRecord.decode))
        if key == keys.epoch:
            return attrs.evolve(self, epoch=self.epoch.news(revision, kv, decode_epoch))
        if key == keys.sync_state_set:
            return attrs.evolve(self, sss=self.sss.news(revision, kv, SyncStateSet.decode))
        if key == keys.handover:
            return attrs.evolve(self, handover=self.handover.news(revision, kv, Handover.decode))
        bid = keys.broker_id_of(key)
        if bid is None:
            return self
        entries = dict(self.brokers)
        entries[bid] = entries.get(bid, _empty()).news(revision, kv, Registration.decode)
        return attrs.evolve(self, brokers=tuple(sorted(entries.items())))

    def events(self, keys: GroupKeys, events: Iterable[WatchEvent]) -> GroupView:
        view = self
        for event in events:
            view = view.event(keys, event)
        return view
