"""``Broker.append_each``: a burst of independent sends, appended together, waited for once."""

from __future__ import annotations

import itertools
from pathlib import Path

import trio

from trioha._config import BrokerConfig, BrokerRole
from trioha._status import PutStatus
from trioha.broker import open_broker
from trioha.store import NewMessage


def _config(root: Path, role: BrokerRole = BrokerRole.ASYNC_MASTER) -> BrokerConfig:
    return BrokerConfig(
        broker_role=role,
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=1 << 20,
        ha_listen_port=0,
        listen_port=0,
        max_message_size=4096,
    )


async def test_sends_of_a_burst_are_consecutive_records_with_their_own_queue_offsets(
    tmp_path: Path,
) -> None:
    with trio.fail_after(30):
        async with open_broker(_config(tmp_path)) as broker:
            messages = [NewMessage("T", b"m%d" % i, queue_id=i % 2) for i in range(5)]
            results = broker.append_each([[m] for m in messages])
            assert [r.status for r in results] == [PutStatus.PUT_OK] * 5
            assert [r.queue_offset for r in results] == [0, 0, 1, 1, 2]
            for before, after in itertools.pairwise(results):
                assert before.end_offset == after.offset
            status = await broker.wait_stored(results[0].offset, results[-1].end_offset)
            assert status is PutStatus.PUT_OK
            assert broker.statistics().puts == 5


async def test_a_refused_send_is_refused_alone(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_broker(_config(tmp_path)) as broker:
            messages = [
                NewMessage("T", b"ok-1"),
                NewMessage("T", b"x" * 8192),  # above max_message_size
                NewMessage("T", b"ok-2"),
            ]
            results = broker.append_each([[m] for m in messages])
            assert [r.status for r in results] == [
                PutStatus.PUT_OK,
                PutStatus.MESSAGE_ILLEGAL,
                PutStatus.PUT_OK,
            ]
            assert results[1].offset == -1
            assert results[0].end_offset == results[2].offset
            assert broker.statistics().puts == 2


async def test_a_slave_refuses_every_send_of_a_burst(tmp_path: Path) -> None:
    with trio.fail_after(30):
        config = _config(tmp_path)
        async with open_broker(config) as broker:
            broker.role = BrokerRole.SLAVE  # as Broker.put_batch reads it: on every call
            results = broker.append_each([[NewMessage("T", b"a")]] * 2)
            assert [r.status for r in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 2
