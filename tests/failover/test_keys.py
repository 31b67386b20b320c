"""The group's keys in etcd and their values: layout, round trips, strict decoding."""

from __future__ import annotations

import pytest

from trioha._errors import CoordinatorDataError
from trioha.failover import (
    GroupKeys,
    MasterRecord,
    Registration,
    SyncStateSet,
    decode_epoch,
    encode_epoch,
    prefix_end,
)

KEYS = GroupKeys.of("DefaultCluster", "broker-a")


def test_the_keys_of_a_group_live_under_one_prefix() -> None:
    assert KEYS.prefix == b"/trioha/DefaultCluster/broker-a/"
    assert KEYS.master == b"/trioha/DefaultCluster/broker-a/master"
    assert KEYS.epoch == b"/trioha/DefaultCluster/broker-a/epoch"
    assert KEYS.sync_state_set == b"/trioha/DefaultCluster/broker-a/syncStateSet"
    assert KEYS.broker(12) == b"/trioha/DefaultCluster/broker-a/brokers/12"
    assert GroupKeys.of("c", "b", root="/ops/rmq/").prefix == b"/ops/rmq/c/b/"


@pytest.mark.parametrize(
    ("cluster", "name", "root"),
    [
        ("a/b", "x", "/trioha"),
        ("c", "", "/trioha"),
        ("c", "b c", "/trioha"),
        ("c", "b", "trioha"),
        ("c", "b", "/a//b"),
    ],
)
def test_names_that_cannot_be_part_of_a_key_are_refused(cluster: str, name: str, root: str) -> None:
    with pytest.raises(ValueError, match=r"cannot be part of an etcd key|absolute path"):
        GroupKeys.of(cluster, name, root=root)


def test_registration_keys_name_their_broker() -> None:
    assert KEYS.broker_id_of(KEYS.broker(7)) == 7
    for key in (
        KEYS.master,
        KEYS.brokers + b"x",
        KEYS.brokers + b"07",
        KEYS.brokers,
        b"/other/brokers/1",
    ):
        assert KEYS.broker_id_of(key) is None


@pytest.mark.parametrize(
    "value",
    [
        MasterRecord(2, 7, "10.0.0.2:10911", "10.0.0.2:10912"),
        SyncStateSet(frozenset({1, 3}), 12, 7),
        Registration(3, 7, 1 << 40, "10.0.0.3:10911", "10.0.0.3:10912"),
    ],
)
def test_values_round_trip(value: MasterRecord | SyncStateSet | Registration) -> None:
    raw = value.encode()
    assert type(value).decode(b"k", raw) == value
    assert b" " not in raw  # compact JSON


def test_values_use_rocketmq_spellings() -> None:
    assert MasterRecord(2, 7, "a", "b").encode() == (
        b'{"brokerAddr":"a","brokerId":2,"epoch":7,"haAddr":"b"}'
    )
    assert SyncStateSet(frozenset({3, 1}), 12, 7).encode() == (
        b'{"masterEpoch":7,"members":[1,3],"version":12}'
    )


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        (b"not json", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"brokerId": 2, "epoch": 7}', "missing brokerAddr, haAddr"),
        (b'{"brokerId": -2, "epoch": 7, "brokerAddr": "", "haAddr": ""}', "non-negative integer"),
        (b'{"brokerId": true, "epoch": 7, "brokerAddr": "", "haAddr": ""}', "non-negative integer"),
        (b'{"brokerId": 2, "epoch": 7, "brokerAddr": 5, "haAddr": ""}', "must be a string"),
    ],
)
def test_a_master_record_that_trioha_did_not_write_is_refused_by_name(
    raw: bytes, fault: str
) -> None:
    with pytest.raises(CoordinatorDataError, match=fault) as info:
        MasterRecord.decode(KEYS.master, raw)
    assert "/trioha/DefaultCluster/broker-a/master" in str(info.value)


@pytest.mark.parametrize(
    ("raw", "fault"),
    [
        (b'{"members": [], "version": 1, "masterEpoch": 1}', "names no broker"),
        (b'{"members": [0], "version": 1, "masterEpoch": 1}', "positive broker ids"),
        (b'{"members": "1", "version": 1, "masterEpoch": 1}', "positive broker ids"),
        (b'{"members": [1], "masterEpoch": 1}', "missing version"),
    ],
)
def test_an_unreadable_sync_state_set_is_refused_by_name(raw: bytes, fault: str) -> None:
    with pytest.raises(CoordinatorDataError, match=fault):
        SyncStateSet.decode(KEYS.sync_state_set, raw)


def test_the_epoch_counter_is_a_bare_decimal() -> None:
    assert encode_epoch(17) == b"17"
    assert decode_epoch(KEYS.epoch, b"17") == 17
    for raw in (b"", b"-1", b"017", b"1.0", b"x"):
        with pytest.raises(CoordinatorDataError, match="decimal number"):
            decode_epoch(KEYS.epoch, raw)


def test_the_range_end_of_a_prefix() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"
