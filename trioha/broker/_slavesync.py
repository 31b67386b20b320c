"""Metadata replication from master to slave (``SlaveSynchronize``, docs/rocketmq-protocol.md §6.1).

Every 10 s (first after 3 s) a slave asks its master's broker port for the topic table (21),
consumer offsets (43), delay offsets (45) and subscription groups (201), and stores them under
``<root>/config/`` in RocketMQ's file format. Where trioha differs from RocketMQ 4.x:

* consumer offsets are merged per queue keeping the larger one, so a restarted master with
  stale offsets does not roll the slave back (RocketMQ #1094);
* the master's bodies are parsed leniently, so a Java master (fastjson, unquoted integer map
  keys) works as well as a trioha one;
* each step is independent: one failing step is logged and the others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from trioha._errors import RemotingError
from trioha.broker._metadata import Metadata
from trioha.remoting import (
    RemotingClientPool,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    loads_lenient,
)

log = logging.getLogger("trioha.broker.slavesync")

INITIAL_DELAY = 3.0
PERIOD = 10.0
#: Seconds between asks for the master's log end (one small request).
MASTER_END_PERIOD = 1.0
#: Each step's request timeout (RocketMQ: 3000 ms).
TIMEOUT = 3.0


class SlaveSynchronize:
    """Pulls the master's metadata into ``meta``."""

    def __init__(
        self,
        meta: Metadata,
        pool: RemotingClientPool,
        *,
        own_addr: str,
        master_addr: str | None = None,
        on_topics_changed: Callable[[], None] = lambda: None,
        persist: Callable[[], Awaitable[None]] | None = None,
        on_master_end: Callable[[int], None] | None = None,
    ) -> None:
        self.meta = meta
        self.pool = pool
        self.own_addr = own_addr
        self.master_addr = master_addr
        self.on_topics_changed = on_topics_changed
        self.persist = persist
        #: Told the master's commit log end (its runtime info) at each sync: the slave's
        #: bytes behind and catch-up ETA are measured against it.
        self.on_master_end = on_master_end
        self.syncs = 0
        self.last_error: str | None = None

    async def _fetch(self, code: int) -> bytes:
        assert self.master_addr is not None
        with trio.fail_after(TIMEOUT):
            response = await self.pool.request(self.master_addr, RemotingCommand.request(code))
        if response.code != ResponseCode.SUCCESS:
            raise RemotingError(
                f"master {self.master_addr} answered request {code} with code "
                f"{response.code}: {response.remark}",
                code=response.code,
            )
        return response.body

    async def _json(self, code: int) -> dict[str, Any]:
        value = loads_lenient(await self._fetch(code))
        if not isinstance(value, dict):
            raise ValueError(f"the master's answer to request {code} is not a JSON object")
        return value

    async def sync_all(self) -> bool:
        """``syncAll``: the four steps in RocketMQ's order; True if all succeeded."""
        if not self.master_addr or self.master_addr == self.own_addr:
            return False
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("topic config", self._sync_topics),
            ("consumer offsets", self._sync_offsets),
            ("delay offsets", self._sync_delay),
            ("subscription groups", self._sync_groups),
        ]
        ok = True
        for name, step in steps:
            try:
                await step()
            except (RemotingError, trio.TooSlowError, ValueError, OSError) as exc:
                ok = False
                self.last_error = f"{name}: {exc or 'timeout'}"
                log.warning(
                    "sync of %s from master %s failed: %s", name, self.master_addr, exc or "timeout"
                )
        if ok:
            self.syncs += 1
            self.last_error = None
        return ok

    async def _sync_topics(self) -> None:
        if self.meta.topics.adopt_from_master(await self._json(RequestCode.GET_ALL_TOPIC_CONFIG)):
            log.info("topic config updated from master %s", self.master_addr)
            self.on_topics_changed()

    async def _sync_offsets(self) -> None:
        changed = self.meta.offsets.merge_from_master(
            await self._json(RequestCode.GET_ALL_CONSUMER_OFFSET)
        )
        if changed and self.persist is not None:
            await self.persist()

    async def _sync_delay(self) -> None:
        text = (await self._fetch(RequestCode.GET_ALL_DELAY_OFFSET)).decode("utf-8")
        self.meta.delay.adopt_from_master(text)

    async def _sync_groups(self) -> None:
        if self.meta.groups.adopt_from_master(
            await self._json(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        ):
            log.info("subscription groups updated from master %s", self.master_addr)

    async def sync_master_end(self) -> bool:
        """Learn the master's log end from GET_BROKER_RUNTIME_INFO's ``commitLogMaxOffset``
        (trioha's own; RocketMQ's slave does not ask). True if learned."""
        if self.on_master_end is None or not self.master_addr:
            return False
        try:
            await self._master_end()
        except (RemotingError, trio.TooSlowError, ValueError, OSError) as exc:
            log.debug(
                "cannot learn the log end of master %s: %s", self.master_addr, exc or "timeout"
            )
            return False
        return True

    async def _master_end(self) -> None:
        assert self.on_master_end is not None
        table = (await self._json(RequestCode.GET_BROKER_RUNTIME_INFO)).get("table", {})
        try:
            end = int(table["commitLogMaxOffset"])
        except (KeyError, TypeError, ValueError):
            raise ValueError("the master's runtime info has no commitLogMaxOffset") from None
        self.on_master_end(end)

    async def run(self) -> NoReturn:
        async with trio.open_nursery() as nursery:
            if self.on_master_end is not None:
                nursery.start_soon(self._watch_master_end)
            await trio.sleep(INITIAL_DELAY)
            while True:
                await self.sync_all()
                await trio.sleep(PERIOD)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _watch_master_end(self) -> NoReturn:
        """The master's log end, every ``MASTER_END_PERIOD``: what a catch-up's ETA needs."""
        while True:
            await self.sync_master_end()
            await trio.sleep(MASTER_END_PERIOD)
