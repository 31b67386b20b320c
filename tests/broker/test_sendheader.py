"""``SendMessageHeader.from_command``: SendMessageRequestHeader and V2, typed once."""

from __future__ import annotations

import pytest

from tests.broker.test_broker_port import FULL_V1, FULL_V2, MISSING_REQUIRED
from trioha.broker._sendheader import MAX_RECONSUME_TIMES, SendMessageHeader
from trioha.remoting import HeaderError, RemotingCommand, RequestCode

#: What FULL_V1 and FULL_V2 both say.
PLAIN = SendMessageHeader(
    producer_group="PG",
    topic="T",
    default_topic="TBW102",
    default_topic_queue_nums=4,
    queue_id=0,
    sys_flag=0,
    born_timestamp=1,
    flag=0,
)


def header(code: int, fields: dict[str, object]) -> SendMessageHeader:
    return SendMessageHeader.from_command(RemotingCommand.request(code, fields))


def test_the_long_names_and_the_letters_give_the_same_header() -> None:
    assert header(RequestCode.SEND_MESSAGE, FULL_V1) == PLAIN
    assert header(RequestCode.SEND_MESSAGE_V2, FULL_V2) == PLAIN
    # A batch may come with either header (the C++ client sends the long one).
    assert header(RequestCode.SEND_BATCH_MESSAGE, FULL_V2).batch
    assert header(RequestCode.SEND_BATCH_MESSAGE, FULL_V1).batch


def test_every_optional_field_by_either_name() -> None:
    long = {
        **FULL_V1,
        "properties": "KEYS\x01k",
        "reconsumeTimes": "3",
        "unitMode": "true",
        "maxReconsumeTimes": "5",
        "batch": "false",
        "topicSysFlag": "2",
    }
    letters = {**FULL_V2, "i": "KEYS\x01k", "j": "3", "k": "true", "l": "5", "m": "false"}
    expected = SendMessageHeader(
        "PG", "T", "TBW102", 4, 0, 0, 1, 0, "KEYS\x01k", 3, True, 5, False, 2
    )
    assert header(RequestCode.SEND_MESSAGE, long) == expected
    assert header(RequestCode.SEND_MESSAGE_V2, {**letters, "topicSysFlag": "2"}) == expected


def test_empty_numbers_take_rocketmqs_defaults() -> None:
    fields = {**FULL_V1, "defaultTopicQueueNums": "", "queueId": "", "bornTimestamp": ""}
    got = header(RequestCode.SEND_MESSAGE, fields)
    assert (got.default_topic_queue_nums, got.queue_id, got.born_timestamp) == (None, -1, 0)
    assert (got.reconsume_times, got.max_reconsume_times) == (0, MAX_RECONSUME_TIMES)
    assert (got.properties, got.unit_mode, got.batch, got.topic_sys_flag) == ("", False, False, 0)


@pytest.mark.parametrize(
    ("code", "flag", "batch"),
    [
        (RequestCode.SEND_MESSAGE, "true", True),
        (RequestCode.SEND_MESSAGE, " TRUE ", True),
        (RequestCode.SEND_MESSAGE, "1", True),
        (RequestCode.SEND_MESSAGE, "false", False),
        (RequestCode.SEND_MESSAGE, "yes", False),
        (RequestCode.SEND_BATCH_MESSAGE, "false", True),
    ],
)
def test_the_cpp_clients_batch_flag(code: int, flag: str, batch: bool) -> None:
    assert header(code, {**FULL_V1, "batch": flag}).batch is batch


@pytest.mark.parametrize(("code", "fields", "named"), MISSING_REQUIRED)
def test_the_first_missing_required_field_is_named(
    code: int, fields: dict[str, object], named: str
) -> None:
    with pytest.raises(HeaderError) as info:
        header(code, fields)
    assert str(info.value) == f"the custom field {named} is null"


def test_a_number_that_is_not_one_is_named_by_its_long_name() -> None:
    with pytest.raises(HeaderError, match=r"^the custom field <queueId> is not a number: 'x'$"):
        header(RequestCode.SEND_MESSAGE_V2, {**FULL_V2, "e": "x"})
    with pytest.raises(HeaderError, match=r"<maxReconsumeTimes> is not an integer: '1.5'"):
        header(RequestCode.SEND_MESSAGE, {**FULL_V1, "maxReconsumeTimes": "1.5"})
    # A whole number written as a float is the number, as int_field reads it.
    assert header(RequestCode.SEND_MESSAGE, {**FULL_V1, "queueId": "2.0"}).queue_id == 2
