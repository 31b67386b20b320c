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
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from trioha.remoting import MASTER_ID, PERM_READ, PERM_WRITE, DataVersion

log = logging.getLogger("trioha.namesrv")

#: ``RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME``: 120 s without a registration.
BROKER_CHANNEL_EXPIRED_TIME = 120_000
#: ``NamesrvController``: the scan runs every 10 s (first after 5 s).
SCAN_INTERVAL = 10.0
SCAN_INITIAL_DELAY = 5.0
#: ``NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG``.
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


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

    def wipe_write_perm(self, broker_name: str) -> int:
        """``wipeWritePermOfBrokerByLock``: drop the write bit from every queue of
        *broker_name*, so producers route around it (``mqadmin wipeWritePerm``, to drain a
        broker). Returns how many topics it had.

        It lasts until the broker's topic table changes: a registration with a new data
        version rewrites its queues, as in RocketMQ.
        """
        return self._set_write_perm(broker_name, lambda perm: perm & ~PERM_WRITE, "wiped")

    def add_write_perm(self, broker_name: str) -> int:
        """``addWritePermOfBrokerByLock``: every queue of *broker_name* readable and
        writable again (RocketMQ sets exactly read|write). Returns how many topics it had."""
        return self._set_write_perm(broker_name, lambda _perm: PERM_READ | PERM_WRITE, "added")

    def _set_write_perm(self, broker_name: str, change: Callable[[int], int], verb: str) -> int:
        count = 0
        for queues in self.topic_queues.values():
            queue = queues.get(broker_name)
            if queue is not None:
                queues[broker_name] = attrs.evolve(queue, perm=change(queue.perm))
                count += 1
        log.info("write permission of broker %s %s in %d topics", broker_name, verb, count)
        return count

    def query_data_version(self, broker_addr: str, version: DataVersion, now: int) -> bool:
        """``isBrokerTopicConfigChanged`` + ``updateBrokerInfoUpdateTimestamp``."""
        info = self.live.get(broker_addr)
        if info is None:
            return True
        info.last_update = now
        return info.data_version != version

    # --- queries --------------------------------------------------------------------------
    def route(self, topic: str, *, order_conf: bool = True) -> dict[str, Any] | None:
        """``pickupTopicRouteData``: the TopicRouteData, or None when unknown; with
        *order_conf* (``orderMessageEnable``) it carries the topic's ``ORDER_TOPIC_CONFIG``
        entry, if any, as ``orderTopicConf``."""
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
        order = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, {}).get(topic) if order_conf else None
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
