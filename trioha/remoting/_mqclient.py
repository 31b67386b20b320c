"""trioha's own RocketMQ client calls (``MQClientAPIImpl``), over :class:`RemotingClientPool`.

Just what the CLI (``put``, ``tail``, ``status``) and the tests need: routes from a name
server, sends, pulls, consumer offsets and a broker's runtime info. Each call takes a pool and
an address and raises :class:`RemotingError` when the peer does not answer or answers with a
code the call cannot use.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

import attrs

from trioha._errors import RemotingError
from trioha.remoting._client import RemotingClientPool
from trioha.remoting._codec import RemotingCommand
from trioha.remoting._codes import (
    MASTER_ID,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RequestCode,
    ResponseCode,
)
from trioha.remoting._json import loads_lenient
from trioha.store import DecodedMessage, StoredMessage, decode_record, properties_to_string

#: ``DefaultMQProducer.defaultTopicQueueNums``: queues of a topic auto-created by a send.
DEFAULT_TOPIC_QUEUE_NUMS = 4


@attrs.frozen
class BrokerRoute:
    """One broker group in a route: its queues and ``{broker id: address}``."""

    broker_name: str
    addrs: Mapping[int, str]
    read_queue_nums: int
    write_queue_nums: int
    perm: int

    @property
    def master(self) -> str | None:
        return self.addrs.get(MASTER_ID)

    def readable_address(self) -> str | None:
        """The master, else any slave (``findBrokerAddressInSubscribe``)."""
        return self.master or next(iter(sorted(self.addrs.items())), (0, None))[1]


@attrs.frozen
class TopicRoute:
    topic: str
    brokers: tuple[BrokerRoute, ...]

    @classmethod
    def from_json(cls, topic: str, value: Mapping[str, Any]) -> TopicRoute:
        addrs = {
            str(b.get("brokerName")): {
                int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()
            }
            for b in value.get("brokerDatas") or []
        }
        brokers = tuple(
            BrokerRoute(
                str(q.get("brokerName")),
                addrs.get(str(q.get("brokerName")), {}),
                int(q.get("readQueueNums", 0)),
                int(q.get("writeQueueNums", 0)),
                int(q.get("perm", 0)),
            )
            for q in value.get("queueDatas") or []
        )
        return cls(topic, brokers)


@attrs.frozen
class SendResult:
    code: int
    remark: str | None
    msg_id: str | None
    queue_id: int
    queue_offset: int

    @property
    def status(self) -> str:
        """The producer's ``SendStatus`` name for a stored message, else the failure."""
        names: dict[int, str] = {
            ResponseCode.SUCCESS: "SEND_OK",
            ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
            ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
            ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
        }
        return names.get(self.code, f"FAILED({self.code}: {self.remark})")


@attrs.frozen
class PullResult:
    code: int
    remark: str | None
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[StoredMessage, ...] = ()


def _checked(response: RemotingCommand, what: str, *ok: int) -> RemotingCommand:
    if response.code not in (ok or (ResponseCode.SUCCESS,)):
        raise RemotingError(f"{what}: code {response.code}: {response.remark}", code=response.code)
    return response


async def get_route(pool: RemotingClientPool, namesrv: str, topic: str) -> TopicRoute:
    """GET_ROUTEINFO_BY_TOPIC."""
    response = await pool.request(
        namesrv, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    )
    _checked(response, f"route of {topic} from {namesrv}")
    return TopicRoute.from_json(topic, loads_lenient(response.body))


async def send_message(
    pool: RemotingClientPool,
    broker: str,
    *,
    topic: str,
    body: bytes,
    queue_id: int,
    tags: str | None = None,
    keys: str | None = None,
    producer_group: str = "trioha-cli",
) -> SendResult:
    """SEND_MESSAGE_V2 (the one-letter header a Java producer uses)."""
    properties = {"WAIT": "true"}
    if tags:
        properties["TAGS"] = tags
    if keys:
        properties["KEYS"] = keys
    properties["UNIQ_KEY"] = f"{random.getrandbits(128):032X}"
    request = RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {
            "a": producer_group,
            "b": topic,
            "c": "TBW102",
            "d": DEFAULT_TOPIC_QUEUE_NUMS,
            "e": queue_id,
            "f": 0,
            "g": int(time.time() * 1000),
            "h": 0,
            "i": properties_to_string(properties),
            "j": 0,
            "k": "false",
            "m": "false",
        },
        body,
    )
    response = await pool.request(broker, request)
    return SendResult(
        response.code,
        response.remark,
        response.field("msgId"),
        response.int_field("queueId", queue_id),
        response.int_field("queueOffset", -1),
    )


async def pull_message(
    pool: RemotingClientPool,
    broker: str,
    *,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    max_nums: int = 32,
    suspend_ms: int = 0,
    commit_offset: int | None = None,
    subscription: str = "*",
) -> PullResult:
    """PULL_MESSAGE with the subscription in the header; long-polls when ``suspend_ms``."""
    flags = PULL_FLAG_SUBSCRIPTION
    if suspend_ms:
        flags |= PULL_FLAG_SUSPEND
    if commit_offset is not None:
        flags |= PULL_FLAG_COMMIT_OFFSET
    request = RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": offset,
            "maxMsgNums": max_nums,
            "sysFlag": flags,
            "commitOffset": commit_offset if commit_offset is not None else 0,
            "suspendTimeoutMillis": suspend_ms,
            "subscription": subscription,
            "subVersion": 0,
            "expressionType": "TAG",
        },
    )
    response = await pool.request(broker, request)
    messages: list[StoredMessage] = []
    if response.code == ResponseCode.SUCCESS:
        pos = 0
        body = response.body
        while pos < len(body):
            decoded = decode_record(body, pos, check_crc=False)
            if not isinstance(decoded, DecodedMessage):
                raise RemotingError(
                    f"pull from {broker}: record at byte {pos} of the response does not decode: "
                    f"{decoded}",
                    code=ResponseCode.SYSTEM_ERROR,
                )
            messages.append(decoded.message)
            pos += decoded.size
    return PullResult(
        response.code,
        response.remark,
        response.int_field("nextBeginOffset", offset),
        response.int_field("minOffset", 0),
        response.int_field("maxOffset", 0),
        tuple(messages),
    )


async def query_consumer_offset(
    pool: RemotingClientPool, broker: str, *, group: str, topic: str, queue_id: int
) -> int | None:
    """QUERY_CONSUMER_OFFSET; None when the broker has none (QUERY_NOT_FOUND)."""
    response = await pool.request(
        broker,
        RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": topic, "queueId": queue_id},
        ),
    )
    if response.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return _checked(response, "query consumer offset").int_field("offset")


async def update_consumer_offset(
    pool: RemotingClientPool, broker: str, *, group: str, topic: str, queue_id: int, offset: int
) -> None:
    """UPDATE_CONSUMER_OFFSET."""
    response = await pool.request(
        broker,
        RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset},
        ),
    )
    _checked(response, "update consumer offset")


async def runtime_info(pool: RemotingClientPool, broker: str) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO: the broker's KVTable."""
    response = await pool.request(
        broker, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    )
    table = loads_lenient(_checked(response, f"runtime info of {broker}").body).get("table", {})
    return {str(k): str(v) for k, v in table.items()}
