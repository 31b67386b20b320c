"""The name server: brokers register, clients ask where a topic lives.

Mirrors RocketMQ 4.9.4's ``namesrv`` module: ``RouteInfoManager`` (the tables, here a plain
class that is given the time) and ``DefaultRequestProcessor`` (the request codes), plus the
``scanNotActiveBroker`` task and ``BrokerHousekeepingService`` (a broker whose connection
closes is removed at once).

Tables, as RocketMQ keeps them:

* ``topic_queues``: topic → broker name → :class:`QueueData`; written only by masters
  (broker id 0) and kept while any broker of that name is alive, so a route still lists the
  queues when only the slave is left;
* ``brokers``: broker name → :class:`BrokerData` (cluster and ``{broker id: address}``);
* ``clusters``: cluster → broker names;
* ``live``: broker address → :class:`BrokerLiveInfo` (last registration time, data version,
  HA address, the connection it registered over).

A broker not re-registered within :data:`BROKER_CHANNEL_EXPIRED_TIME` is dropped.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Hashable
from typing import Any, NoReturn

import attrs
import trio

from trioha._errors import RemotingError
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._codes import MASTER_ID, RequestCode, ResponseCode
from trioha.remoting._connection import RemotingConnection
from trioha.remoting._dataversion import DataVersion
from trioha.remoting._json import dumps_bytes, loads_lenient
from trioha.remoting._server import serve_remoting

log = logging.getLogger("trioha.namesrv")

#: ``RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME``: 120 s without a registration.
BROKER_CHANNEL_EXPIRED_TIME = 120_000
#: ``NamesrvController``: the scan runs every 10 s (first after 5 s).
SCAN_INTERVAL = 10.0
SCAN_INITIAL_DELAY = 5.0
#: ``NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG``.
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"
DEFAULT_NAMESRV_PORT = 9876


@attrs.frozen
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }


@attrs.define
class BrokerData:
    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerAddrs": {str(i): a for i, a in sorted(self.broker_addrs.items())},
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }


@attrs.define
class BrokerLiveInfo:
    last_update: int
    data_version: DataVersion
    channel: Hashable | None
    ha_server_addr: str


@attrs.frozen
class RegisterResult:
    """``RegisterBrokerResult``: what a slave needs to find its master."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


class RouteInfoManager:
    """The name server's tables; no IO, the caller supplies ``now`` (ms)."""

    def __init__(self) -> None:
        self.topic_queues: dict[str, dict[str, QueueData]] = {}
        self.brokers: dict[str, BrokerData] = {}
        self.clusters: dict[str, set[str]] = {}
        self.live: dict[str, BrokerLiveInfo] = {}
        self.kv: dict[str, dict[str, str]] = {}

    # --- registration -------------------------------------------------------------------
    def register_broker(
        self,
        *,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        topic_config: dict[str, Any] | None,
        channel: Hashable | None,
        now: int,
    ) -> RegisterResult:
        """``registerBroker``: add or refresh a broker; masters define the topic queues."""
        self.clusters.setdefault(cluster, set()).add(broker_name)
        data = self.brokers.get(broker_name)
        register_first = data is None
        if data is None:
            data = self.brokers[broker_name] = BrokerData(cluster, broker_name)
        # The same address under another id (a slave switched to master): drop the old id.
        for other_id, addr in list(data.broker_addrs.items()):
            if addr == broker_addr and other_id != broker_id:
                del data.broker_addrs[other_id]
        old = data.broker_addrs.get(broker_id)
        data.broker_addrs[broker_id] = broker_addr
        register_first = register_first or old is None

        version = DataVersion.from_json((topic_config or {}).get("dataVersion"))
        if topic_config is not None and broker_id == MASTER_ID:
            previous = self.live.get(broker_addr)
            if register_first or previous is None or previous.data_version != version:
                table = topic_config.get("topicConfigTable") or {}
                for topic, config in table.items():
                    if isinstance(config, dict):
                        self._update_queue_data(broker_name, str(topic), config)
        known = broker_addr in self.live
        self.live[broker_addr] = BrokerLiveInfo(now, version, channel, ha_server_addr)
        if not known:
            log.info(
                "new broker registered: %s %s id %d (HA %s)",
                broker_name,
                broker_addr,
                broker_id,
                ha_server_addr,
            )
        if broker_id != MASTER_ID:
            master = data.broker_addrs.get(MASTER_ID)
            if master is not None and master in self.live:
                return RegisterResult(self.live[master].ha_server_addr, master)
        return RegisterResult()

    def _update_queue_data(self, broker_name: str, topic: str, config: dict[str, Any]) -> None:
        """``createAndUpdateQueueData``."""
        queue = QueueData(
            broker_name,
            int(config.get("readQueueNums", 0)),
            int(config.get("writeQueueNums", 0)),
            int(config.get("perm", 0)),
            int(config.get("topicSysFlag", 0)),
        )
        queues = self.topic_queues.setdefault(topic, {})
        if queues.get(broker_name) != queue:
            if broker_name in queues:
                log.info("topic %s changed on %s: %s", topic, broker_name, queue)
            queues[broker_name] = queue

    def unregister_broker(
        self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        """``unregisterBroker``: remove one address; the last one takes its topics along."""
        self.live.pop(broker_addr, None)
        data = self.brokers.get(broker_name)
        if data is not None and data.broker_addrs.get(broker_id) == broker_addr:
            del data.broker_addrs[broker_id]
            log.info("broker unregistered: %s %s id %d", broker_name, broker_addr, broker_id)
        self._forget_if_empty(broker_name, cluster)

    def _forget_if_empty(self, broker_name: str, cluster: str | None = None) -> None:
        data = self.brokers.get(broker_name)
        if data is None or data.broker_addrs:
            return
        del self.brokers[broker_name]
        for name, members in list(self.clusters.items()):
            if cluster not in (None, name):
                continue
            members.discard(broker_name)
            if not members:
                del self.clusters[name]
        for topic, queues in list(self.topic_queues.items()):
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queues[topic]
        log.info("broker name %s has no broker left; its topics are removed", broker_name)

    def on_channel_destroy(self, channel: Hashable) -> list[str]:
        """``onChannelDestroy``: a registration connection closed; drop its brokers."""
        gone = [addr for addr, info in self.live.items() if info.channel == channel]
        for addr in gone:
            self._remove_address(addr, "its connection closed")
        return gone

    def scan_not_active(self, now: int) -> list[str]:
        """``scanNotActiveBroker``: drop brokers silent for more than 120 s."""
        expired = [
            addr
            for addr, info in self.live.items()
            if info.last_update + BROKER_CHANNEL_EXPIRED_TIME < now
        ]
        for addr in expired:
            self._remove_address(addr, f"not registered for {BROKER_CHANNEL_EXPIRED_TIME} ms")
        return expired

    def _remove_address(self, broker_addr: str, why: str) -> None:
        self.live.pop(broker_addr, None)
        for name, data in list(self.brokers.items()):
            for broker_id, addr in list(data.broker_addrs.items()):
                if addr == broker_addr:
                    del data.broker_addrs[broker_id]
                    log.info("broker %s %s id %d removed: %s", name, addr, broker_id, why)
            self._forget_if_empty(name)

    def query_data_version(self, broker_addr: str, version: DataVersion, now: int) -> bool:
        """``isBrokerTopicConfigChanged`` + ``updateBrokerInfoUpdateTimestamp``."""
        info = self.live.get(broker_addr)
        if info is None:
            return True
        info.last_update = now
        return info.data_version != version

    # --- queries --------------------------------------------------------------------------
    def route(self, topic: str) -> dict[str, Any] | None:
        """``pickupTopicRouteData``: the TopicRouteData, or None when unknown."""
        queues = self.topic_queues.get(topic)
        if not queues:
            return None
        broker_datas = [
            self.brokers[name].to_json()
            for name in sorted(queues)
            if name in self.brokers and self.brokers[name].broker_addrs
        ]
        if not broker_datas:
            return None
        route: dict[str, Any] = {
            "brokerDatas": broker_datas,
            "filterServerTable": {},
            "queueDatas": [q.to_json() for _, q in sorted(queues.items())],
        }
        order = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, {}).get(topic)
        if order is not None:
            route["orderTopicConf"] = order
        return route

    def cluster_info(self) -> dict[str, Any]:
        """``ClusterInfo``: every broker and every cluster's broker names."""
        return {
            "brokerAddrTable": {n: d.to_json() for n, d in sorted(self.brokers.items())},
            "clusterAddrTable": {c: sorted(m) for c, m in sorted(self.clusters.items())},
        }

    def topic_list(self) -> dict[str, Any]:
        return {"topicList": sorted(self.topic_queues)}


class NamesrvProcessor:
    """``DefaultRequestProcessor``: the name server's request codes."""

    def __init__(
        self,
        routes: RouteInfoManager | None = None,
        *,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.routes = routes or RouteInfoManager()
        self.now = clock

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
                route = self.routes.route(topic)
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


async def serve_namesrv(
    host: str = "127.0.0.1",
    port: int = DEFAULT_NAMESRV_PORT,
    *,
    processor: NamesrvProcessor | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Run a name server on ``host:port`` (0: any free port) until cancelled."""
    processor = processor or NamesrvProcessor()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(
            lambda task_status: serve_remoting(
                processor,
                host,
                port,
                on_close=processor.connection_closed,
                task_status=task_status,
            )
        )
        log.info("name server listening on %s:%d", *address)
        task_status.started(address)
        await trio.sleep(SCAN_INITIAL_DELAY)
        while True:
            processor.routes.scan_not_active(processor.now())
            await trio.sleep(SCAN_INTERVAL)
    raise AssertionError("unreachable")  # pragma: no cover
