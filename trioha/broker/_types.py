"""What the client side needs from a broker: exactly this, and nothing more.

A message crosses this boundary typed, as the store's :class:`~trioha.store.NewMessage`, and
only so; :func:`producer_properties` gives its properties the way a producer describes them
(tags, keys).

``trioha.broker.Broker`` satisfies :class:`BrokerLike`; the tests use a small fake over a real
commit log. Keeping the surface this narrow lets the remoting layer be tested without HA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from trioha._config import BrokerConfig
from trioha._status import PutResult, PutStatus
from trioha.store import PROPERTY_KEYS, PROPERTY_TAGS, NewMessage


class CommitLogLike(Protocol):
    """The reading half of ``trioha.store.CommitLog``."""

    @property
    def segment_size(self) -> int: ...

    @property
    def min_offset(self) -> int: ...

    @property
    def max_offset(self) -> int: ...

    @property
    def flushed_offset(self) -> int: ...

    def read(self, offset: int, max_bytes: int) -> memoryview | bytes:
        """Up to ``max_bytes`` written bytes from ``offset``, within one segment."""

    def floor_queue_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Raise the next queue offsets to at least these (the consume queues' ends)."""


class StoreLike(Protocol):
    @property
    def root(self) -> Path: ...

    @property
    def commitlog(self) -> CommitLogLike: ...


class BrokerLike(Protocol):
    """The broker as the client side uses it (see ``trioha.broker.Broker``)."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> StoreLike: ...

    @property
    def ha_address(self) -> tuple[str, int] | None:
        """Where the HA service listens (a master), advertised to the name server."""

    @property
    def config_file(self) -> Path | None:
        """The ``-c`` file the broker was started with (None: none)."""

    def update_config(self, config: BrokerConfig) -> None:
        """Run with *config* from now on (UPDATE_BROKER_CONFIG; ``_liveconfig.LIVE_KEYS``)."""

    def delete_expired_commitlog(self) -> bool:
        """Have retention delete expired commit log files now (its next 20 runs); False while
        retention does not run."""

    def clean_expired_consume_queues(self) -> bool:
        """Destroy consume queues whose messages are all gone; False while retention does not
        run."""

    async def put(self, message: NewMessage) -> PutResult:
        """Store one message; the status says whether and how (see ``Broker.put``)."""

    async def put_batch(
        self, messages: Sequence[NewMessage], *, delivery: bool = False
    ) -> PutResult:
        """Store messages; ``delivery``: a delayed message's delivery (see ``Broker``)."""

    def append_each(self, puts: Sequence[Sequence[NewMessage]]) -> list[PutResult]:
        """Append independent puts (a message, or a batch's messages) without waiting; one
        result per put."""

    async def wait_stored(self, start: int, end: int) -> PutStatus:
        """Wait for the flush and replication policies to cover ``[start, end)``."""

    def count_puts(self, status: PutStatus, messages: int, seconds: float) -> None:
        """Count *messages* puts answered *status* after *seconds* (``statistics()``)."""

    async def wait_log_grew(self, beyond_offset: int) -> Any:
        """Return once the commit log's max offset exceeds ``beyond_offset``."""

    def statistics(self) -> Any:
        """A frozen attrs record of the broker's figures (reported by ``status``)."""


def producer_properties(
    properties: Mapping[str, str] | None = None,
    *,
    tags: str | None = None,
    keys: str | Sequence[str] | None = None,
) -> dict[str, str]:
    """A message's properties as a producer sets them: ``Message.setTags`` and
    ``Message.setKeys`` (several keys joined by spaces) over *properties*."""
    props = dict(properties or {})
    if keys:
        props[PROPERTY_KEYS] = keys if isinstance(keys, str) else " ".join(keys)
    if tags:
        props[PROPERTY_TAGS] = tags
    return props
