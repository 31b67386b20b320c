"""/metrics from a running master and slave, scraped and parsed as Prometheus parses it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.test_broker import caught_up, connected, master_config, slave_config
from trioha._config import BrokerRole
from trioha.broker import Broker, open_broker, producer_properties
from trioha.metrics import BrokerCollector, NamesrvCollector, serve_metrics
from trioha.namesrv import NamesrvProcessor
from trioha.store import NewMessage


async def http_get(address: tuple[str, int], path: str, method: str = "GET") -> tuple[str, str]:
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = bytearray()
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], body.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return found[(name, tuple(sorted(labels.items())))]


@asynccontextmanager
async def metrics_of(collector: object) -> AsyncIterator[tuple[str, int]]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_metrics, collector, "127.0.0.1", 0)
        yield address
        nursery.cancel_scope.cancel()


async def test_master_and_slave_metrics_move_with_sync_puts(tmp_path: Path) -> None:
    async with (
        open_broker(master_config(tmp_path / "m", BrokerRole.SYNC_MASTER)) as master,
        metrics_of(BrokerCollector(master)) as m_addr,
    ):
        slave_cm = open_broker(slave_config(tmp_path / "s", master))
        slave: Broker = await slave_cm.__aenter__()
        try:
            async with metrics_of(BrokerCollector(slave)) as s_addr:
                await connected(master)
                status, text = await http_get(m_addr, "/metrics")
                assert status == "HTTP/1.1 200 OK"
                before = samples(text)
                during: list[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = []

                async def sync_puts(done: trio.Event) -> None:
                    for i in range(200):
                        assert (
                            await master.put(
                                NewMessage(
                                    topic="T",
                                    body=b"x" * 100,
                                    properties=producer_properties(keys=f"k{i}"),
                                )
                            )
                        ).ok
                    done.set()

                async with trio.open_nursery() as nursery:
                    done = trio.Event()
                    nursery.start_soon(sync_puts, done)
                    while not done.is_set():  # scrapes while the sync puts run
                        during.append(samples((await http_get(m_addr, "/metrics"))[1]))
                        await trio.sleep(0.005)
                await caught_up(master, slave)
                after = samples((await http_get(m_addr, "/metrics"))[1])
                end = master.store.commitlog.max_offset
                assert value(after, "trioha_commitlog_max_offset_bytes") == end
                assert value(after, "trioha_puts_total") == value(before, "trioha_puts_total") + 200
                (peer,) = [
                    dict(k[1])["peer"] for k in after if k[0] == "trioha_ha_slave_ack_offset_bytes"
                ]
                assert value(after, "trioha_ha_slave_ack_offset_bytes", peer=peer) == end
                assert value(after, "trioha_ha_slave_behind_bytes", peer=peer) == 0
                assert value(after, "trioha_ha_slave_behind_seconds", peer=peer) == 0
                # The acked offset only moves forward, and reaches the end.
                acks = [value(d, "trioha_ha_slave_ack_offset_bytes", peer=peer) for d in during]
                assert len(acks) >= 2 and acks == sorted(acks)
                assert acks[-1] < end or len(set(acks)) > 1
                assert value(after, "trioha_put_results_total", status="PUT_OK") == 200 + (
                    before.get(("trioha_put_results_total", (("status", "PUT_OK"),)), 0)
                )
                assert value(after, "trioha_put_latency_seconds_count", mode="sync") == 200
                assert (
                    value(after, "trioha_put_latency_seconds_bucket", mode="sync", le="+Inf") == 200
                )
                assert value(after, "trioha_ha_slave_frames_sent_total", peer=peer) >= 1
                assert value(after, "trioha_ha_slaves_connected") == 1
                slave_side = samples((await http_get(s_addr, "/metrics"))[1])
                assert value(slave_side, "trioha_ha_client_reported_offset_bytes") == end
                assert value(slave_side, "trioha_ha_client_connects_total") == 1
                assert value(slave_side, "trioha_broker_info", role="SLAVE") == 1
                assert value(slave_side, "trioha_ha_client_state_info", state="connected") == 1
                # Counted while the connection lasts, not only when it ends.
                assert value(slave_side, "trioha_ha_client_received_bytes_total") >= end - value(
                    before, "trioha_commitlog_max_offset_bytes"
                )
                assert value(slave_side, "trioha_ha_client_appended_bytes_total") == end - value(
                    before, "trioha_commitlog_max_offset_bytes"
                )
                # Bytes behind once the slave has learned the master's end (metadata sync).
                assert "trioha_ha_client_behind_bytes" not in {k[0] for k in slave_side}
                assert "trioha_ha_client_behind_seconds" not in {k[0] for k in slave_side}
                assert slave.client_side is not None and master.client_side is not None
                sync = slave.client_side.slave_sync
                assert sync is not None
                sync.master_addr = master.client_side.broker_addr
                assert await sync.sync_master_end()
                learned = samples((await http_get(s_addr, "/metrics"))[1])
                assert value(learned, "trioha_ha_client_behind_bytes") == 0
                assert value(learned, "trioha_ha_client_behind_seconds") == 0
                # GET_BROKER_RUNTIME_INFO shows the same figures.
                info = slave.client_side.processor.extra_info()
                assert (info["haClientBehindBytes"], info["haClientBehindSeconds"]) == (
                    "0",
                    "0.000",
                )
        finally:
            await slave_cm.__aexit__(None, None, None)
        # The slave is gone: the master's series say so.
        assert master.ha_service is not None
        with trio.fail_after(10):
            await master.ha_service.wait_no_connections()
        gone = samples((await http_get(m_addr, "/metrics"))[1])
        assert value(gone, "trioha_ha_slaves_connected") == 0
        closed = {
            dict(labels)["reason"]: v
            for (name, labels), v in gone.items()
            if name == "trioha_ha_connections_closed_total"
        }
        assert sum(closed.values()) == 1
        assert set(closed) <= {"peer_closed", "broken", "shutdown"}, closed


async def test_reconnects_and_states_when_the_slave_and_the_master_go(tmp_path: Path) -> None:
    async with (
        open_broker(master_config(tmp_path / "m")) as master,
        metrics_of(BrokerCollector(master)) as m_addr,
    ):
        address = master.ha_address
        assert address is not None
        for _ in range(2):  # the slave is killed, and started again
            async with open_broker(slave_config(tmp_path / "s", master)):
                await connected(master)
        assert master.ha_service is not None
        with trio.fail_after(10):
            await master.ha_service.wait_no_connections()
        seen = samples((await http_get(m_addr, "/metrics"))[1])
        assert value(seen, "trioha_ha_connections_accepted_total") == 2
        closed = sum(
            v for (name, _), v in seen.items() if name == "trioha_ha_connections_closed_total"
        )
        assert closed == 2
        assert value(seen, "trioha_ha_slaves_connected") == 0
    # Now the master goes and comes back on the same port: the slave's series follow.
    async with (
        open_broker(slave_config(tmp_path / "s", address)) as slave,
        metrics_of(BrokerCollector(slave)) as s_addr,
    ):
        assert slave.ha_client is not None
        async with open_broker(master_config(tmp_path / "m", ha_listen_port=address[1])):
            with trio.fail_after(10):
                await slave.ha_client.wait_connected()
            up = samples((await http_get(s_addr, "/metrics"))[1])
            assert value(up, "trioha_ha_client_state_info", state="connected") == 1
        with trio.fail_after(10):
            while slave.ha_client.connected:
                await slave.ha_client._state_change.park()
        down = samples((await http_get(s_addr, "/metrics"))[1])
        assert value(down, "trioha_ha_client_connected", master=slave.ha_client.master) == 0
        assert value(down, "trioha_ha_client_state_info", state="connecting") == 1
        reasons = {
            dict(labels)["reason"]: v
            for (name, labels), v in down.items()
            if name == "trioha_ha_client_disconnects_total"
        }
        assert sum(reasons.values()) >= 1, reasons
        async with open_broker(master_config(tmp_path / "m", ha_listen_port=address[1])):
            with trio.fail_after(10):
                await slave.ha_client.wait_connected(connects=2)
            again = samples((await http_get(s_addr, "/metrics"))[1])
            assert value(again, "trioha_ha_client_connects_total") == 2
            assert value(again, "trioha_ha_client_state_info", state="connected") == 1


async def test_the_metrics_port_answers_only_what_it_serves(tmp_path: Path) -> None:
    processor = NamesrvProcessor()
    async with metrics_of(NamesrvCollector(processor)) as addr:
        status, text = await http_get(addr, "/metrics")
        assert status.endswith("200 OK")
        assert value(samples(text), "trioha_namesrv_brokers") == 0
        assert (await http_get(addr, "/nope"))[0].endswith("404 Not Found")
        assert (await http_get(addr, "/metrics", method="POST"))[0].endswith(
            "405 Method Not Allowed"
        )
        assert (await http_get(addr, "/metrics", method="HEAD"))[1] == ""
        garbage = await trio.open_tcp_stream(*addr)
        async with garbage:
            await garbage.send_all(b"\x00\x01garbage\r\n\r\n")
            assert b"400 Bad Request" in await garbage.receive_some(1024)


async def test_a_port_in_use_is_one_clear_error() -> None:
    from trioha._errors import ConfigError

    async with (
        metrics_of(NamesrvCollector(NamesrvProcessor())) as (host, port),
        trio.open_nursery() as nursery,
    ):
        with pytest.raises(ConfigError, match=rf"{port} \(--metrics-listen\)"):
            await nursery.start(serve_metrics, NamesrvCollector(NamesrvProcessor()), host, port)


def test_every_metric_is_listed_in_the_operations_page() -> None:
    import re

    root = Path(__file__).resolve().parent.parent
    code = (root / "trioha" / "metrics" / "_collect.py").read_text()
    page = (root / "docs" / "operations.md").read_text()
    names = set(re.findall(r'"(trioha_[a-z_]+)"', code))
    assert len(names) > 30
    missing = [n for n in sorted(names) if f"`{n}`" not in page and f"`{n}_total`" not in page]
    assert missing == []
