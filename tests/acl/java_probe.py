"""Send the same ACL cases to a broker port; print each answer's code and remark as JSON.

Run by ``test_java_interop.py`` inside a network namespace, against the Java 4.9.7 broker and
a trioha broker with the same ``plain_acl.yml``::

    python -m tests.acl.java_probe HOST:PORT
"""

from __future__ import annotations

import json
import sys

import trio

from trioha.acl import RequestSigner
from trioha.remoting import RemotingCommand, RequestCode, open_client_pool
from trioha.remoting._client import RPCHook

GOOD = RequestSigner("RocketMQ", "12345678")
CASES: list[tuple[str, RPCHook | None, int, dict[str, str]]] = [
    ("unsigned", None, RequestCode.GET_MAX_OFFSET, {"topic": "AclTopic", "queueId": "0"}),
    (
        "unknown key",
        RequestSigner("nobody12", "12345678"),
        RequestCode.GET_MAX_OFFSET,
        {"topic": "AclTopic", "queueId": "0"},
    ),
    (
        "wrong secret",
        RequestSigner("RocketMQ", "87654321"),
        RequestCode.GET_MAX_OFFSET,
        {"topic": "AclTopic", "queueId": "0"},
    ),
    (
        "not admin",
        GOOD,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {
            "topic": "X1",
            "defaultTopic": "TBW102",
            "readQueueNums": "1",
            "writeQueueNums": "1",
            "perm": "6",
            "topicFilterType": "SINGLE_TAG",
        },
    ),
    (
        "pull other topic",
        GOOD,
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "AclGroup",
            "topic": "OtherTopic",
            "queueId": "0",
            "queueOffset": "0",
            "maxMsgNums": "1",
            "sysFlag": "0",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subVersion": "0",
        },
    ),
    (
        "pull other group",
        GOOD,
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "OtherGroup",
            "topic": "AclTopic",
            "queueId": "0",
            "queueOffset": "0",
            "maxMsgNums": "1",
            "sysFlag": "0",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subVersion": "0",
        },
    ),
    (
        "pull both other",
        GOOD,
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": "OtherGroup",
            "topic": "OtherTopic",
            "queueId": "0",
            "queueOffset": "0",
            "maxMsgNums": "1",
            "sysFlag": "0",
            "commitOffset": "0",
            "suspendTimeoutMillis": "0",
            "subVersion": "0",
        },
    ),
    (
        "send without PUB",
        GOOD,
        RequestCode.SEND_MESSAGE_V2,
        {
            "a": "PG",
            "b": "OtherTopic",
            "c": "TBW102",
            "d": "4",
            "e": "0",
            "f": "0",
            "g": "1700000000000",
            "h": "0",
            "i": "",
            "j": "0",
            "k": "false",
            "m": "false",
        },
    ),
]


async def probe(address: str) -> dict[str, list[object]]:
    """Each case's ``[code, remark]`` from the broker port at *address*."""
    out: dict[str, list[object]] = {}
    for name, hook, code, fields in CASES:
        async with open_client_pool(rpc_hook=hook) as pool:
            body = b"x" if code == RequestCode.SEND_MESSAGE_V2 else b""
            with trio.fail_after(10):
                response = await pool.request(address, RemotingCommand.request(code, fields, body))
            out[name] = [response.code, response.remark]
    return out


async def main(address: str) -> None:
    print(json.dumps(await probe(address)))


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
