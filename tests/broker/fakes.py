"""A broker for the client side's tests: a real file store, puts and growth, no HA.

It implements ``trioha.broker._types.BrokerLike`` the way ``trioha.broker.Broker`` does for an
ASYNC_MASTER; a SLAVE refuses puts and gets its bytes through :meth:`FakeBroker.copy_from`
(what the HA client does, minus the network).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import MessageTooLargeError
from trioha._status import PutResult, PutStatus
from trioha.broker._delaylevels import DEFAULT_MAX_DELAY_LEVEL, apply_delay_levels
from trioha.store import HostAddress, NewMessage, Store, open_store


@attrs.frozen
class FakeStatistics:
    role: str
    min_offset: int
    max_offset: int
    puts: int


class FakeBroker:
    def __init__(self, config: BrokerConfig, store: Store) -> None:
        self.config = config
        self.config_file: Path | None = None
        self.store = store
        self.ha_address: tuple[str, int] | None = None
        self.puts = 0
        self.answered: dict[str, int] = {}
        self._grew = trio.Event()

    async def put(self, message: NewMessage) -> PutResult:
        return await self.put_batch([message])

    async def put_batch(
        self, messages: Sequence[NewMessage], *, delivery: bool = False
    ) -> PutResult:
        if not self.config.broker_role.is_master:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE)
        try:
            if not delivery:
                messages = apply_delay_levels(messages, DEFAULT_MAX_DELAY_LEVEL)
            results = self.store.commitlog.append_batch(messages)
        except (MessageTooLargeError, ValueError):
            return PutResult(PutStatus.MESSAGE_ILLEGAL)
        self.puts += len(results)
        self._notify()
        await trio.lowlevel.checkpoint()
        return PutResult(
            PutStatus.PUT_OK,
            offset=results[0].physical_offset,
            end_offset=results[-1].end_offset,
            queue_offset=results[0].queue_offset,
            msg_id=results[0].msg_id,
        )

    def append_each(self, puts: Sequence[Sequence[NewMessage]]) -> list[PutResult]:
        if not self.config.broker_role.is_master:
            return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE) for _ in puts]
        out = []
        for put in puts:
            try:
                r = self.store.commitlog.append_batch(
                    apply_delay_levels(put, DEFAULT_MAX_DELAY_LEVEL)
                )
            except (MessageTooLargeError, ValueError):
                out.append(PutResult(PutStatus.MESSAGE_ILLEGAL))
                continue
            self.puts += len(r)
            stored = (r[0].physical_offset, r[-1].end_offset, r[0].queue_offset, r[0].msg_id)
            out.append(PutResult(PutStatus.PUT_OK, *stored))
        self._notify()
        return out

    async def wait_stored(self, start: int, end: int) -> PutStatus:
        await trio.lowlevel.checkpoint()
        return PutStatus.PUT_OK

    def count_puts(self, status: PutStatus, messages: int, seconds: float) -> None:
        self.answered[status.name] = self.answered.get(status.name, 0) + messages

    def update_config(self, config: BrokerConfig) -> None:
        self.config = config
        self.store.commitlog.max_message_size = config.max_message_size

    def delete_expired_commitlog(self) -> bool:
        return False

    def clean_expired_consume_queues(self) -> bool:
        return False

    def _notify(self) -> None:
        self._grew.set()
        self._grew = trio.Event()

    async def wait_log_grew(self, beyond_offset: int) -> None:
        while self.store.commitlog.max_offset <= beyond_offset:
            await self._grew.wait()

    def copy_from(self, master: FakeBroker, upto: int | None = None) -> None:
        """Replicate ``master``'s bytes up to ``upto`` (default: all), as the HA client does."""
        source, target = master.store.commitlog, self.store.commitlog
        end = source.max_offset if upto is None else upto
        offset = target.max_offset
        while offset < end:
            chunk = bytes(source.read(offset, min(32768, end - offset)))
            offset = target.append_raw(offset, chunk)
        self._notify()

    def statistics(self) -> FakeStatistics:
        commitlog = self.store.commitlog
        return FakeStatistics(
            self.config.broker_role.value, commitlog.min_offset, commitlog.max_offset, self.puts
        )


@asynccontextmanager
async def open_fake_broker(root: Path, config: BrokerConfig) -> AsyncIterator[FakeBroker]:
    store = open_store(
        root,
        segment_size=config.mapped_file_size_commit_log,
        store_host=HostAddress("127.0.0.1", config.listen_port or 10911),
        max_message_size=config.max_message_size,
    )
    try:
        yield FakeBroker(config, store)
    finally:
        store.close()
