"""Every refusal the store can give maps to the status RocketMQ's broker answers with.

``SendMessageProcessor.handlePutMessageResult`` turns ``PutMessageStatus`` into a response code;
trioha decides the status from the refusal's class, in one table (``trioha._status``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trioha import BrokerConfig
from trioha._config import BrokerRole
from trioha._errors import (
    BodyTooLargeError,
    CorruptLogError,
    MessageIllegalError,
    MessageTooLargeError,
    PropertiesTooLargeError,
    StorageError,
    TopicTooLongError,
)
from trioha._status import PutStatus, refusal_status
from trioha.broker import open_broker
from trioha.store import NewMessage


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (PropertiesTooLargeError("p"), PutStatus.PROPERTIES_SIZE_EXCEEDED),
        (BodyTooLargeError("b"), PutStatus.MESSAGE_ILLEGAL),
        (TopicTooLongError("t"), PutStatus.MESSAGE_ILLEGAL),
        (MessageTooLargeError("segment"), PutStatus.MESSAGE_ILLEGAL),
        (MessageIllegalError("range"), PutStatus.MESSAGE_ILLEGAL),
        (ValueError("utf-8"), PutStatus.MESSAGE_ILLEGAL),
        (CorruptLogError("c"), PutStatus.CREATE_MAPPED_FILE_FAILED),
        (StorageError("disk"), PutStatus.CREATE_MAPPED_FILE_FAILED),
        (RuntimeError("?"), PutStatus.UNKNOWN_ERROR),
    ],
)
def test_the_most_specific_refusal_decides(error: Exception, status: PutStatus) -> None:
    assert refusal_status(error) is status


async def test_a_broker_answers_each_refusal_with_its_status(tmp_path: Path) -> None:
    config = BrokerConfig(
        broker_role=BrokerRole.ASYNC_MASTER,
        store_path_root_dir=str(tmp_path),
        mapped_file_size_commit_log=64 * 1024,
        ha_listen_port=0,
        listen_port=0,
        max_message_size=1024,
    )
    async with open_broker(config) as broker:
        big_props = {"k": "v" * 40_000}
        assert (
            await broker.put(NewMessage(topic="T", body=b"x", properties=big_props))
        ).status is (PutStatus.PROPERTIES_SIZE_EXCEEDED)
        assert (
            await broker.put(NewMessage(topic="T", body=b"x" * 2048))
        ).status is PutStatus.MESSAGE_ILLEGAL
        assert (
            await broker.put(NewMessage(topic="T" * 40_000, body=b"x"))
        ).status is PutStatus.MESSAGE_ILLEGAL
        assert (await broker.put(NewMessage(topic="T", body=b"x", flag=2**40))).status is (
            PutStatus.MESSAGE_ILLEGAL
        )
        assert (
            await broker.put(NewMessage(topic="T", body=b"x", born_host=("nohost", 1)))
        ).status is (PutStatus.MESSAGE_ILLEGAL)
        assert (await broker.put(NewMessage(topic="T", body=b"x"))).status is PutStatus.PUT_OK
