"""The broker's client side as one Trio service: :func:`serve_client_side`.

Started by the broker inside its nursery, it runs, all in one nursery of its own:

* the broker port (``listen_port`` on ``broker_ip1``; port 0 picks a free one, reported
  through ``task_status``) answering the official clients (:mod:`._processor`);
* the VIP channel, ``listen_port - 2`` (RocketMQ's ``fastListenPort``): the same processor
  minus PULL_MESSAGE, where Java slaves fetch the topic table and VIP-enabled clients send;
* the consume queue and message index builder (:mod:`._reput`), on master and slave;
* an embedded name server when ``embedded_namesrv`` is set;
* name server registration when ``namesrv_addr`` is set (:mod:`._registration`);
* on a slave, metadata replication from the master (:mod:`._slavesync`);
* on a master, delayed-message delivery per delay level (:mod:`._schedule`); with automatic
  failover the two follow the broker's role as it changes (:meth:`ClientSide.role_changed`);
* housekeeping: idle clients dropped after 120 s, consumer offsets persisted every 5 s;
* with ``acl_enable``, the ACL check before every request on the broker port and the
  embedded name server, and the ACL file watcher; with ``tls_server_mode``, TLS on both
  ports; the broker's own requests signed with ``acl_access_key`` (docs/security.md).

Metadata is loaded from ``<root>/config`` before the port opens and persisted, with the
consume queues flushed, when the service is cancelled.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from typing import NoReturn

import attrs
import trio

from trioha._config import (
    DEFAULT_NAMESRV_PORT,
    BrokerConfig,
    BrokerRole,
    NamesrvConfig,
    parse_address,
)
from trioha._errors import ConfigError
from trioha.acl import AclGuard, PlainAcl, RequestSigner, Role, TlsAcceptor, client_context
from trioha.broker._delaylevels import parse_delay_levels
from trioha.broker._metadata import Metadata, write_snapshots
from trioha.broker._processor import BrokerProcessor, VipChannelProcessor
from trioha.broker._registration import Registrar, namesrv_addresses
from trioha.broker._reput import CHECKPOINT_FILE, FLUSH_INTERVAL, ReputService
from trioha.broker._schedule import ScheduleMessageService
from trioha.broker._slavesync import SlaveSynchronize
from trioha.broker._types import BrokerLike
from trioha.namesrv import REGISTRATION_PERIOD, serve_namesrv
from trioha.remoting import (
    ConnectionCounters,
    RemotingClientPool,
    RequestHandler,
    ServerLimits,
    open_client_pool,
    serve_remoting,
)
from trioha.store import METADATA, ConsumeQueueStore, DiskGuard, IndexService

log = logging.getLogger("trioha.broker")

#: ``flushConsumerOffsetInterval``: 5 s.
PERSIST_INTERVAL = 5.0
#: ``ClientHousekeepingService``: every 10 s.
HOUSEKEEPING_INTERVAL = 10.0


@attrs.define
class ClientSide:
    """The running client side's parts (what tests and ``status`` look into)."""

    broker_addr: str
    meta: Metadata
    reput: ReputService
    processor: BrokerProcessor
    registrar: Registrar | None = None
    slave_sync: SlaveSynchronize | None = None
    namesrv_addr: tuple[str, int] | None = None
    connections: ConnectionCounters = attrs.field(factory=ConnectionCounters)
    acl: PlainAcl | None = None
    guard: AclGuard | None = None
    #: Delayed-message delivery (masters only).
    schedule: ScheduleMessageService | None = None
    #: The VIP channel's address (``MixAll.brokerVIPChannel``: the broker port - 2).
    vip_addr: str = ""
    #: Automatic failover: the nursery the role's tasks run in, and the running one's scope.
    nursery: trio.Nursery | None = None
    role_scope: trio.CancelScope | None = None

    def role_changed(self, broker: BrokerLike, master_addr: str | None) -> None:
        """Automatic failover: the broker's role changed in the running process. A master
        delivers delayed messages, a slave syncs metadata from *master_addr* (the broker then
        says what to register as: :meth:`register_as`)."""
        if self.role_scope is not None:
            self.role_scope.cancel()
        assert self.nursery is not None
        scope = self.role_scope = trio.CancelScope()
        config = broker.config
        if config.broker_role.is_master:
            # A new data version makes the name servers take this broker's topic queues as
            # the master's (RocketMQ 5.x ``ReplicasManager.changeToMaster`` does the same).
            topics = self.meta.topics
            topics.data_version = topics.data_version.next()
            topics.dirty = True  # written by the persister, off the event loop
            schedule = ScheduleMessageService(
                broker, self.reput, self.meta.delay, self.reput.delay_levels
            )
            self.schedule = schedule
            self.nursery.start_soon(_run_in, scope, schedule.run)
        else:
            self.schedule = None
            if self.slave_sync is not None:
                self.slave_sync.master_addr = master_addr
                self.nursery.start_soon(_run_in, scope, self.slave_sync.run)

    def register_as(self, broker_id: int) -> None:
        """Automatic failover: register with the name servers as *broker_id* from now on (0:
        the group's master), at once if that is a change. A master that fenced itself
        registers under its stable id, so that no route names it master meanwhile."""
        registrar = self.registrar
        if registrar is None or registrar.config.broker_id == broker_id:
            return
        role = BrokerRole.SYNC_MASTER if broker_id == 0 else BrokerRole.SLAVE
        registrar.config = attrs.evolve(registrar.config, broker_role=role, broker_id=broker_id)
        registrar.request()


async def _run_in(scope: trio.CancelScope, task: Callable[[], Awaitable[object]]) -> None:
    with scope:
        await task()


#: Attempts at finding a free port pair (p, p - 2) when ``listen_port`` is 0.
_PORT_PAIR_ATTEMPTS = 64


def free_port_pair(host: str) -> int:
    """A free port ``p`` (> 1025) whose ``p - 2`` is free too, for ``listen_port = 0``.

    RocketMQ derives the VIP port from the broker port (clients and slaves compute it), so a
    broker asked for "any port" must still get a pair; the ports are probed, then released.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(_PORT_PAIR_ATTEMPTS):
        with socket.socket(family, socket.SOCK_STREAM) as main:
            main.bind((host, 0))
            port = int(main.getsockname()[1])
            if port <= 1025:
                continue
            with socket.socket(family, socket.SOCK_STREAM) as vip:
                try:
                    vip.bind((host, port - 2))
                except OSError:
                    continue
            return port
    raise OSError(f"no free port pair (p, p-2) found on {host}")


def _master_end_sink(broker: BrokerLike) -> Callable[[int], None]:
    """Where the metadata sync reports the master's log end: the broker's HA client."""

    def learn(end: int) -> None:
        client = getattr(broker, "ha_client", None)
        if client is not None:
            client.learn_master_end(end)

    return learn


async def serve_client_side(
    broker: BrokerLike,
    *,
    task_status: trio.TaskStatus[ClientSide] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Run the broker port and its companions until cancelled; see the module docstring.

    Reports a :class:`ClientSide` once the port listens (``broker_addr`` holds the bound
    address, the one registered with name servers).
    """
    config = broker.config
    root = broker.store.root
    meta = await trio.to_thread.run_sync(Metadata.load, root, config)
    queues = ConsumeQueueStore(root)
    disk: DiskGuard = getattr(broker, "disk", None) or DiskGuard({})
    index = (
        IndexService(root, slots=config.max_hash_slot_num, max_index=config.max_index_num)
        if config.message_index_enable
        else None
    )
    delays = parse_delay_levels(config.message_delay_level)
    reput = ReputService(
        broker.store.commitlog,
        queues,
        checkpoint=root / "config" / CHECKPOINT_FILE,
        disk=disk,
        retry_interval=min(FLUSH_INTERVAL, config.clean_resource_interval / 1000),
        index=index,
        delay_levels=delays,
    )
    reput.recover()
    persister = _Persister(meta, disk)
    acl = await _load_acl(config)
    signer = _signer(config, acl)
    try:
        # The pool outlives the tasks using it (the registrar unregisters on the way out).
        async with (
            open_client_pool(rpc_hook=signer, ssl_context=client_context(config)) as pool,
            trio.open_nursery() as nursery,
        ):
            side = await _start(
                broker,
                meta=meta,
                reput=reput,
                pool=pool,
                nursery=nursery,
                persister=persister,
                acl=acl,
            )
            task_status.started(side)
            await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await persister.persist()
            await reput.flush()
            queues.close()
            if index is not None:
                index.close()
    raise AssertionError("unreachable")  # pragma: no cover


def _embedded_namesrv_config(config: BrokerConfig, host: str, port: int) -> NamesrvConfig:
    """The embedded name server's own settings: ``embeddedNamesrvConfig``, else RocketMQ's
    name server defaults. It listens on *host*:*port* (the first ``namesrvAddr`` entry), so a
    file that names another address is refused rather than ignored."""
    path = config.embedded_namesrv_config
    if not path:
        return NamesrvConfig()
    namesrv = NamesrvConfig.from_properties(path)
    default = NamesrvConfig()
    listen = (namesrv.listen_host, namesrv.listen_port)
    if listen not in ((default.listen_host, default.listen_port), (host, port)):
        raise ConfigError(
            f"{path}: an embedded name server listens on the first namesrvAddr entry "
            f"({host}:{port}), not on listenHost/listenPort {listen[0]}:{listen[1]}; "
            "remove them from the file or change namesrvAddr"
        )
    return namesrv


async def _start(
    broker: BrokerLike,
    *,
    meta: Metadata,
    reput: ReputService,
    pool: RemotingClientPool,
    nursery: trio.Nursery,
    persister: _Persister,
    acl: PlainAcl | None = None,
) -> ClientSide:
    """Start every service of the client side in *nursery*, in the order they depend on."""
    start = _Starter(broker, broker.config, meta, reput, pool, nursery, persister, acl)
    if acl is not None:
        nursery.start_soon(acl.watch)
    namesrv_bound = await start.embedded_namesrv()
    processor = BrokerProcessor(
        broker,
        meta,
        reput,
        broker_addr="",
        nursery=nursery,
        on_topics_changed=start.topics_changed,
    )
    guard = AclGuard(processor, acl.validator(Role.BROKER)) if acl is not None else None
    host, port = await start.broker_port(guard or processor, processor)
    config = start.config
    broker_addr = f"{config.broker_ip1}:{port}"
    processor.broker_addr = broker_addr
    log.info("%s broker port listening on %s:%d", config.broker_role.value, host, port)
    vip_port = await start.vip_channel(processor, port)
    log.info("VIP channel listening on %s:%d", host, vip_port)
    await nursery.start(reput.run, broker.wait_log_grew)
    nursery.start_soon(_housekeeping, processor, persister)
    nursery.start_soon(processor.ctx.stats.run)
    schedule = start.schedule()
    start.slave_sync = start.metadata_sync(broker_addr)
    start.registrar = await start.registration(broker_addr, embedded=namesrv_bound is not None)
    side = ClientSide(
        broker_addr=broker_addr,
        meta=meta,
        reput=reput,
        processor=processor,
        vip_addr=f"{config.broker_ip1}:{vip_port}",
        schedule=schedule,
        registrar=start.registrar,
        slave_sync=start.slave_sync,
        namesrv_addr=namesrv_bound,
        connections=start.connections,
        acl=acl,
        guard=guard,
        nursery=nursery,
    )
    processor.extra_info = partial(_runtime_info, broker, config, side)
    return side


@attrs.define
class _Starter:
    """What the client side's services start from, with one method per service.

    ``registrar`` and ``slave_sync`` are set once started: services started before them call
    back through :meth:`topics_changed` and the registrar's ``on_master``.
    """

    broker: BrokerLike
    #: The broker's settings; with an embedded name server, naming the address it really got.
    config: BrokerConfig
    meta: Metadata
    reput: ReputService
    pool: RemotingClientPool
    nursery: trio.Nursery
    persister: _Persister
    acl: PlainAcl | None
    connections: ConnectionCounters = attrs.field(factory=ConnectionCounters)
    #: One set for both ports: the connection cap and its reserve count them together.
    limits: ServerLimits = attrs.field(init=False)
    registrar: Registrar | None = None
    slave_sync: SlaveSynchronize | None = None

    @limits.default
    def _limits(self) -> ServerLimits:
        return ServerLimits.from_config(self.config)

    def topics_changed(self) -> None:
        if self.registrar is not None:
            self.registrar.request()

    async def embedded_namesrv(self) -> tuple[str, int] | None:
        """With ``embedded_namesrv``, a name server on the first ``namesrvAddr`` entry; returns
        the address it listens on (None: none embedded)."""
        config = self.config
        if not config.embedded_namesrv:
            return None
        addresses = namesrv_addresses(config)
        host, port = (
            parse_address(addresses[0], what="namesrv_addr")
            if addresses
            else ("127.0.0.1", DEFAULT_NAMESRV_PORT)
        )
        namesrv_tls = TlsAcceptor.for_config(config, what="name server")
        bound: tuple[str, int] = await self.nursery.start(
            partial(
                serve_namesrv,
                host,
                port,
                config=_embedded_namesrv_config(config, host, port),
                acl=self.acl,
                tls=namesrv_tls,
                setting="namesrvAddr, --embedded-namesrv",
                # Its own brokers register at this broker's period, others at the default.
                registration_period=max(REGISTRATION_PERIOD, config.registration_period),
            )
        )
        if not addresses or port == 0:  # register with the port it really got
            address = f"{bound[0]}:{bound[1]}"
            self.config = attrs.evolve(config, namesrv_addr=";".join([address, *addresses[1:]]))
        return bound

    async def broker_port(
        self, handler: RequestHandler, processor: BrokerProcessor
    ) -> tuple[str, int]:
        """The broker port (``listen_port``; 0 picks a free pair with its VIP port); returns
        the bound address."""
        config = self.config
        try:
            listen_port = config.listen_port or await trio.to_thread.run_sync(
                free_port_pair, config.broker_ip1
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {config.broker_ip1}:0 (listenPort, --listen): "
                f"{exc.strerror or exc}"
            ) from exc
        return await self._serve(
            handler, processor, listen_port, "listenPort, --listen", "broker port"
        )

    async def vip_channel(self, processor: BrokerProcessor, port: int) -> int:
        """The VIP channel on the broker port - 2; returns its port.

        ``BrokerController.initialize``: ``fastConfig.setListenPort(listenPort - 2)``. It is
        guarded like the broker port: ACL, TLS, idle timeout and the cap.
        """
        vip = VipChannelProcessor(processor)
        acl = self.acl
        handler = AclGuard(vip, acl.validator(Role.BROKER)) if acl is not None else vip
        _, vip_port = await self._serve(
            handler, processor, port - 2, "listenPort - 2 (the VIP channel)", "VIP channel"
        )
        return vip_port

    async def _serve(
        self,
        handler: RequestHandler,
        processor: BrokerProcessor,
        port: int,
        setting: str,
        what: str,
    ) -> tuple[str, int]:
        config = self.config
        bound: tuple[str, int] = await self.nursery.start(
            lambda task_status: serve_remoting(
                handler,
                config.broker_ip1,
                port,
                on_close=processor.connection_closed,
                setting=setting,
                limits=self.limits,
                counters=self.connections,
                wrap_stream=TlsAcceptor.for_config(config, what=what),
                task_status=task_status,
            )
        )
        return bound

    def schedule(self) -> ScheduleMessageService | None:
        """Delayed-message delivery, on a master only (slaves store the levels, never deliver).
        With failover the role changes at run time: :meth:`ClientSide.role_changed` starts it."""
        if not self.config.broker_role.is_master or self.config.failover:
            return None
        schedule = ScheduleMessageService(
            self.broker, self.reput, self.meta.delay, self.reput.delay_levels
        )
        self.nursery.start_soon(schedule.run)
        return schedule

    def metadata_sync(self, broker_addr: str) -> SlaveSynchronize | None:
        """On a slave, the master's metadata copied (``SlaveSynchronize``). With failover it
        is made for every broker and run while it is a slave (:meth:`ClientSide.role_changed`)."""
        config = self.config
        if config.broker_role is not BrokerRole.SLAVE and not config.failover:
            return None
        slave_sync = SlaveSynchronize(
            self.meta,
            self.pool,
            own_addr=broker_addr,
            master_addr=config.master_broker_addr,
            on_topics_changed=self.topics_changed,
            persist=self.persister.persist,
            on_master_end=_master_end_sink(self.broker),
        )
        if not config.failover:
            self.nursery.start_soon(slave_sync.run)
        return slave_sync

    async def registration(self, broker_addr: str, *, embedded: bool) -> Registrar | None:
        """Registration with the name servers of ``namesrv_addr`` (none: no registrar)."""
        config = self.config
        if not namesrv_addresses(config):
            return None
        ha = self.broker.ha_address
        ha_server_addr = (
            f"{config.broker_ip1}:{ha[1]}"
            if ha is not None
            else f"{config.broker_ip1}:{config.ha_listen_port}"
        )
        registrar = Registrar(
            config,
            self.meta,
            self.pool,
            broker_addr=broker_addr,
            ha_server_addr=ha_server_addr,
            on_master=self._on_master,
            # An embedded name server stops with this broker: no goodbye needed.
            skip_unregister=namesrv_addresses(config)[:1] if embedded else [],
        )
        await self.nursery.start(registrar.run)
        return registrar

    def _on_master(self, master_addr: str, ha_addr: str) -> None:
        """A name server named the master: a slave without ``masterBrokerAddr`` syncs from it."""
        slave_sync = self.slave_sync
        # With failover, etcd names the master (ClientSide.role_changed), not the name server.
        if (
            slave_sync is not None
            and not self.config.master_broker_addr
            and not self.config.failover
        ):
            if slave_sync.master_addr != master_addr:
                log.info("master broker is %s (HA %s)", master_addr, ha_addr)
            slave_sync.master_addr = master_addr


def _runtime_info(broker: BrokerLike, config: BrokerConfig, side: ClientSide) -> dict[str, str]:
    """The client side's lines of GET_BROKER_RUNTIME_INFO, beside the store's figures."""
    connections = side.connections
    info = {
        "namesrvAddr": config.namesrv_addr or "",
        "connectionsOpen": str(connections.open),
        "connectionsRefused": str(connections.refused),
        "connectionsIdleClosed": str(connections.idle_closed),
        # trioha's own: the connection reserve and the frame deadline at work.
        "connectionsReserveRefused": str(connections.reserve_refused),
        "connectionsSlowFrameClosed": str(connections.slow_frame_closed),
    }
    if side.registrar is not None:
        info["namesrvRegistrations"] = str(side.registrar.registrations)
    if side.guard is not None and side.acl is not None:  # trioha's own: the ACL at work
        info["aclAllowed"] = str(side.guard.allowed)
        info["aclDenied"] = str(side.guard.denied)
        info["aclReloads"] = str(side.acl.reloads)
        info["aclReloadError"] = side.acl.last_error or ""
    # trioha's own, the figures /metrics shows too.
    stats = broker.statistics()
    results = getattr(stats, "put_results", None) or {}
    info["putResults"] = ",".join(f"{k}:{v}" for k, v in sorted(results.items()))
    client = getattr(stats, "client", None)
    if client is not None:
        info["haClientState"] = client.state
        info["haClientBytesAppended"] = str(client.bytes_appended)
        info["haClientBehindBytes"] = (
            "" if client.behind_bytes is None else str(client.behind_bytes)
        )
        seconds = getattr(client, "behind_seconds", None)
        info["haClientBehindSeconds"] = "" if seconds is None else f"{seconds:.3f}"
    ha = getattr(stats, "ha", None)
    if ha is not None:
        info["haSlaveBehindSeconds"] = ",".join(
            f"{s.peer}:{s.behind_seconds:.3f}" for s in ha.slaves if s.behind_seconds is not None
        )
    failover = getattr(stats, "failover", None)
    if failover is not None:  # trioha's own: automatic failover (docs/failover.md)
        info["failoverPhase"] = failover.phase
        info["failoverEpoch"] = str(failover.master_epoch)
        info["failoverMasterId"] = str(failover.master_id)
        info["failoverSyncStateSet"] = ",".join(map(str, failover.sync_state_set))
        info["failoverLeaseDeadlineSeconds"] = (
            "" if failover.lease_deadline_in is None else f"{failover.lease_deadline_in:.3f}"
        )
        info["failoverLastElectionEpoch"] = str(failover.last_election_epoch)
        info["failoverLastElectionSecondsAgo"] = (
            "" if failover.last_election_ago is None else f"{failover.last_election_ago:.1f}"
        )
        info["failoverEtcdLastError"] = failover.etcd_last_error
    if side.slave_sync is not None:
        info["masterAddr"] = side.slave_sync.master_addr or ""
        info["metadataSyncs"] = str(side.slave_sync.syncs)
        info["metadataSyncError"] = side.slave_sync.last_error or ""
    return info


async def _load_acl(config: BrokerConfig) -> PlainAcl | None:
    """The ACL files when ``acl_enable`` is set; a missing or bad file stops the start."""
    if not config.acl_enable:
        return None
    path = config.acl_main_file
    if path is None:
        raise ConfigError("aclEnable=true needs aclFile (or ROCKETMQ_HOME/conf/plain_acl.yml)")
    return await trio.to_thread.run_sync(PlainAcl.load, path)


def _signer(config: BrokerConfig, acl: PlainAcl | None) -> RequestSigner | None:
    """The broker's own ``AclClientRPCHook``, from ``acl_access_key``/``acl_secret_key``."""
    if not config.acl_access_key:
        if config.acl_enable:
            log.warning(
                "aclEnable=true without aclAccessKey: this broker's own requests (registration, "
                "slave metadata sync) are sent unsigned"
            )
        return None
    secret = config.acl_secret_key or (acl.secret_of(config.acl_access_key) if acl else None)
    if secret is None:
        raise ConfigError(
            f"aclAccessKey={config.acl_access_key} needs aclSecretKey, or an account of that "
            "accessKey in the ACL file"
        )
    return RequestSigner(config.acl_access_key, secret)


class _Persister:
    """Writes changed metadata files in a worker thread, one writer at a time.

    The tables are encoded in the event loop (they change there), only the file IO moves.
    """

    def __init__(self, meta: Metadata, disk: DiskGuard) -> None:
        self.meta = meta
        self.disk = disk
        self._lock = trio.Lock()

    async def persist(self) -> None:
        """Write what changed; a refused write (a full disk) is reported to the disk guard
        and the tables stay dirty, so the next round writes them again."""
        async with self._lock:
            snapshots = self.meta.dirty_snapshots()
            if not snapshots:
                return
            try:
                await trio.to_thread.run_sync(write_snapshots, snapshots)
            except OSError as exc:
                self.meta.mark_dirty(path for path, _text in snapshots)
                self.disk.failed(METADATA, exc, blocks_puts=False)
                return
            if self.disk.failing(METADATA):
                self.disk.succeeded(METADATA)


async def _housekeeping(processor: BrokerProcessor, persister: _Persister) -> NoReturn:
    since_scan = 0.0
    while True:
        await trio.sleep(PERSIST_INTERVAL)
        await persister.persist()
        since_scan += PERSIST_INTERVAL
        if since_scan >= HOUSEKEEPING_INTERVAL:
            since_scan = 0.0
            processor.scan_not_active()
