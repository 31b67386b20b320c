"""A full disk, for real: the store on a small tmpfs that the test fills and then frees.

Mirrors what ``DefaultMessageStore`` does under disk pressure (its ``isSpaceFull`` check and
``RunningFlags``): puts are refused with RocketMQ's statuses, reads, pulls and replication go
on, nothing stored is damaged, and writing resumes on its own once space is back. Each test
runs twice: on a real 2 MiB tmpfs (root only; skipped elsewhere) and with ENOSPC injected at
the file layer (everywhere).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import trioha
from tests.broker._diskfaults import Disk, injected_disk, tmpfs_disk
from tests.test_broker import master_config, slave_config
from trioha._status import PutStatus
from trioha.broker import Broker, open_broker
from trioha.cli._demo import compare_logs
from trioha.remoting import ResponseCode, open_client_pool, pull_message, runtime_info, send_message
from trioha.store import NewMessage, open_store

FAST_DISK: dict[str, Any] = {"clean_resource_interval": 50}


@pytest.fixture(params=["tmpfs", "injected"])
def disk(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Disk]:
    if request.param == "tmpfs":
        yield from tmpfs_disk(tmp_path)
    else:
        yield injected_disk(tmp_path, monkeypatch)


async def wait_until(check: Any, what: str, seconds: float = 10.0) -> None:
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110 - polls broker state that has no event
            await trio.sleep(0.02)


async def put_until_refused(broker: Broker, limit: int = 2000) -> tuple[int, PutStatus]:
    """Put 1 KiB messages until one is refused; (puts that worked, the refusal's status)."""
    for i in range(limit):
        result = await broker.put(
            NewMessage(topic="Full", body=bytes([i % 251]) * 1024, queue_id=0)
        )
        if result.status is not PutStatus.PUT_OK:
            return i, result.status
    raise AssertionError(f"{limit} puts of 1 KiB all succeeded on a full disk")


async def test_a_master_with_a_full_disk_refuses_puts_keeps_serving_and_resumes(
    tmp_path: Path, disk: Disk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    mconf = master_config(disk.root / "master", **FAST_DISK)
    async with (
        open_broker(mconf) as master,
        open_broker(slave_config(tmp_path / "slave", master, **FAST_DISK)) as slave,
        open_client_pool() as pool,
    ):
        assert master.client_side is not None
        addr = master.client_side.broker_addr
        for i in range(20):
            result = await master.put(NewMessage(topic="Full", body=b"before %d" % i))
            assert result.status is PutStatus.PUT_OK
        disk.fill()

        # The last allocated page may still take a message or two; then the disk says no.
        ok, status = await put_until_refused(master)
        assert status in (PutStatus.CREATE_MAPPED_FILE_FAILED, PutStatus.SERVICE_NOT_AVAILABLE)
        await wait_until(
            lambda: master.statistics().disk.level.startswith("above diskSpaceW"), "DISK_FULL"
        )
        stats = master.statistics().disk
        assert not stats.writable and stats.commitlog_ratio > 0.9
        assert (
            await master.put(NewMessage(topic="Full", body=b"x"))
        ).status is PutStatus.SERVICE_NOT_AVAILABLE

        # What a producer gets: code 14 with RocketMQ's remark and the used fractions.
        sent = await send_message(pool, addr, topic="Full", body=b"x", queue_id=0)
        assert sent.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert sent.remark is not None and "disk is full [CL:  1.00" in sent.remark

        # Reads go on: a pull from the master, and the slave holds everything stored that the
        # master's sent mark covers (it is on the full disk too: what lies past it waits).
        pulled = await pull_message(pool, addr, group="g", topic="Full", queue_id=0, offset=0)
        assert pulled.code == ResponseCode.SUCCESS
        assert pulled.messages[0].body == b"before 0"
        marks = master.marks
        assert marks is not None
        await wait_until(
            lambda: (
                slave.store.commitlog.max_offset == marks.sent.sent
                and (marks.sent.sent == master.store.commitlog.max_offset or marks.sending_paused)
            ),
            "slave caught up as far as the sent mark goes",
        )
        assert slave.ha_client is not None and slave.ha_client.connected
        assert slave.ha_client.connects == 1
        table = await runtime_info(pool, addr)
        assert table["stats.disk.writable"] == "false"  # Java booleans, never a Python repr
        assert table["commitLogDiskRatio"] == "1.0"  # RocketMQ's RunningStats name
        assert table["stats.build"] == trioha.build_info().describe()  # which build runs

        # Space back: writing resumes without a restart.
        disk.free()
        await wait_until(lambda: master.statistics().disk.writable, "writable again")
        for i in range(10):
            assert (
                await master.put(NewMessage(topic="Full", body=b"after %d" % i))
            ).status is PutStatus.PUT_OK
        await wait_until(
            lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset,
            "slave caught up again",
        )
        assert compare_logs(master, slave) is None
        assert slave.ha_client.connects == 1  # never a reconnect loop
        expected = 20 + ok + 10

    # One ERROR when DISK_FULL was set and one line when it cleared, not one per check.
    full = [
        r
        for r in caplog.records
        if "above diskSpaceWarningLevelRatio" in r.getMessage() and r.levelno == logging.ERROR
    ]
    assert len(full) == 1
    # The OS's own words reach the operator.
    assert any(
        r.levelno == logging.ERROR and "No space left on device" in r.getMessage()
        for r in caplog.records
    )
    # Nothing stored was damaged: the store reopens cleanly with every message.
    with open_store(disk.root / "master") as store:
        assert store.recovery.clean_shutdown and store.recovery.cut_bytes == 0
        assert sum(1 for _ in store.commitlog.iter_messages()) == expected


async def test_a_master_whose_sent_mark_cannot_be_written_pauses_replication_and_resumes(
    tmp_path: Path, disk: Disk, caplog: pytest.LogCaptureFixture
) -> None:
    """The sent mark lives in the store root: with that disk full, nothing goes out past it.
    The slave stays connected, one ERROR says so, and replication resumes by itself."""
    caplog.set_level(logging.INFO)
    async with open_broker(master_config(disk.root / "master", **FAST_DISK)) as master:
        for i in range(20):  # no slave yet: nothing sent, nothing reserved past the start
            assert (
                await master.put(NewMessage(topic="T", body=b"early %d" % i))
            ).status is PutStatus.PUT_OK
        marks = master.marks
        assert marks is not None and marks.sent.reserved == 0
        end = master.store.commitlog.max_offset
        disk.fill()
        async with open_broker(slave_config(tmp_path / "slave", master, **FAST_DISK)) as slave:
            client = slave.ha_client
            assert client is not None
            await wait_until(lambda: marks.sending_paused, "sending paused at the mark")
            await wait_until(lambda: client.connected, "the slave connected")
            await trio.sleep(0.5)  # ten retry intervals
            assert client.connected and client.connects == 1  # no reconnect loop
            assert slave.store.commitlog.max_offset == 0
            assert "HA sent mark" in master.statistics().disk.failures
            disk.free()
            await wait_until(
                lambda: slave.store.commitlog.max_offset == end, "slave caught up after space"
            )
            assert compare_logs(master, slave) is None
            assert client.connects == 1
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR and "HA sent mark" in r.getMessage()
    ]
    assert len(errors) == 1, errors
    assert "replication to slaves is paused at offset 0 (the slaves stay connected)" in errors[0]
    assert "No space left on device" in errors[0]
    assert not any("HA connection with" in r.getMessage() for r in caplog.records)  # no trace
    assert any(
        r.getMessage() == "HA sent mark written again; replication to slaves resumes"
        for r in caplog.records
    )


async def test_a_slave_with_a_full_disk_pauses_replication_and_resumes(
    tmp_path: Path, disk: Disk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with open_broker(master_config(tmp_path / "master", **FAST_DISK)) as master:
        sconf = slave_config(disk.root / "slave", master, **FAST_DISK)
        async with open_broker(sconf) as slave:
            assert slave.ha_client is not None
            await master.put(NewMessage(topic="T", body=b"first"))
            await wait_until(
                lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset,
                "slave caught up",
            )
            disk.fill()
            for i in range(400):  # ~400 KiB: more than any page left on the slave
                await master.put(NewMessage(topic="T", body=bytes([i % 251]) * 1024))
            await wait_until(lambda: slave.ha_client.append_error is not None, "append refused")
            stats = slave.statistics()
            assert stats.client is not None and stats.client.append_error is not None
            assert "No space left on device" in stats.client.append_error
            connects = slave.ha_client.connects
            await trio.sleep(0.5)
            # Backing off (every cleanResourceInterval, at least), not a hot loop.
            assert slave.ha_client.connects - connects <= 0.5 / 0.05 + 1

        # A restart while the disk is still full starts, and waits the same way.
        async with open_broker(sconf) as slave:
            assert slave.ha_client is not None
            await wait_until(lambda: slave.ha_client.append_error is not None, "refused again")
            disk.free()
            await wait_until(
                lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset,
                "slave caught up after space came back",
            )
            assert slave.ha_client.append_error is None
            assert compare_logs(master, slave) is None
    errors = [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and "slave cannot append" in r.getMessage()
    ]
    assert len(errors) == 2  # once per run of the slave, not once per attempt
    assert any("appends replicated data again" in r.getMessage() for r in caplog.records)
