"""Name server registration (``BrokerOuterAPI.registerBrokerAll``/``unregisterBrokerAll``).

A broker registers with every name server at start, again every
``register_name_server_period`` (clamped to 10–60 s as RocketMQ does) and at once whenever its
topic table changes (auto-creation, a new retry topic). The connection to each name server
stays open: a name server that sees it close drops the broker at once. A slave learns its
master's broker address and HA address from the response.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from typing import NoReturn

import trio

from trioha._config import BrokerConfig
from trioha._errors import RemotingError
from trioha.broker._metadata import Metadata
from trioha.remoting import (
    RemotingClientPool,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    dumps_bytes,
)

log = logging.getLogger("trioha.broker.registration")

#: ``registerBrokerTimeoutMills``: 6 s.
REGISTER_TIMEOUT = 6.0
#: First retry after a failed registration round; doubles up to the period.
RETRY_FIRST = 1.0


def namesrv_addresses(config: BrokerConfig) -> list[str]:
    """``namesrvAddr`` is ``host:port`` entries separated by ``;``."""
    return [a.strip() for a in (config.namesrv_addr or "").split(";") if a.strip()]


class Registrar:
    """Keeps this broker registered with its name servers."""

    def __init__(
        self,
        config: BrokerConfig,
        meta: Metadata,
        pool: RemotingClientPool,
        *,
        broker_addr: str,
        ha_server_addr: str,
        on_master: Callable[[str, str], None] = lambda master, ha: None,
        skip_unregister: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.meta = meta
        self.pool = pool
        self.broker_addr = broker_addr
        self.ha_server_addr = ha_server_addr
        self.on_master = on_master
        self.skip_unregister = set(skip_unregister)
        self.registrations = 0
        self._changed = trio.Event()

    def request(self) -> None:
        """Register again soon (the topic table changed)."""
        self._changed.set()

    def _request(self, code: int) -> RemotingCommand:
        body = b""
        if code == RequestCode.REGISTER_BROKER:
            body = dumps_bytes(
                {"filterServerList": [], "topicConfigSerializeWrapper": self.meta.topics.wrapper()}
            )
        return RemotingCommand.request(
            code,
            {
                "brokerAddr": self.broker_addr,
                "brokerId": self.config.broker_id,
                "brokerName": self.config.broker_name,
                "clusterName": self.config.broker_cluster_name,
                "haServerAddr": self.ha_server_addr,
                "compressed": "false",
                "bodyCrc32": zlib.crc32(body) & 0x7FFFFFFF,
            },
            body,
        )

    async def register_all(self) -> bool:
        """One registration with every name server; failures are logged, not raised.

        Returns whether every name server took it.
        """
        failed: list[str] = []
        async with trio.open_nursery() as nursery:
            for address in namesrv_addresses(self.config):
                nursery.start_soon(self._register_one, address, failed)
        return not failed

    async def _register_one(self, address: str, failed: list[str]) -> None:
        failed.append(address)
        try:
            with trio.fail_after(REGISTER_TIMEOUT):
                response = await self.pool.request(
                    address, self._request(RequestCode.REGISTER_BROKER)
                )
        except (RemotingError, trio.TooSlowError) as exc:
            log.warning("register to name server %s failed: %s", address, exc or "timeout")
            self.pool.close(address)
            return
        if response.code != ResponseCode.SUCCESS:
            log.warning(
                "name server %s refused the registration: code %d %s",
                address,
                response.code,
                response.remark,
            )
            return
        failed.remove(address)
        if self.registrations == 0:
            log.info("registered %s with name server %s", self.broker_addr, address)
        self.registrations += 1
        master = response.field("masterAddr")
        if master:
            self.on_master(master, response.field("haServerAddr") or "")

    async def unregister_all(self) -> None:
        """``unregisterBrokerAll`` on shutdown: best effort, 1 s per name server."""
        for address in namesrv_addresses(self.config):
            if address in self.skip_unregister:
                continue
            with trio.move_on_after(1):
                try:
                    await self.pool.request(address, self._request(RequestCode.UNREGISTER_BROKER))
                except RemotingError as exc:
                    log.debug("unregister from %s failed: %s", address, exc)

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Register now, then every period or on :meth:`request`; unregister when cancelled."""
        period = self.config.registration_period
        retry = RETRY_FIRST
        try:
            ok = await self.register_all()
            task_status.started()
            while True:
                # A failed round is retried sooner (1 s, doubling up to the period): a broker
                # started just before its name server would otherwise stay unknown for 30 s.
                wait = period if ok else min(retry, period)
                retry = RETRY_FIRST if ok else retry * 2
                with trio.move_on_after(wait):
                    await self._changed.wait()
                self._changed = trio.Event()
                ok = await self.register_all()
        finally:
            with trio.CancelScope(shield=True):
                await self.unregister_all()
