"""End to end, real processes: after a power cut, every kept and every new message is delivered.

A master whose unflushed tail a slave had replicated loses that tail in a power cut and
restarts (told to discard the acknowledged messages it lost, ``--accept-lost-acknowledged``:
by default it refuses and names the slave to promote). Its consume queues, flushed on their
own schedule, may still hold units of the lost messages; in classic mode its log is then
closed with END_OF_FILE records past the lost range (docs/replication.md). A consumer group
that has never consumed must then get every message the log kept and every message produced
since, each exactly once, and nothing else: no unit of a lost message served as an empty
record, no new message left out because the queue builder stopped in the padding. The same
holds for the slave once it is cut back to the master's history (classic: ``trioha slave
--truncate-to-master``; epoch mode: by itself at the consistent point), whose consume queues
must then list the same messages.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.test_broker import _free_port, free_broker_port
from tests.test_epoch_mode import _Process, _until
from trioha._errors import RemotingError
from trioha.remoting import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
    open_client_pool,
    pull_message,
    runtime_info,
    send_message,
)
from trioha.store import DecodedMessage, decode_record

SEG = 64 * 1024
TOPIC = "LostTail"
QUEUES = 2
pytestmark = pytest.mark.slow


async def _produce(port: int, tag: str, count: int) -> None:
    """``count`` messages with bodies ``<tag>-<i>``, spread over the queues; waits (bounded)
    for the broker port to answer first."""
    address = f"127.0.0.1:{port}"
    async with open_client_pool() as pool:
        with trio.fail_after(60):
            while True:
                try:
                    await runtime_info(pool, address)
                    break
                except (OSError, RemotingError):
                    await trio.sleep(0.1)
        for i in range(count):
            with trio.fail_after(10):
                result = await send_message(
                    pool,
                    address,
                    topic=TOPIC,
                    body=b"%s-%04d" % (tag.encode(), i) + b"." * 200,
                    queue_id=i % QUEUES,
                    keys=f"{tag}-{i:04d}",
                )
            assert result.code == 0, result


async def _consume(port: int, group: str) -> list[bytes] | None:
    """Every body a consumer group gets by pulling each queue from offset 0 to its end (the
    tag and number only; ``<undecodable>`` for a record that is no message); None when the
    broker does not answer (yet)."""
    address = f"127.0.0.1:{port}"
    bodies: list[bytes] = []
    async with open_client_pool() as pool:
        try:
            for queue_id in range(QUEUES):
                offset = 0
                for _ in range(1000):
                    with trio.fail_after(10):
                        result = await pull_message(
                            pool,
                            address,
                            group=group,
                            topic=TOPIC,
                            queue_id=queue_id,
                            offset=offset,
                        )
                    bodies += [m.body.rstrip(b".") for m in result.messages]
                    if result.code not in (
                        ResponseCode.SUCCESS,
                        ResponseCode.PULL_RETRY_IMMEDIATELY,
                    ):
                        break  # the end of the queue (or nothing in it)
                    offset = result.next_begin_offset
                    if offset >= result.max_offset:
                        break
        except RemotingError as exc:
            if "does not decode" not in str(exc):
                return None
            bodies.append(b"<undecodable>")
        except (OSError, trio.TooSlowError):
            return None
    return bodies


def _expected(tags: dict[str, int]) -> list[bytes]:
    return sorted(b"%s-%04d" % (tag.encode(), i) for tag, n in tags.items() for i in range(n))


def _delivered_once(port: int, group: str, tags: dict[str, int], processes: list[_Process]) -> None:
    """A new consumer group gets exactly the messages of ``tags``, each once (waiting, bounded,
    for the broker to index the newest)."""
    expected = _expected(tags)
    got: list[list[bytes] | None] = [None]

    def done() -> bool:
        got[0] = trio.run(_consume, port, group)
        return got[0] is not None and sorted(got[0]) == expected

    try:
        _until(done, f"group {group} gets every kept and new message once", processes, within=30)
    except AssertionError:
        if any(p.proc.poll() is not None for p in processes):
            raise
        bodies = got[0] or []
        extra = sorted(set(bodies) - set(expected))[:5]
        missing = sorted(set(expected) - set(bodies))[:5]
        raise AssertionError(
            f"{group}: {len(bodies)} delivered for {len(expected)} expected; extra {extra}, "
            f"missing {missing}, twice {len(bodies) - len(set(bodies))}"
        ) from None


async def _lookup(port: int, keys: list[str]) -> dict[str, list[bytes]] | None:
    """What QUERY_MESSAGE finds for each key through the message index (the bodies, tag and
    number only); None when the broker does not answer (yet)."""
    address = f"127.0.0.1:{port}"
    found: dict[str, list[bytes]] = {}
    async with open_client_pool() as pool:
        try:
            for key in keys:
                request = RemotingCommand.request(
                    RequestCode.QUERY_MESSAGE,
                    {
                        "topic": TOPIC,
                        "key": key,
                        "maxNum": 32,
                        "beginTimestamp": 0,
                        "endTimestamp": 2**62,
                    },
                )
                with trio.fail_after(10):
                    response = await pool.request(address, request)
                bodies = []
                pos = 0
                while pos < len(response.body):
                    decoded = decode_record(response.body, pos, check_crc=False)
                    if not isinstance(decoded, DecodedMessage):
                        bodies.append(b"<undecodable>")
                        break
                    bodies.append(decoded.message.body.rstrip(b"."))
                    pos += decoded.size
                # Keys that only collide with this one's hash are the client's to filter out.
                found[key] = [b for b in bodies if b in (key.encode(), b"<undecodable>")]
        except (OSError, RemotingError, trio.TooSlowError):
            return None
    return found


def _indexed_once(
    port: int, tags: dict[str, int], lost: dict[str, int], processes: list[_Process]
) -> None:
    """The message index finds every message of ``tags`` once by its key, and none of
    ``lost`` (waiting, bounded, for the broker to index the newest)."""
    _keys_found_once(port, _keys(tags), _keys(lost), processes)


def _keys(tags: dict[str, int]) -> list[str]:
    return [f"{tag}-{i:04d}" for tag, n in tags.items() for i in range(n)]


def _keys_found_once(
    port: int, present: list[str], absent: list[str], processes: list[_Process]
) -> None:
    """QUERY_MESSAGE finds the message of each ``present`` key once, and nothing for the
    ``absent`` ones (waiting, bounded, for the broker to index the newest)."""
    want = {key: [key.encode()] for key in present} | {key: [] for key in absent}
    keys = list(want)
    got: list[dict[str, list[bytes]] | None] = [None]

    def done() -> bool:
        got[0] = trio.run(_lookup, port, keys)
        return got[0] == want

    try:
        _until(done, "the index finds every kept and new message once", processes, within=30)
    except AssertionError:
        if any(p.proc.poll() is not None for p in processes):
            raise
        wrong = {k: v for k, v in (got[0] or {}).items() if v != want[k]}
        raise AssertionError(
            f"index lookups differ for {len(wrong)} keys: {list(wrong.items())[:5]}"
        ) from None


def _power_cut(store: Path, cut: int, end: int) -> None:
    """What a power cut leaves of a master killed with ``[cut, end)`` unflushed: zeros."""
    segment = store / "commitlog" / f"{0:020d}"
    with segment.open("r+b") as f:
        f.seek(cut)
        f.write(bytes(end - cut))


def _status(port: int) -> dict[str, str]:
    """The broker's runtime info, or {} while it does not answer."""

    async def ask() -> dict[str, str]:
        async with open_client_pool() as pool:
            try:
                with trio.fail_after(5):
                    return await runtime_info(pool, f"127.0.0.1:{port}")
            except (OSError, RemotingError, trio.TooSlowError):
                return {}

    return trio.run(ask)


def _offset(port: int, key: str) -> int:
    return int(_status(port).get(key, -1))


def _reaches(port: int, offset: int, what: str, processes: list[_Process]) -> None:
    """Wait (bounded) until the slave at ``port`` reports ``offset``."""
    _until(lambda: _offset(port, "stats.client.reported_offset") == offset, what, processes)


@pytest.mark.parametrize("mode", ["classic", "epoch"])
def test_after_a_power_cut_a_new_group_gets_every_kept_and_new_message_once(
    tmp_path: Path, mode: str
) -> None:
    m_dir, s_dir = tmp_path / "m", tmp_path / "s"
    conf = tmp_path / "broker.conf"
    # No flush by interval: the master's commit log tail stays unflushed (a power cut's prey),
    # while its consume queues are flushed every second as usual.
    conf.write_text(
        f"mappedFileSizeCommitLog={SEG}\nflushIntervalCommitLog=600000\nhaSyncFromOldest=true\n"
        "haSendHeartbeatInterval=200\nhaHousekeepingInterval=2000\nhaReconnectBackoffMax=200\n"
        + ("enableControllerMode=true\n" if mode == "epoch" else "")
    )
    ha, m_port, s_port = _free_port(), free_broker_port(), free_broker_port()

    def start(name: str, role: str, *extra: str) -> _Process:
        store, port = (m_dir, m_port) if role == "master" else (s_dir, s_port)
        return _Process(
            name, role, store, conf=conf, ha=ha, listen=port, logs=tmp_path, extra=extra
        )

    # 1. A master and its slave in step; the last 30 messages are never flushed on the master.
    master = start("master1", "master")
    slave = start("slave1", "slave")
    processes = [master, slave]
    try:
        trio.run(_produce, m_port, "kept", 40)
        cut = _offset(m_port, "commitLogMaxOffset")
        trio.run(_produce, m_port, "lost", 30)
        end = _offset(m_port, "commitLogMaxOffset")
        _reaches(s_port, end, "the slave holds the whole tail", processes)
        # Every message was indexed and the queues flushed (they flush every second): the
        # units of the messages about to be lost are on the master's disk.
        _delivered_once(m_port, "before", {"kept": 40, "lost": 30}, processes)
        trio.run(trio.sleep, 1.5)
        slave.stop()
    finally:
        master.stop(signal.SIGKILL)
        slave.stop()
    _power_cut(m_dir, cut, end)

    # 2. The master restarts and producers go on at once. A new group gets exactly the kept
    # and the new messages: no unit of a lost message, no new message left out. (It had
    # answered PUT_OK for the lost messages, which the slave holds: it starts as master only
    # when told to discard them, the operator's explicit choice this scenario is about.)
    master = start("master2", "master", "--accept-lost-acknowledged")
    processes = [master]
    try:
        trio.run(_produce, m_port, "new", 60)
        _delivered_once(m_port, "fresh", {"kept": 40, "new": 60}, processes)
        _indexed_once(m_port, {"kept": 40, "new": 60}, {"lost": 30}, processes)
        if mode == "classic":
            # The slave is refused (it holds bytes of the lost history) until it is cut
            # back to the master's history, offline.
            slave = start("slave2", "slave")
            _until(
                lambda: _status(s_port).get("stats.client.needs_reseed") == "true",
                "the slave to be refused",
                [master, slave],
            )
            slave.stop()
            done = subprocess.run(
                [
                    *(sys.executable, "-m", "trioha", "slave", "--store-dir", str(s_dir)),
                    *("-c", str(conf), "--truncate-to-master"),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stdout + done.stderr
        # 3. The slave comes back (epoch mode: it cuts itself back to the consistent point),
        # catches up, and serves the same messages, each once.
        slave = start("slave3", "slave")
        processes = [master, slave]
        trio.run(_produce, m_port, "more", 10)
        new_end = _offset(m_port, "commitLogMaxOffset")
        _reaches(s_port, new_end, "the slave catches up with the new history", processes)
        tags = {"kept": 40, "new": 60, "more": 10}
        _delivered_once(s_port, "from-slave", tags, processes)
        _delivered_once(m_port, "fresh-again", tags, processes)
        _indexed_once(s_port, tags, {"lost": 30}, processes)
    finally:
        master_out, slave_out = master.stop(), slave.stop()
    for out in (master_out, slave_out):
        assert "consume queue building stopped" not in out, out
        assert "Traceback" not in out, out
