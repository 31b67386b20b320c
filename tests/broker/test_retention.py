"""Retention on a running broker (``DefaultMessageStore.cleanFilesPeriodically``): commit log
files deleted by age at ``deleteWhen``, by disk usage at once, forcibly above
``diskSpaceCleanForciblyRatio``; the consume queues and the index follow; readers and a
restart meet the new start.

Deterministic: trio's clock jumps (``autojump_clock``), the wall clock and hour retention
reads are the test's, and the disk guard measures through a fake probe. The last two tests
run in real time: two brokers over TCP in this process, then ``python -m trioha`` processes
(marked slow), where file ages are set on disk (``os.utime``) as retention reads them."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.broker._diskfaults import mounted_tmpfs
from tests.broker.test_lost_tail import _offset, _produce, _reaches, _status
from tests.test_broker import SEG, _free_port, master_config, slave_config
from tests.test_epoch_mode import _until
from tests.test_failover import _Cluster
from trioha._errors import StorageError
from trioha._status import PutStatus
from trioha.broker import Broker, open_broker, producer_properties
from trioha.broker._metadata import TopicConfig
from trioha.broker._retention import FIRST_RUN_DELAY, RetentionService
from trioha.remoting import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
    open_client_pool,
    pull_message,
    runtime_info,
)
from trioha.store import NewMessage, used_ratio

HOUR = 3600.0
BODY = b"m" * 1000  # about 60 messages a segment


class World:
    """The wall clock, the hour and the disk usage retention sees."""

    def __init__(self) -> None:
        self.ahead = 0.0  # seconds added to the real wall clock (file mtimes are real)
        self.hour = 12
        self.used = 0.30

    def install(self, broker: Broker) -> RetentionService:
        retention = broker.retention
        assert retention is not None
        retention.wall_clock = lambda: time.time() + self.ahead
        retention.hour_of = lambda _seconds: self.hour
        broker.disk.probe = lambda _path: self.used
        return retention


@asynccontextmanager
async def master(root: Path, world: World, **extra: Any) -> AsyncIterator[Broker]:
    settings: dict[str, Any] = {
        "file_reserved_time": 1,
        "delete_when": "04",
        "delete_commit_log_files_interval": 0,
        **extra,
    }
    async with open_broker(master_config(root, **settings)) as broker:
        world.install(broker)
        yield broker


async def fill(broker: Broker, segments: int, topic: str = "T") -> int:
    """Put messages until the log spans *segments* segments; how many were put."""
    count = 0
    while broker.store.commitlog.max_offset < (segments - 1) * SEG + SEG // 2:
        result = await broker.put(
            NewMessage(topic=topic, body=BODY, properties=producer_properties({}, keys=f"k{count}"))
        )
        assert result.status is PutStatus.PUT_OK
        count += 1
    return count


async def caught_up(slave: Broker, primary: Broker) -> None:
    with trio.fail_after(60):
        while slave.store.commitlog.max_offset < primary.store.commitlog.max_offset:  # noqa: ASYNC110 - polls the log ends
            await trio.sleep(0.05)


def commitlog_files(broker: Broker) -> list[int]:
    return sorted(int(p.name) for p in broker.store.commitlog.directory.iterdir())


async def test_expired_files_go_at_the_delete_when_hour_only(
    tmp_path: Path, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    world = World()
    async with master(tmp_path / "m", world) as broker:
        await fill(broker, 4)
        retention = broker.retention
        assert retention is not None
        world.ahead = 2 * HOUR  # every file was last written two hours ago
        await retention.run_once()
        assert commitlog_files(broker) == [0, SEG, 2 * SEG, 3 * SEG]  # not 04 yet
        assert retention.statistics().state == "idle"
        world.hour = 4
        with caplog.at_level(logging.INFO, logger="trioha.store.retention"):
            await retention.run_once()
        assert commitlog_files(broker) == [3 * SEG]  # never the file being written
        assert broker.store.commitlog.min_offset == 3 * SEG
        stats = retention.statistics()
        assert (stats.state, stats.segments_deleted, stats.bytes_deleted) == (
            "cleaning",
            3,
            3 * SEG,
        )
        assert stats.reason == "deleteWhen; deleting expired files"
        lines = [r.getMessage() for r in caplog.records if r.name == "trioha.store.retention"]
        assert lines == [
            f"retention (deleteWhen; deleting expired files): 3 commit log file(s) deleted; "
            f"the log now starts at {3 * SEG}"
        ]
        assert broker.statistics().min_offset == 3 * SEG


async def test_files_younger_than_file_reserved_time_are_kept(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    world = World()
    world.hour = 4
    async with master(tmp_path / "m", world) as broker:
        await fill(broker, 3)
        retention = broker.retention
        assert retention is not None
        await retention.run_once()  # written just now, kept an hour
        assert commitlog_files(broker) == [0, SEG, 2 * SEG]
        world.ahead = HOUR + 60
        await retention.run_once()
        assert commitlog_files(broker) == [2 * SEG]


async def test_the_service_runs_by_itself_after_its_first_delay(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    world = World()
    world.hour, world.ahead = 4, 2 * HOUR
    async with master(tmp_path / "m", world, clean_resource_interval=10_000) as broker:
        await fill(broker, 3)
        await trio.sleep(FIRST_RUN_DELAY - 1)
        assert commitlog_files(broker) == [0, SEG, 2 * SEG]
        await trio.sleep(2)
        assert commitlog_files(broker) == [2 * SEG]
        retention = broker.retention
        assert retention is not None
        runs = retention.statistics().runs
        await trio.sleep(10)
        assert retention.statistics().runs == runs + 1  # every cleanResourceInterval


async def test_a_full_disk_deletes_expired_files_whatever_the_hour(
    tmp_path: Path, autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    world = World()
    async with master(tmp_path / "m", world, clean_file_forcibly_enable=False) as broker:
        await fill(broker, 3)
        retention = broker.retention
        assert retention is not None
        world.used = 0.80  # above diskMaxUsedSpaceRatio (75)
        with caplog.at_level(logging.WARNING, logger="trioha.store.retention"):
            await retention.run_once()
            await retention.run_once()
        assert commitlog_files(broker) == [0, SEG, 2 * SEG]  # too young to go
        assert retention.statistics().state == "stuck"
        warnings = [r.getMessage() for r in caplog.records if r.name == "trioha.store.retention"]
        assert warnings == [  # once, not every run
            "disk of the commit log is 0.80 used, above diskMaxUsedSpaceRatio 0.75, but no "
            "commit log file may be deleted: none was last written more than "
            "fileReservedTime (1 h) ago (cleanFileForciblyEnable is off); free space or "
            "lower fileReservedTime"
        ]
        world.used = 0.90  # above diskSpaceCleanForciblyRatio too, but forcibly is off
        await retention.run_once()
        assert commitlog_files(broker) == [0, SEG, 2 * SEG]
        world.ahead = 2 * HOUR
        await retention.run_once()
        assert commitlog_files(broker) == [2 * SEG]
        assert retention.statistics().reason == (
            "disk above diskMaxUsedSpaceRatio; deleting expired files"
        )


async def test_above_clean_forcibly_files_go_whatever_their_age(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    world = World()
    async with master(tmp_path / "m", world, file_reserved_time=72) as broker:
        await fill(broker, 4)
        retention = broker.retention
        assert retention is not None
        world.used = 0.86
        await retention.run_once()
        assert commitlog_files(broker) == [3 * SEG]
        assert retention.statistics().reason == (
            "disk above diskMaxUsedSpaceRatio; deleting any age (disk above "
            "diskSpaceCleanForciblyRatio) files"
        )


async def test_one_run_deletes_ten_files_at_most(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    world = World()
    world.hour, world.ahead = 4, 2 * HOUR
    async with master(tmp_path / "m", world) as broker:
        await fill(broker, 13)
        retention = broker.retention
        assert retention is not None
        await retention.run_once()
        assert commitlog_files(broker) == [k * SEG for k in range(10, 13)]
        await retention.run_once()
        assert commitlog_files(broker) == [12 * SEG]


async def test_readers_meet_the_new_start(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    """Pulls below the queue's new min get PULL_OFFSET_MOVED with the min (OFFSET_TOO_SMALL),
    GET_MIN_OFFSET and the runtime info follow, and the index forgets deleted messages."""
    world = World()
    world.hour, world.ahead = 4, 2 * HOUR
    async with (
        master(tmp_path / "m", world, max_index_num=40) as broker,
        open_client_pool() as pool,
    ):
        count = await fill(broker, 3)
        side = broker.client_side
        assert side is not None
        side.meta.topics.update(TopicConfig("T"))
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        index = side.reput.index
        assert index is not None
        files_before = len(index.files)
        retention = broker.retention
        assert retention is not None
        await retention.run_once()
        commitlog = broker.store.commitlog
        assert commitlog.min_offset == 2 * SEG
        queue = side.reput.queues.get("T", 0)
        assert queue is not None
        first = queue.min_offset
        unit = queue.get(first)
        assert unit is not None and unit.commitlog_offset >= 2 * SEG
        before = queue.get(first - 1)
        assert before is not None and before.commitlog_offset < 2 * SEG

        addr = side.broker_addr
        pulled = await pull_message(pool, addr, group="G", topic="T", queue_id=0, offset=0)
        assert pulled.code == ResponseCode.PULL_OFFSET_MOVED
        assert (pulled.next_begin_offset, pulled.min_offset) == (first, first)
        pulled = await pull_message(pool, addr, group="G", topic="T", queue_id=0, offset=first)
        assert pulled.code == ResponseCode.SUCCESS and pulled.messages
        assert pulled.messages[0].physical_offset == unit.commitlog_offset

        answer = await pool.request(
            addr,
            RemotingCommand.request(RequestCode.GET_MIN_OFFSET, {"topic": "T", "queueId": 0}),
        )
        assert answer.ext_fields["offset"] == str(first)
        info = await runtime_info(pool, addr)
        assert info["commitLogMinOffset"] == str(2 * SEG)
        assert info["stats.retention.segments_deleted"] == "2"

        stats = retention.statistics()
        assert stats.index_files_deleted > 0
        assert len(index.files) == files_before - stats.index_files_deleted
        assert all(f.end_phy_offset >= 2 * SEG for f in index.files[:-1])
        assert queue.max_offset == count  # nothing of the queue's own counting moved


async def test_a_restart_after_deletion_goes_on_where_it_was(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    world = World()
    world.hour, world.ahead = 4, 2 * HOUR
    root = tmp_path / "m"
    async with master(root, world) as broker:
        count = await fill(broker, 4)
        retention = broker.retention
        assert retention is not None
        await retention.run_once()
        end = broker.store.commitlog.max_offset
        side = broker.client_side
        assert side is not None
        queue = side.reput.queues.get("T", 0)
        assert queue is not None
        min_queue = queue.min_offset
    async with master(root, world) as again:
        commitlog = again.store.commitlog
        assert (commitlog.min_offset, commitlog.max_offset) == (3 * SEG, end)
        side = again.client_side
        assert side is not None
        queue = side.reput.queues.get("T", 0)
        assert queue is not None
        assert (queue.min_offset, queue.max_offset) == (min_queue, count)
        result = await again.put(NewMessage(topic="T", body=b"after the restart"))
        assert result.status is PutStatus.PUT_OK and result.queue_offset == count


async def test_delete_expired_commitlog_runs_at_once_whatever_the_hour(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """``mqadmin deleteExpiredCommitLog`` (329): the next 20 runs delete expired files, the
    first at once; ``mqadmin cleanExpiredCQ`` (306) drops the queues left with nothing."""
    world = World()
    world.ahead = 2 * HOUR
    async with (
        master(tmp_path / "m", world, clean_resource_interval=10_000) as broker,
        open_client_pool() as pool,
    ):
        await fill(broker, 2, topic="Old")
        await fill(broker, 4, topic="New")
        side = broker.client_side
        assert side is not None
        await side.reput.wait_dispatched(broker.store.commitlog.max_offset)
        await trio.sleep(FIRST_RUN_DELAY + 1)
        assert commitlog_files(broker)[0] == 0  # hour 12: nothing
        answer = await pool.request(
            side.broker_addr, RemotingCommand.request(RequestCode.DELETE_EXPIRED_COMMITLOG, {})
        )
        assert answer.code == ResponseCode.SUCCESS
        await trio.sleep(0.5)  # no wait for the next period
        assert commitlog_files(broker) == [3 * SEG]
        retention = broker.retention
        assert retention is not None
        assert retention.statistics().manual_runs_left == 19
        assert side.reput.queues.get("Old", 0) is not None
        answer = await pool.request(
            side.broker_addr, RemotingCommand.request(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, {})
        )
        assert answer.code == ResponseCode.SUCCESS
        assert side.reput.queues.get("Old", 0) is None
        assert not (broker.store.root / "consumequeue" / "Old").exists()
        assert side.reput.queues.get("New", 0) is not None
        assert retention.statistics().consume_queues_destroyed == 1
        # removeQueueFromTopicQueueTable: the queue counts from 0 again, as in RocketMQ.
        result = await broker.put(NewMessage(topic="Old", body=b"again"))
        assert result.status is PutStatus.PUT_OK and result.queue_offset == 0


async def test_a_slave_deletes_by_its_own_rule_and_keeps_replicating(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    world = World()
    async with master(tmp_path / "m", world) as primary:
        await fill(primary, 2)
        async with open_broker(
            slave_config(tmp_path / "s", primary, file_reserved_time=1)
        ) as slave:
            slave_world = World()
            retention = slave_world.install(slave)
            await caught_up(slave, primary)
            slave_world.hour, slave_world.ahead = 4, 2 * HOUR
            await retention.run_once()
            assert commitlog_files(slave) == [SEG]
            assert commitlog_files(primary) == [0, SEG]  # the master's own rule: not yet
            await fill(primary, 3)
            await caught_up(slave, primary)
            assert slave.store.commitlog.min_offset == SEG


async def test_on_a_small_filesystem_a_full_disk_frees_itself(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A real 4 MiB tmpfs (root only; skipped elsewhere) filled past
    ``diskSpaceCleanForciblyRatio``: retention deletes the oldest files, young as they are,
    until the disk is below it again, and puts go on."""
    with mounted_tmpfs(tmp_path / "fs", "4m") as mount:
        config = master_config(
            mount / "m", file_reserved_time=72, delete_commit_log_files_interval=0
        )
        async with open_broker(config) as broker:
            retention = broker.retention
            assert retention is not None
            retention.hour_of = lambda _seconds: 12  # not deleteWhen's hour
            directory = broker.store.commitlog.directory
            while used_ratio(directory) <= 0.86:
                result = await broker.put(NewMessage(topic="T", body=BODY))
                assert result.status is PutStatus.PUT_OK
            files = len(commitlog_files(broker))
            await retention.run_once()
            stats = retention.statistics()
            assert stats.segments_deleted == 10  # one run's most
            assert len(commitlog_files(broker)) == files - 10
            assert stats.reason.endswith(
                "deleting any age (disk above diskSpaceCleanForciblyRatio) files"
            )
            for _ in range(20):
                if used_ratio(directory) <= 0.85:
                    break
                await retention.run_once()
            assert used_ratio(directory) <= 0.85
            assert broker.statistics().disk.level in ("ok", "above diskMaxUsedSpaceRatio")
            result = await broker.put(NewMessage(topic="T", body=BODY))
            assert result.status is PutStatus.PUT_OK


async def test_a_failing_run_is_logged_and_the_next_one_tries_again(
    tmp_path: Path,
    autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    world.hour, world.ahead = 4, 2 * HOUR
    async with master(tmp_path / "m", world, clean_resource_interval=10_000) as broker:
        await fill(broker, 3)
        commitlog = broker.store.commitlog

        def unreadable() -> list[int]:
            raise StorageError(f"cannot stat commit log file {commitlog.directory}/x: EIO")

        monkeypatch.setattr(commitlog, "segment_times", unreadable)
        with caplog.at_level(logging.ERROR, logger="trioha.store.retention"):
            await trio.sleep(FIRST_RUN_DELAY + 1)
        retention = broker.retention
        assert retention is not None
        assert retention.statistics().state == "stuck"
        assert "cannot stat commit log file" in retention.statistics().last_error
        lines = [r.getMessage() for r in caplog.records]
        assert lines and all(
            line.startswith("retention run failed, trying again at the next: cannot stat")
            for line in lines
        )
        monkeypatch.undo()
        await trio.sleep(10)
        assert commitlog_files(broker) == [2 * SEG]


async def test_a_slave_behind_a_deletion_is_told_and_an_empty_one_starts_at_the_oldest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two brokers over TCP (real time, small intervals): a slave stopped while its master
    deletes what it needs next gets one ERROR and stops; an empty slave is served from the
    master's first offset still held (``haSyncFromOldest``)."""
    world = World()
    with trio.fail_after(120):
        async with master(tmp_path / "m", world, ha_sync_from_oldest=True) as primary:
            await fill(primary, 2)
            async with open_broker(slave_config(tmp_path / "s", primary)) as slave:
                await caught_up(slave, primary)
            slave_end = primary.store.commitlog.max_offset
            await fill(primary, 4)
            world.hour, world.ahead = 4, 2 * HOUR
            retention = primary.retention
            assert retention is not None
            await retention.run_once()
            assert primary.store.commitlog.min_offset == 3 * SEG
            with caplog.at_level(logging.ERROR, logger="trioha.ha"):
                async with open_broker(slave_config(tmp_path / "s", primary)) as slave:
                    client = slave.ha_client
                    assert client is not None
                    assert await client.wait_fell_behind(trio.current_time() + 60)
                    stats = slave.statistics().client
                    assert stats is not None
                    assert (stats.state, stats.fell_behind_master_offset) == (
                        "fell_behind",
                        3 * SEG,
                    )
                    assert slave.store.commitlog.max_offset == slave_end
            errors = [
                r.getMessage()
                for r in caplog.records
                if r.levelno == logging.ERROR and r.name == "trioha.ha"
            ]
            assert len(errors) == 1 and errors[0].startswith(
                f"fell behind master {client.master}: this slave's log ends at {slave_end}, but "
                f"the master's now begins at {3 * SEG}"
            )
            ha = primary.statistics().ha
            assert ha is not None and ha.closed_by_reason.get("deleted") == 1
            async with open_broker(slave_config(tmp_path / "fresh", primary)) as fresh:
                await caught_up(fresh, primary)
                assert fresh.store.commitlog.min_offset == 3 * SEG


@pytest.mark.slow
def test_real_processes_a_slave_stopped_through_a_deletion_is_told_once_and_stays_stopped(
    tmp_path: Path,
) -> None:
    """``python -m trioha master|slave`` as OS processes: the slave is stopped, its master
    takes more and deletes (``mqadmin deleteExpiredCommitLog``, code 329) the files whose
    last write is older than ``fileReservedTime``, the ones past the slave's end included.
    Restarted, the slave logs one ERROR naming both offsets and stays ``fell_behind``
    without reconnecting; the master serves on; an empty slave copies from the master's
    first offset still held (``haSyncFromOldest``)."""
    seg = 16 * 1024  # about 40 of test_lost_tail's messages a file
    c = _Cluster(
        tmp_path,
        f"mappedFileSizeCommitLog={seg}\nhaSyncFromOldest=true\nhaSendHeartbeatInterval=200\n"
        "haHousekeepingInterval=2000\nhaReconnectBackoffMax=200\n"
        "fileReservedTime=1\ndeleteCommitLogFilesInterval=0\n",
    )
    ha = _free_port()
    m_port, s_port, n_port = c.port("m"), c.port("s"), c.port("n")
    try:
        master = c.start("m1", "master", "m", ha)
        slave = c.start("s1", "slave", "s", ha)
        trio.run(_produce, m_port, "before", 150)  # three files and some
        slave_end = _offset(m_port, "commitLogMaxOffset")
        _reaches(s_port, slave_end, "the slave copies the master", [master, slave])
        slave.stop()
        trio.run(_produce, m_port, "after", 150)
        end = _offset(m_port, "commitLogMaxOffset")
        # Every file up to the one holding the slave's end was last written two hours ago
        # (fileReservedTime is one); the ones after stay young, and so stay.
        new_min = slave_end - slave_end % seg + seg
        assert end > new_min + seg, (slave_end, end)  # a young full file, then the last
        files = sorted((tmp_path / "m" / "commitlog").iterdir())
        assert [int(f.name) for f in files] == [k * seg for k in range(end // seg + 1)]
        two_hours_ago = time.time() - 2 * HOUR
        for file in files:
            if int(file.name) < new_min:
                os.utime(file, (two_hours_ago, two_hours_ago))

        async def delete_expired() -> int:
            async with open_client_pool() as pool:
                request = RemotingCommand.request(RequestCode.DELETE_EXPIRED_COMMITLOG, {})
                with trio.fail_after(10):
                    return (await pool.request(f"127.0.0.1:{m_port}", request)).code

        assert trio.run(delete_expired) == ResponseCode.SUCCESS
        _until(
            lambda: _offset(m_port, "commitLogMinOffset") == new_min,
            f"the master deletes the files below {new_min}",
            [master],
        )
        assert [int(f.name) for f in sorted((tmp_path / "m" / "commitlog").iterdir())] == [
            k * seg for k in range(new_min // seg, end // seg + 1)
        ]

        connects_before = master.output.count("slave connected from")
        behind = c.start("s2", "slave", "s", ha)
        _until(
            lambda: _status(s_port).get("stats.client.state") == "fell_behind",
            "the restarted slave is told it fell behind",
            [master, behind],
        )
        trio.run(trio.sleep, 3)  # haReconnectBackoffMax is 200 ms: a loop would show
        status = _status(s_port)
        assert (
            status["stats.client.state"],
            status["stats.client.needs_reseed"],
            status["stats.client.fell_behind_master_offset"],
            status["stats.client.connects"],
            status["commitLogMaxOffset"],
        ) == ("fell_behind", "true", str(new_min), "1", str(slave_end))
        assert behind.output.count("connected to master") == 1, behind.output
        assert master.output.count("slave connected from") == connects_before + 1
        shown = subprocess.run(
            [sys.executable, "-m", "trioha", "status", f"127.0.0.1:{s_port}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown
        assert re.search(r"^stats\.client\.state +fell_behind$", shown.stdout, re.M), shown
        errors = [line for line in behind.output.splitlines() if " ERROR " in line]
        assert len(errors) == 1, behind.output
        assert f"this slave's log ends at {slave_end}," in errors[0], errors[0]
        assert f"the master's now begins at {new_min};" in errors[0], errors[0]
        assert "re-seed this slave" in errors[0], errors[0]
        trio.run(_produce, m_port, "served", 1)  # the master serves on: SEND_OK (asserted)
        behind.stop()

        fresh = c.start("n1", "slave", "n", ha)
        end = _offset(m_port, "commitLogMaxOffset")
        _reaches(n_port, end, "an empty slave copies the master", [master, fresh])
        assert _offset(n_port, "commitLogMinOffset") == _offset(m_port, "commitLogMinOffset")
        assert _offset(n_port, "commitLogMinOffset") == new_min
    finally:
        c.stop_all()
    for process in c.processes:
        assert "Traceback" not in process.output, process.output
