"""Background writers under an injected ENOSPC: nothing raises, nothing is lost, all resumes.

Runs everywhere (no mount needed): the file layer the store's writers see is swapped for one
whose writes fail with ENOSPC while the test says so (``tests/broker/_diskfaults.py``).
``test_disk_full.py`` runs whole brokers on a real full filesystem and on this one.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from tests.broker._diskfaults import FullDisk
from tests.broker.test_reput import fill
from tests.test_broker import master_config
from trioha.broker._clientside import _Persister
from trioha.broker._metadata import Metadata
from trioha.broker._reput import ReputService
from trioha.store import CONSUME_QUEUE, METADATA, ConsumeQueueStore, DiskGuard, MemoryCommitLog


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FullDisk:
    fake = FullDisk(tmp_path)
    fake.install(monkeypatch)
    return fake


async def test_the_consume_queue_builder_survives_enospc_and_catches_up(
    tmp_path: Path, disk: FullDisk, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryCommitLog(segment_size=1 << 20)
    fill(log, 10)
    guard = DiskGuard({})
    reput = ReputService(
        log,
        ConsumeQueueStore(tmp_path, file_size=2000),
        checkpoint=tmp_path / "cp.json",
        disk=guard,
        retry_interval=0.05,
    )
    reput.recover()

    async def grew(offset: int) -> None:
        await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        await nursery.start(reput.run, grew)
        with trio.fail_after(5):
            await reput.wait_dispatched(log.max_offset)
        queue = reput.queues.get("T", 0)
        assert queue is not None
        readable_before = queue.max_offset

        disk.full = True
        fill(log, 10)
        with trio.fail_after(5):
            while not guard.failing(CONSUME_QUEUE):  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert not guard.writable  # WRITE_LOGICS_QUEUE_ERROR: puts stop
        # Reads go on over what is on disk; nothing half-written shows.
        assert len(queue.read(0, 100)) == readable_before
        assert queue.get(readable_before) is None
        assert await reput.flush() == -1  # no checkpoint past units that are not written
        await trio.sleep(0.2)  # retried quietly meanwhile

        disk.full = False
        with trio.fail_after(5):
            await reput.wait_dispatched(log.max_offset)
            while guard.failing(CONSUME_QUEUE):  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert guard.statistics().writable  # (a fresh read: mypy narrowed .writable above)
        assert await reput.flush() == log.max_offset
        nursery.cancel_scope.cancel()

    messages = [m for m in log.iter_messages() if m.queue_id == 0]
    units = queue.read(0, 100)
    assert [u.commitlog_offset for u in units] == [m.physical_offset for m in messages]
    errors = [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and "consume queues cannot be written" in r.getMessage()
    ]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()


async def test_metadata_persisting_survives_enospc_and_writes_later(
    tmp_path: Path, disk: FullDisk
) -> None:
    config = master_config(tmp_path)
    meta = Metadata.load(tmp_path, config)
    guard = DiskGuard({})
    persister = _Persister(meta, guard)
    meta.offsets.commit("G", "T", 0, 42)
    disk.full = True
    await persister.persist()  # does not raise
    assert guard.failing(METADATA) and guard.writable  # puts are not stopped by this
    assert meta.offsets.dirty
    # The request path (a topic created by a send) does not raise either.
    meta.topics.persist()
    disk.full = False
    await persister.persist()
    assert not guard.failing(METADATA)
    reloaded = Metadata.load(tmp_path, config)
    assert reloaded.offsets.query("G", "T", 0) == 42
