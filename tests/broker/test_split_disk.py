"""A split layout, for real: the commit log on one small tmpfs, the store root on another.

docs/operations.md recommends a disk of its own for the commit log (``storePathCommitLog``);
the consume queues, the message index and the metadata then live on the root's disk, which can
fill while the commit log's has room. The broker (a real ``python -m trioha master`` process)
must then live, refuse puts as documented (SERVICE_NOT_AVAILABLE while the queues or the index
cannot be written, one ERROR naming the writer and the OS's words), keep what it could not
write, and resume on its own once space is back: every acknowledged message delivered once
and found once by its key. (Before the index reserved its pages, the first key that needed
a new page killed the process with SIGBUS and no log line.)

The real processes need root to mount the two tmpfs; the same layout runs in process
anywhere with ENOSPC injected on the root's disk (``_diskfaults.FullDisk``).
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
import trio

from tests.broker._diskfaults import fill_until_full, injected_disk, mounted_tmpfs
from tests.broker.test_lost_tail import _consume, _delivered_once, _keys_found_once, _status
from tests.test_broker import _free_port, free_broker_port, master_config
from tests.test_epoch_mode import _Process, _until
from trioha._status import PutStatus
from trioha.broker import open_broker
from trioha.remoting import ResponseCode, open_client_pool, pull_message, send_message
from trioha.store import NewMessage

TOPIC = "LostTail"  # the helpers of test_lost_tail read this topic, two queues
#: Answers of a put that stored its message.
STORED = frozenset({ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT})


async def _send(port: int, tag: str, start: int, count: int) -> list[int]:
    """Send ``<tag>-<i>`` for i in [start, start + count); the response codes."""
    codes = []
    async with open_client_pool() as pool:
        for i in range(start, start + count):
            with trio.fail_after(10):
                result = await send_message(
                    pool,
                    f"127.0.0.1:{port}",
                    topic=TOPIC,
                    body=b"%s-%04d" % (tag.encode(), i) + b"." * 200,
                    queue_id=i % 2,
                    keys=f"{tag}-{i:04d}",
                )
            codes.append(result.code)
    return codes


def _sent(master: _Process, port: int, tag: str, start: int, count: int) -> list[int]:
    """:func:`_send`; a broker that died on the way fails the test with its exit code."""
    try:
        return trio.run(_send, port, tag, start, count)
    except BaseException:
        master.proc.wait(timeout=5)
        raise AssertionError(
            f"the broker died (rc {master.proc.returncode}):\n{master.tail()}"
        ) from None


@pytest.mark.slow
def test_a_full_store_root_beside_the_commit_logs_disk_refuses_puts_and_resumes(
    tmp_path: Path,
) -> None:
    with (
        mounted_tmpfs(tmp_path / "cl", "32m") as cl_disk,
        mounted_tmpfs(tmp_path / "root", "3m") as root_disk,
    ):
        conf = tmp_path / "broker.conf"
        conf.write_text(
            f"storePathCommitLog={cl_disk / 'commitlog'}\nmappedFileSizeCommitLog=1048576\n"
            "cleanResourceInterval=200\n"
        )
        port = free_broker_port()
        master = _Process(
            "master",
            "master",
            root_disk / "store",
            conf=conf,
            ha=_free_port(),
            listen=port,
            logs=tmp_path,
        )
        try:
            _until(lambda: bool(_status(port)), "the broker to answer", [master])
            assert _sent(master, port, "ok", 0, 60) == [0] * 60
            _delivered_once(port, "before", {"ok": 60}, [master])

            fill_until_full(root_disk / "filler")
            # Puts go on until the queues or the index need a page the disk cannot give,
            # then they are refused; the broker lives and keeps serving what it stored.
            codes = _sent(master, port, "ok", 60, 400)
            assert ResponseCode.SERVICE_NOT_AVAILABLE in codes, codes
            # Stored: PUT_OK, or FLUSH_DISK_TIMEOUT when the acknowledged mark (haSentOffset,
            # under the root too) could not record the answer; refused: nothing stored.
            assert set(codes) <= {*STORED, ResponseCode.SERVICE_NOT_AVAILABLE}, codes
            master.check_alive()
            table = _status(port)
            # (Writable flips to true for one attempt at each check: not asserted here.)
            assert "No space left on device" in table["stats.disk.failures"], table
            assert table["stats.disk.level"] == "ok"  # the commit log's own disk has room
            acked = [i for i, code in enumerate(codes, start=60) if code in STORED]

            (root_disk / "filler").unlink()

            probes: list[int] = []  # the answer to each probe, numbered in order

            def accepting() -> bool:
                probes.extend(_sent(master, port, "probe", len(probes), 1))
                return probes[-1] == 0

            _until(accepting, "puts accepted again", [master], within=30)
            assert _sent(master, port, "after", 0, 40) == [0] * 40
            keys = {f"ok-{i:04d}" for i in [*range(60), *acked]}
            keys |= {f"probe-{i:04d}" for i, code in enumerate(probes) if code in STORED}
            expected = sorted({k.encode() for k in keys} | _bodies({"after": 40}))
            _delivered_exactly(port, expected, master)
            _keys_found_once(port, [k.decode() for k in expected], [], [master])
        finally:
            out = master.stop(signal.SIGTERM)
        assert master.proc.returncode == 0, out
        assert "Traceback" not in out, out
        errors = [line for line in out.splitlines() if " ERROR " in line]
        assert any("cannot be written" in e and "No space left" in e for e in errors), out
        assert any("written again; puts accepted" in line for line in out.splitlines()), out


def _bodies(tags: dict[str, int]) -> set[bytes]:
    return {b"%s-%04d" % (tag.encode(), i) for tag, n in tags.items() for i in range(n)}


def _delivered_exactly(port: int, expected: list[bytes], master: _Process) -> None:
    """A new consumer group gets exactly ``expected`` (the probes included), each once."""
    got: list[list[bytes] | None] = [None]

    def done() -> bool:
        got[0] = trio.run(_consume, port, "fresh")
        return got[0] is not None and sorted(got[0]) == expected

    try:
        _until(done, "every acknowledged message delivered once", [master], within=30)
    except AssertionError:
        bodies = got[0] or []
        missing = sorted(set(expected) - set(bodies))[:5]
        extra = sorted(set(bodies) - set(expected))[:5]
        raise AssertionError(
            f"{len(bodies)} delivered for {len(expected)}: missing {missing}, extra {extra}"
        ) from None


async def test_a_full_store_root_beside_the_commit_logs_disk_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with ENOSPC injected on the root's disk (anywhere, root or not)."""
    caplog.set_level(logging.INFO)
    disk = injected_disk(tmp_path, monkeypatch)
    config = master_config(
        disk.root / "store",
        store_path_commit_log=str(tmp_path / "cl" / "commitlog"),
        clean_resource_interval=50,
    )
    async with open_broker(config) as master, open_client_pool() as pool:
        assert master.client_side is not None
        address = master.client_side.broker_addr
        reput = master.client_side.reput

        async def put(tag: str, i: int) -> PutStatus:
            result = await master.put(
                NewMessage(
                    topic="T",
                    body=b"%s-%d" % (tag.encode(), i),
                    queue_id=0,
                    properties={"KEYS": f"{tag}-{i}"},
                )
            )
            return result.status

        for i in range(20):  # through the broker port: the topic is created as a producer's
            sent = await send_message(
                pool, address, topic="T", body=b"ok-%d" % i, queue_id=0, keys=f"ok-{i}"
            )
            assert sent.code == ResponseCode.SUCCESS
        disk.fill()
        statuses = [await put("ok", i) for i in range(20, 60)]
        with trio.fail_after(10):
            while PutStatus.SERVICE_NOT_AVAILABLE not in statuses:
                await trio.sleep(0.05)
                statuses.append(await put("ok", len(statuses) + 20))
        stored = (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT)
        acked = [i for i, status in enumerate(statuses, start=20) if status in stored]
        failures = master.statistics().disk.failures
        assert "No space left on device" in failures
        assert "message index" in failures or "consume queues" in failures
        assert master.store.commitlog.max_offset > 0  # the commit log's disk took every put
        disk.free()
        after: list[PutStatus] = []  # the answer to each put since, numbered in order
        with trio.fail_after(10):
            while not after or after[-1] is not PutStatus.PUT_OK:
                after.append(await put("after", len(after)))
                await trio.sleep(0.05)
        await reput.wait_dispatched(master.store.commitlog.max_offset)
        got: list[bytes] = []
        offset = 0
        while True:
            pulled = await pull_message(
                pool, address, group="fresh", topic="T", queue_id=0, offset=offset
            )
            if not pulled.messages:
                assert pulled.code == ResponseCode.PULL_NOT_FOUND, pulled
                break
            got += [m.body for m in pulled.messages]
            offset = pulled.next_begin_offset
        expected = [b"ok-%d" % i for i in [*range(20), *acked]]
        expected += [b"after-%d" % i for i, status in enumerate(after) if status in stored]
        assert got == expected
        assert reput.index is not None
        for body in expected:
            key = body.decode()
            found = reput.index.query_offsets("T", key, 32, 0, 2**62).phy_offsets
            assert len(found) == 1, (key, found)
    assert any(
        r.levelno == logging.ERROR and "No space left on device" in r.getMessage()
        for r in caplog.records
    )
