"""The name server's request codes and its server loop.

Mirrors ``DefaultRequestProcessor`` (registration, routes, cluster info, KV config) and
``NamesrvController``'s ``scanNotActiveBroker`` task; ``BrokerHousekeepingService`` drops a broker
whose connection closes. The tables themselves are :class:`~._routes.RouteInfoManager`'s.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import trio

from trioha._config import NamesrvConfig, config_properties, parse_properties
from trioha._errors import ConfigError, RemotingError
from trioha.namesrv._routes import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    SCAN_INITIAL_DELAY,
    SCAN_INTERVAL,
    RouteInfoManager,
)
from trioha.remoting import (
    DataVersion,
    NoBursts,
    RemotingCommand,
    RemotingConnection,
    RequestCode,
    RequestHandler,
    ResponseCode,
    ServerLimits,
    dumps_bytes,
    loads_lenient,
    serve_remoting,
)

if TYPE_CHECKING:
    from trioha.acl import PlainAcl, TlsAcceptor

log = logging.getLogger("trioha.namesrv")


#: ``NamesrvConfig``'s paths, which UPDATE_NAMESRV_CONFIG may never change (RocketMQ's
#: NO_PERMISSION "Can not update config path").
CONFIG_PATH_KEYS = frozenset({"kvConfigPath", "configStorePath"})


class NamesrvProcessor(NoBursts):
    """``DefaultRequestProcessor``: the name server's request codes, each answered on its own.

    *settings* gives the ``key -> value`` properties GET_NAMESRV_CONFIG answers
    (``Configuration.getAllConfigsFormatString``); when None, :func:`serve_namesrv` fills in
    what it runs with.
    """

    def __init__(
        self,
        routes: RouteInfoManager | None = None,
        *,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        order_message_enable: bool = False,
        settings: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.routes = routes or RouteInfoManager()
        self.now = clock
        #: ``NamesrvConfig.orderMessageEnable``: routes carry ``orderTopicConf``.
        self.order_message_enable = order_message_enable
        self.settings = settings

    async def handle_request(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand | None:
        match request.code:
            case RequestCode.REGISTER_BROKER:
                return self._register(request, connection)
            case RequestCode.UNREGISTER_BROKER:
                self.routes.unregister_broker(
                    cluster=request.require("clusterName"),
                    broker_addr=request.require("brokerAddr"),
                    broker_name=request.require("brokerName"),
                    broker_id=request.int_field("brokerId"),
                )
                return request.response(ResponseCode.SUCCESS)
            case RequestCode.GET_ROUTEINFO_BY_TOPIC:
                topic = request.require("topic")
                route = self.routes.route(topic, order_conf=self.order_message_enable)
                if route is None:
                    return request.response(
                        ResponseCode.TOPIC_NOT_EXIST,
                        f"No topic route info in name server for the topic: {topic}",
                    )
                return request.response(ResponseCode.SUCCESS, body=dumps_bytes(route))
            case RequestCode.GET_BROKER_CLUSTER_INFO:
                return request.response(
                    ResponseCode.SUCCESS, body=dumps_bytes(self.routes.cluster_info())
                )
            case RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
                return request.response(
                    ResponseCode.SUCCESS, body=dumps_bytes(self.routes.topic_list())
                )
            case RequestCode.QUERY_DATA_VERSION:
                return self._query_data_version(request)
            case RequestCode.DELETE_TOPIC_IN_NAMESRV:
                # RouteInfoManager.deleteTopic (mqadmin deleteTopic, after each broker's 215).
                self.routes.topic_queues.pop(request.require("topic"), None)
                return request.response(ResponseCode.SUCCESS)
            case RequestCode.PUT_KV_CONFIG:
                namespace = request.require("namespace")
                self.routes.kv.setdefault(namespace, {})[request.require("key")] = request.require(
                    "value"
                )
                return request.response(ResponseCode.SUCCESS)
            case RequestCode.GET_KV_CONFIG:
                value = self.routes.kv.get(request.require("namespace"), {}).get(
                    request.require("key")
                )
                if value is None:
                    return request.response(
                        ResponseCode.QUERY_NOT_FOUND,
                        f"No config item, Namespace: {request.field('namespace')} "
                        f"Key: {request.field('key')}",
                    )
                return request.response(ResponseCode.SUCCESS, fields={"value": value})
            case RequestCode.DELETE_KV_CONFIG:
                self.routes.kv.get(request.require("namespace"), {}).pop(
                    request.require("key"), None
                )
                return request.response(ResponseCode.SUCCESS)
            case RequestCode.WIPE_WRITE_PERM_OF_BROKER:
                return self._write_perm(
                    request, connection, self.routes.wipe_write_perm, "wipe", "wipeTopicCount"
                )
            case RequestCode.ADD_WRITE_PERM_OF_BROKER:
                return self._write_perm(
                    request, connection, self.routes.add_write_perm, "add", "addTopicCount"
                )
            case RequestCode.GET_NAMESRV_CONFIG:
                settings = self.settings() if self.settings is not None else {}
                body = "".join(f"{key}={value}\n" for key, value in settings.items())
                return request.response(ResponseCode.SUCCESS, body=body.encode())
            case RequestCode.UPDATE_NAMESRV_CONFIG:
                return self._update_config(request, connection)
            case RequestCode.GET_KVLIST_BY_NAMESPACE:
                table = self.routes.kv.get(request.require("namespace"))
                if not table:
                    return request.response(
                        ResponseCode.QUERY_NOT_FOUND,
                        f"No config item, Namespace: {request.field('namespace')}",
                    )
                return request.response(ResponseCode.SUCCESS, body=dumps_bytes({"table": table}))
        return request.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {request.code} not supported"
        )

    @staticmethod
    def _write_perm(
        request: RemotingCommand,
        connection: RemotingConnection,
        change: Callable[[str], int],
        verb: str,
        count_field: str,
    ) -> RemotingCommand:
        """``wipeWritePermOfBroker``/``addWritePermOfBroker``: the count of topics touched in
        the response header."""
        broker_name = request.require("brokerName")
        count = change(broker_name)
        log.info(
            "%s write perm of broker[%s], client: %s, %d", verb, broker_name, connection.peer, count
        )
        return request.response(ResponseCode.SUCCESS, fields={count_field: count})

    def _update_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """``updateConfig``: RocketMQ's NO_PERMISSION for its two paths; every other key is
        refused by name, as nothing of a trioha name server changes while it runs (a RocketMQ
        name server stores such a key and answers success, whether it is used or not)."""
        log.info("updateConfig called by %s", connection.peer)
        if not request.body:
            return request.response(ResponseCode.SUCCESS)
        try:
            keys = [key for _line, key, _value in parse_properties(request.body.decode())]
        except (UnicodeDecodeError, ConfigError) as exc:
            return request.response(ResponseCode.SYSTEM_ERROR, f"string2Properties error: {exc}")
        if CONFIG_PATH_KEYS.intersection(keys):
            return request.response(ResponseCode.NO_PERMISSION, "Can not update config path")
        if not keys:
            return request.response(ResponseCode.SUCCESS)
        return request.response(
            ResponseCode.SYSTEM_ERROR,
            f"updateNamesrvConfig: {keys[0]} cannot be changed while the name server runs; "
            "restart it with the new value",
        )

    def _register(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        crc = request.int_field("bodyCrc32", 0)
        if crc and (zlib.crc32(request.body) & 0x7FFFFFFF) != crc:
            return request.response(
                ResponseCode.SYSTEM_ERROR,
                f"crc32 not match, body crc32 {zlib.crc32(request.body) & 0x7FFFFFFF} != {crc}",
            )
        if request.bool_field("compressed"):
            raise RemotingError(
                "compressed REGISTER_BROKER bodies are not supported; "
                "set compressedRegister=false on the broker",
                code=ResponseCode.SYSTEM_ERROR,
            )
        topic_config: dict[str, Any] | None = None
        if request.body:
            try:
                body = loads_lenient(request.body)
            except ValueError as exc:
                raise RemotingError(
                    f"REGISTER_BROKER body is not JSON: {exc}", code=ResponseCode.SYSTEM_ERROR
                ) from None
            wrapper = body.get("topicConfigSerializeWrapper") if isinstance(body, dict) else None
            topic_config = wrapper if isinstance(wrapper, dict) else None
        result = self.routes.register_broker(
            cluster=request.require("clusterName"),
            broker_addr=request.require("brokerAddr"),
            broker_name=request.require("brokerName"),
            broker_id=request.int_field("brokerId"),
            ha_server_addr=request.field("haServerAddr") or "",
            topic_config=topic_config,
            channel=connection,
            now=self.now(),
        )
        fields = {"haServerAddr": result.ha_server_addr, "masterAddr": result.master_addr}
        order = self.routes.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, {})
        return request.response(
            ResponseCode.SUCCESS, fields=fields, body=dumps_bytes({"table": order})
        )

    def _query_data_version(self, request: RemotingCommand) -> RemotingCommand:
        try:
            version = DataVersion.from_json(loads_lenient(request.body)) if request.body else None
        except ValueError:
            version = None
        addr = request.require("brokerAddr")
        changed = self.routes.query_data_version(
            addr, version or DataVersion(timestamp=-1), self.now()
        )
        info = self.routes.live.get(addr)
        body = dumps_bytes(info.data_version.to_json()) if info is not None else b""
        return request.response(
            ResponseCode.SUCCESS, fields={"changed": "true" if changed else "false"}, body=body
        )

    def connection_closed(self, connection: RemotingConnection) -> None:
        """``BrokerHousekeepingService.onChannelClose``."""
        self.routes.on_channel_destroy(connection)


#: RocketMQ's default period of a broker's registration (``registerNameServerPeriod``) and of
#: its clients' route polls (``pollNameServerInterval``), in seconds.
REGISTRATION_PERIOD = 30.0


def check_idle_timeout(config: NamesrvConfig, registration_period: float) -> None:
    """Refuse an idle timeout that drops brokers between their registrations; warn about one
    that a single late registration defeats.

    A broker keeps its connection to a name server open and registers on it every
    *registration_period* seconds; the name server drops a broker whose connection closes
    (``BrokerHousekeepingService``). At or below the period, the idle timeout closes every
    broker's connection before its next registration, so its routes vanish for part of every
    period ("no route to topic"); RocketMQ lets that happen (docs/rocketmq-protocol.md §18.1),
    trioha refuses to start. Below
    twice the period, one registration late by more than the difference (a slow name server, a
    broker registering with several) does the same once: a WARNING.
    """
    idle = config.server_channel_max_idle_time_seconds
    if idle <= registration_period:
        raise ConfigError(
            f"serverChannelMaxIdleTimeSeconds={idle} on the name server is not above the "
            f"brokers' registration period ({registration_period:.0f} s): it would close each "
            "broker's connection, and drop its routes, between registrations; use at least "
            f"{2 * registration_period:.0f} (RocketMQ's default is 120)"
        )
    if idle < 2 * registration_period:
        log.warning(
            "serverChannelMaxIdleTimeSeconds=%d on the name server leaves less than one "
            "registration period (%.0f s) of slack: a broker whose registration comes %.0f s "
            "late loses its routes until the next one",
            idle,
            registration_period,
            idle - registration_period,
        )


async def serve_namesrv(
    host: str | None = None,
    port: int | None = None,
    *,
    config: NamesrvConfig | None = None,
    processor: NamesrvProcessor | None = None,
    setting: str = "--listen",
    registration_period: float = REGISTRATION_PERIOD,
    acl: PlainAcl | None = None,
    tls: TlsAcceptor | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Run a name server until cancelled, on ``host:port`` (default: the config's
    ``listen_host``/``listen_port``; port 0: any free port).

    *config* gives its own idle timeout, connection cap and frame deadline
    (:class:`~trioha._config.NamesrvConfig`, RocketMQ's defaults when None); an idle timeout
    that would drop brokers registering every *registration_period* seconds is refused
    (:func:`check_idle_timeout`). An address that cannot be bound is a one-line
    ``ConfigError`` naming *setting*.

    With ``acl`` every request is checked first (``trioha.acl.Role.NAMESRV``: a valid
    signature always, an admin account for anything but reads; RocketMQ's name server checks
    nothing); the caller keeps the ACL current (``acl.watch()``). ``tls`` sniffs and wraps
    each accepted socket (``tls.server.mode``).
    """
    config = config if config is not None else NamesrvConfig()
    check_idle_timeout(config, registration_period)
    processor = processor or NamesrvProcessor(order_message_enable=config.order_message_enable)
    # What GET_NAMESRV_CONFIG shows: the settings this server runs with, the address once bound.
    bound: dict[str, str] = {}
    if processor.settings is None:
        processor.settings = lambda: {**config_properties(config), **bound}
    handler: RequestHandler = processor
    if acl is not None:
        from trioha.acl import AclGuard, Role

        handler = AclGuard(processor, acl.validator(Role.NAMESRV))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(
            lambda task_status: serve_remoting(
                handler,
                config.listen_host if host is None else host,
                config.listen_port if port is None else port,
                on_close=processor.connection_closed,
                setting=setting,
                limits=ServerLimits.from_config(config),
                wrap_stream=tls,
                task_status=task_status,
            )
        )
        bound.update(listenHost=address[0], listenPort=str(address[1]))
        log.info("name server listening on %s:%d", *address)
        task_status.started(address)
        await trio.sleep(SCAN_INITIAL_DELAY)
        while True:
            processor.routes.scan_not_active(processor.now())
            await trio.sleep(SCAN_INTERVAL)
    raise AssertionError("unreachable")  # pragma: no cover
