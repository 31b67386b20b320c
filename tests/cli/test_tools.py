"""The ``namesrv``, ``put``, ``tail`` and ``status`` commands."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.broker.test_official_client import running_broker
from trioha.cli._tools import broker_status, put_messages, tail_messages


async def test_put_tail_status(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as (broker, side, namesrv):
        out = io.StringIO()
        with trio.fail_after(30):
            failed = await put_messages(namesrv, "CLI", count=12, size=40, tags="X", out=out)
        lines = out.getvalue().splitlines()
        assert failed == 0
        assert len(lines) == 12
        assert all(" SEND_OK broker-a/" in line for line in lines)
        assert broker.puts == 12
        printed = io.StringIO()
        with trio.fail_after(30):
            count = await tail_messages(namesrv, "CLI", "TAILERS", count=12, out=printed)
        assert count == 12
        bodies = sorted(line.split(": ", 1)[1] for line in printed.getvalue().splitlines())
        assert bodies == sorted((f"trioha message {i} " * 5)[:40] for i in range(12))
        assert all("tags=X" in line for line in printed.getvalue().splitlines())
        # tail committed what it printed: the group's offsets add up to the messages.
        offsets = side.meta.offsets
        assert sum(max(0, offsets.query("TAILERS", "CLI", q)) for q in range(8)) == 12
        table_out = io.StringIO()
        table = await broker_status(side.broker_addr, out=table_out)
        assert table["brokerRole"] == "ASYNC_MASTER"
        assert "commitLogMaxOffset" in table_out.getvalue()


async def test_commands_run_from_python_m_trioha(tmp_path: Path) -> None:
    async with running_broker(tmp_path / "store") as (_broker, side, namesrv):
        with trio.fail_after(60):
            put = await trio.run_process(
                [
                    sys.executable,
                    "-m",
                    "trioha",
                    "put",
                    "--namesrv",
                    namesrv,
                    "--topic",
                    "PM",
                    "--count",
                    "3",
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert put.returncode == 0, put.stderr.decode()
            assert put.stdout.decode().count("SEND_OK") == 3
            status = await trio.run_process(
                [sys.executable, "-m", "trioha", "status", side.broker_addr],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert status.returncode == 0, status.stderr.decode()
            assert "brokerRole" in status.stdout.decode()
            listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
            closed_port = listener.socket.getsockname()[1]
            await listener.aclose()
            bad = await trio.run_process(
                [sys.executable, "-m", "trioha", "status", f"127.0.0.1:{closed_port}"],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
            assert bad.returncode == 1
            assert bad.stderr.decode().strip().splitlines() == [
                f"trioha status: error: cannot connect to 127.0.0.1:{closed_port}: "
                f"all attempts to connect to 127.0.0.1:{closed_port} failed"
            ]


class ProcessLog:
    """What a child process has written to stderr so far; read further on demand."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.text = b""

    async def wait_for(self, pattern: bytes) -> re.Match[bytes]:
        """Read stderr until *pattern* (a regular expression) matches it; the match."""
        assert self.process.stderr is not None
        while (found := re.search(pattern, self.text)) is None:
            chunk = await self.process.stderr.receive_some(4096)
            assert chunk, self.text
            self.text += chunk
        return found


@asynccontextmanager
async def running_namesrv(*args: str) -> AsyncIterator[tuple[ProcessLog, str]]:
    """``python -m trioha namesrv ARGS`` until the block ends (30 s at most): its stderr, and
    the address it says it listens on. SIGTERM then stops it, which must exit 0."""
    command = [sys.executable, "-m", "trioha", "namesrv", *args]
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def run(task_status: trio.TaskStatus[trio.Process]) -> None:
                await trio.run_process(
                    command, stderr=subprocess.PIPE, check=False, task_status=task_status
                )

            process: trio.Process = await nursery.start(run)
            log = ProcessLog(process)
            found = await log.wait_for(rb"name server listening on [\d.]+:(\d+)")
            yield log, f"127.0.0.1:{int(found.group(1))}"
            process.terminate()
    assert process.returncode == 0


async def test_namesrv_command_serves_until_terminated() -> None:
    async with running_namesrv("--listen", "127.0.0.1:0"):
        pass


async def test_namesrv_command_takes_a_properties_file_and_settings(tmp_path: Path) -> None:
    """``trioha namesrv -c namesrv.properties --set ...``, as ``mqnamesrv -c``: the file's keys
    (a RocketMQ one trioha ignores is said so), and a --set cap that bites."""
    conf = tmp_path / "namesrv.properties"
    conf.write_text(
        "listenPort=0\nserverChannelMaxIdleTimeSeconds=300\nrocketmqHome=/opt/rocketmq\n"
    )
    settings = ["--set", "serverMaxConnections=2", "--set", "serverConnectionReservePercent=0"]
    async with running_namesrv("-c", str(conf), *settings) as (log, address):
        host, port = address.rsplit(":", 1)
        clients = [await trio.open_tcp_stream(host, int(port)) for _ in range(3)]
        await log.wait_for(rb"its cap \(serverMaxConnections\)")
        for client in clients:
            await client.aclose()
    text = log.text.decode()
    assert "rocketmqHome is where RocketMQ finds its logging configuration" in text
    assert "holds 2 connections, its cap (serverMaxConnections)" in text
