"""End to end with the official RocketMQ client (the C++ client in the ``rocketmq`` wheel).

The broker runs in the test (a file store, the client side served on 127.0.0.1 with ports
picked by the OS); the client runs in a subprocess (``official_client.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker.fakes import FakeBroker, open_fake_broker
from trioha._config import BrokerConfig
from trioha.broker._clientside import ClientSide, free_port_pair, serve_client_side

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rocketmq") is None,
    reason="the official client (pip install rocketmq) is not installed",
)

HELPER = Path(__file__).with_name("official_client.py")


async def official(
    home: Path, *args: str, credentials: tuple[str, str] | None = None
) -> dict[str, Any]:
    """Run one official_client.py command (at most 90 s); its JSON result.

    With ``credentials`` (accessKey, secretKey) the client signs its requests.
    """
    env = {**os.environ, "HOME": str(home)}  # the C++ client logs under $HOME/logs
    if credentials is not None:
        env["RMQ_ACCESS_KEY"], env["RMQ_SECRET_KEY"] = credentials
    with trio.fail_after(90):
        done = await trio.run_process(
            [sys.executable, str(HELPER), *args], capture_stdout=True, capture_stderr=True, env=env
        )
    lines = done.stdout.decode().strip().splitlines()
    assert lines, done.stderr.decode()[-2000:]
    result: dict[str, Any] = json.loads(lines[-1])
    return result


@asynccontextmanager
async def running_broker(
    root: Path, **overrides: Any
) -> AsyncIterator[tuple[FakeBroker, ClientSide, str]]:
    config = BrokerConfig(
        store_path_root_dir=str(root),
        namesrv_addr="127.0.0.1:0",
        embedded_namesrv=True,
        mapped_file_size_commit_log=1 << 20,
        **{"listen_port": 0, **overrides},
    )
    async with open_fake_broker(root, config) as broker, trio.open_nursery() as nursery:
        side: ClientSide = await nursery.start(serve_client_side, broker)
        assert side.namesrv_addr is not None
        namesrv = f"{side.namesrv_addr[0]}:{side.namesrv_addr[1]}"
        yield broker, side, namesrv
        nursery.cancel_scope.cancel()


async def test_producer_then_push_consumers_get_every_message_once(tmp_path: Path) -> None:
    count = 200
    async with running_broker(tmp_path / "store") as (broker, side, namesrv):
        sent = await official(tmp_path, "produce", namesrv, "E2E", str(count))
        assert sent["errors"] == []
        assert sent["statuses"] == ["OK"] * count
        assert broker.puts == count
        expected = {f"m-{i}" for i in range(count)}
        for group in ("G1", "G2"):  # each group gets everything, exactly once
            got = await official(tmp_path, "push", namesrv, "E2E", group, str(count), "30")
            assert Counter(got["bodies"]) == Counter(expected)
        # Each consumer committed its offsets on shutdown: the queues' ends, all in all.
        offsets = side.meta.offsets
        for group in ("G1", "G2"):
            assert sum(max(0, offsets.query(group, "E2E", q)) for q in range(8)) == count


async def test_batch_and_pull_consumer(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as (broker, _side, namesrv):
        sent = await official(tmp_path, "batch", namesrv, "BATCH", "10")
        assert sent == {"statuses": ["OK"], "errors": []}
        assert broker.puts == 10  # ten records, not one holding the encoded batch
        got = await official(tmp_path, "pull", namesrv, "BATCH", "PULLER")
        assert sorted(got["bodies"]) == sorted(f"b-{i}" for i in range(10))


async def test_messages_sent_while_consuming_arrive_by_long_polling(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as (_broker, _side, namesrv):
        await official(tmp_path, "produce", namesrv, "LIVE", "1", "warm")  # create the topic
        results: dict[str, Any] = {}

        async def consume() -> None:
            results.update(await official(tmp_path, "push", namesrv, "LIVE", "G", "51", "30"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.sleep(3)  # the consumer is up and its pulls are held by the broker
            sent = await official(tmp_path, "produce", namesrv, "LIVE", "50", "live")
            assert sent["statuses"] == ["OK"] * 50
        assert Counter(results["bodies"]) == Counter(["warm-0", *(f"live-{i}" for i in range(50))])


async def test_delay_levels_and_consumer_retries(tmp_path: Path) -> None:
    """A producer's delay level, and a failing consumer's send-back (level 3 + reconsume
    times), go through SCHEDULE_TOPIC_XXXX; short levels keep the test quick."""
    # The client sends a message back to the store host recorded in it: use a real port.
    port = free_port_pair("127.0.0.1")
    levels = {"message_delay_level": "1s 1s 1s 1s", "listen_port": port}
    async with running_broker(tmp_path / "store", **levels) as (broker, _side, namesrv):
        sent = await official(tmp_path, "produce", namesrv, "LATER", "3", "d", "2")
        assert sent["statuses"] == ["OK"] * 3
        stored = list(broker.store.commitlog.iter_messages())
        assert {m.topic for m in stored} == {"SCHEDULE_TOPIC_XXXX"}
        got = await official(tmp_path, "retry", namesrv, "LATER", "GR", "3", "40")
        # Each message failed once, came back through %RETRY%GR, and was then consumed.
        assert Counter(got["bodies"]) == Counter(f"d-{i}" for i in range(3))
        topics = Counter(m.topic for m in broker.store.commitlog.iter_messages())
        assert topics["LATER"] == 3  # delivered from level 2
        assert topics["%RETRY%GR"] == 3  # delivered from level 3 after the send-backs
        assert topics["SCHEDULE_TOPIC_XXXX"] == 6
