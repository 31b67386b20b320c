"""The broker port's dispatcher: one request code, one RocketMQ processor.

RocketMQ registers a processor per group of request codes with its remoting server
(``BrokerController.registerProcessor``); :class:`BrokerProcessor` does the same with the
processors in this package, each named after the RocketMQ class it mirrors and keeping
RocketMQ's response codes and remarks, because clients branch on them:

=========================  =====================================================
``_send``                  ``SendMessageProcessor``: sends, batches, send-backs
``_pull``                  ``PullMessageProcessor`` with long polling
``_offsets``               ``ConsumerManageProcessor``: consumer offsets, members
``_clientmanage``          ``ClientManageProcessor``: heartbeats, unregistration
``_query``                 ``QueryMessageProcessor``: messages by id or key
``_admin``                 ``AdminBrokerProcessor``: topics, tables, runtime info,
                           settings changed at run time (``_liveconfig``)
``_clientcalls``           ``AdminBrokerProcessor`` through ``Broker2Client``: offset
                           resets and running info, asked of the consumers
=========================  =====================================================

Where trioha differs, the handler says so: a slave refuses sends before any topic is
auto-created (its tables come from its master). :class:`VipChannelProcessor` serves the VIP
channel (``listen_port - 2``) with the same processors minus pulls, as RocketMQ registers them,
and takes a read's sends together as the broker port does.

Requests are counted here (served, latency by code) except sends, which
``SendMessageProcessor`` counts where it answers them, alone or a read's together.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence

import trio

from trioha._histogram import LatencyHistogram
from trioha.broker._admin import AdminBrokerProcessor
from trioha.broker._clientcalls import ClientCallsProcessor
from trioha.broker._clientmanage import ClientManageProcessor
from trioha.broker._clients import ClientManager
from trioha.broker._context import BrokerContext, Handler
from trioha.broker._metadata import Metadata
from trioha.broker._offsets import ConsumerManageProcessor
from trioha.broker._pull import PullMessageProcessor
from trioha.broker._query import QueryMessageProcessor
from trioha.broker._reput import ReputService
from trioha.broker._send import SENDS, SendMessageProcessor
from trioha.broker._types import BrokerLike
from trioha.remoting import Burst, RemotingCommand, RemotingConnection, RequestCode, ResponseCode

log = logging.getLogger("trioha.broker")

#: The thread pool each request code runs in on a Java broker (``BrokerController``'s
#: ``sendMessageExecutor`` and friends), for the runtime info's queue figures.
_POOLS: dict[int, str] = {
    RequestCode.SEND_MESSAGE: "send",
    RequestCode.SEND_MESSAGE_V2: "send",
    RequestCode.SEND_BATCH_MESSAGE: "send",
    RequestCode.CONSUMER_SEND_MSG_BACK: "send",
    RequestCode.PULL_MESSAGE: "pull",
    RequestCode.QUERY_MESSAGE: "query",
    RequestCode.VIEW_MESSAGE_BY_ID: "query",
    RequestCode.END_TRANSACTION: "transaction",
}


class BrokerProcessor:
    """Answers the broker port's requests by handing each to its processor."""

    def __init__(
        self,
        broker: BrokerLike,
        meta: Metadata,
        reput: ReputService,
        *,
        broker_addr: str,
        nursery: trio.Nursery,
        clients: ClientManager | None = None,
        on_topics_changed: Callable[[], None] = lambda: None,
        extra_info: Callable[[], dict[str, str]] = dict,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.ctx = BrokerContext(
            broker,
            meta,
            reput,
            broker_addr=broker_addr,
            nursery=nursery,
            clients=clients,
            on_topics_changed=on_topics_changed,
            extra_info=extra_info,
            clock=clock,
        )
        self.send = SendMessageProcessor(self.ctx)
        self.pull = PullMessageProcessor(self.ctx)
        self.offsets = ConsumerManageProcessor(self.ctx)
        self.client_manage = ClientManageProcessor(self.ctx)
        self.query = QueryMessageProcessor(self.ctx)
        self.admin = AdminBrokerProcessor(self.ctx)
        self.client_calls = ClientCallsProcessor(self.ctx)
        self._handlers: dict[int, Handler] = {}
        for processor in (
            self.send,
            self.pull,
            self.offsets,
            self.client_manage,
            self.query,
            self.admin,
            self.client_calls,
        ):
            self._handlers.update(processor.handlers())

    # The state the client side reads or fills in after the port is bound.
    @property
    def clients(self) -> ClientManager:
        return self.ctx.clients

    @property
    def served(self) -> dict[str, int]:
        return self.ctx.served

    @property
    def latency(self) -> dict[str, LatencyHistogram]:
        return self.ctx.latency

    @property
    def broker_addr(self) -> str:
        return self.ctx.broker_addr

    @broker_addr.setter
    def broker_addr(self, value: str) -> None:
        self.ctx.broker_addr = value

    @property
    def extra_info(self) -> Callable[[], dict[str, str]]:
        return self.ctx.extra_info

    @extra_info.setter
    def extra_info(self, value: Callable[[], dict[str, str]]) -> None:
        self.ctx.extra_info = value

    @property
    def is_slave(self) -> bool:
        return self.ctx.is_slave

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        begun = time.perf_counter()
        handler = self._handlers.get(request.code)
        if handler is None:
            log.debug("%s: request code %d not supported", connection.peer, request.code)
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request.code} not supported",
            )
        pool = _POOLS.get(request.code)
        if pool is None:
            result = await handler(request, connection)
        else:
            in_flight = self.ctx.in_flight[pool]
            task = trio.lowlevel.current_task()
            in_flight[task] = time.monotonic()
            try:
                result = await handler(request, connection)
            finally:
                in_flight.pop(task, None)
        if result is not None and request.code not in SENDS:  # sends count themselves
            name = RequestCode(request.code).name
            self.ctx.served[f"{name}.{result.code}"] += 1
            self.ctx.latency[name].observe(time.perf_counter() - begun)
        return result

    def take_burst(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        """The sends of one read, answered together (``SendMessageProcessor.take_sends``)."""
        return self.send.take_sends(requests, connection)

    def connection_closed(self, connection: Hashable) -> None:
        """``ClientHousekeepingService.onChannelClose``."""
        self.client_manage.connection_closed(connection)

    def scan_not_active(self) -> None:
        """``ClientHousekeepingService.scanExceptionChannel``."""
        self.client_manage.scan_not_active()


class VipChannelProcessor:
    """The VIP channel's processor (``registerProcessor`` on ``fastRemotingServer``).

    RocketMQ registers every processor on the VIP port except ``PullMessageProcessor``; a pull
    sent there falls to the admin processor's default and is refused as not supported.
    """

    def __init__(self, processor: BrokerProcessor) -> None:
        self.processor = processor

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        if request.code == RequestCode.PULL_MESSAGE:
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f" request type {request.code} not supported",
            )
        return await self.processor.handle_request(request, connection)

    def take_burst(
        self, requests: Sequence[RemotingCommand], connection: RemotingConnection
    ) -> Burst | None:
        """The sends of one read, answered together, as on the broker port."""
        return self.processor.take_burst(requests, connection)
