"""The JSON mapping, byte for byte, without an etcd: requests as etcd 3.4's gateway takes them,
replies as it sends them (the samples below were answered by etcd 3.4.23), refusals by kind."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from trioha._errors import ConfigError
from trioha.etcd import (
    GatewayFormatError,
    MemberStatus,
    backoff_delay,
    decode,
    decode_status,
    decode_watch,
    encode,
    parse_endpoints,
    watch_create,
)
from trioha.etcd._gateway import Refusal, classify, gateway_error, parse_lines, writes
from trioha.failover import (
    Cmp,
    Compare,
    DeleteRange,
    DeleteRangeResponse,
    ErrorCode,
    EtcdError,
    EventType,
    KeyValue,
    LeaseGrant,
    LeaseGrantResponse,
    LeaseKeepAlive,
    LeaseKeepAliveResponse,
    LeaseRevoke,
    LeaseRevokeResponse,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    Target,
    Txn,
    TxnResponse,
    WatchEvent,
)

HEADER = {
    "cluster_id": "324952591200643719",
    "member_id": "3319814642761637952",
    "revision": "3",
    "raft_term": "2",
}

# --- requests ---------------------------------------------------------------------------------


def test_a_campaign_transaction_as_the_gateway_takes_it() -> None:
    txn = Txn(
        (
            Compare.absent(b"/m"),
            Compare.modified_at(b"/e", 7),
            Compare(b"/v", Target.VALUE, Cmp.NOT_EQUAL, b"x"),
            Compare(b"/l", Target.LEASE, Cmp.GREATER, 9),
            Compare(b"/n", Target.VERSION, Cmp.LESS, 2),
        ),
        (Put(b"/m", b"me", lease=2324035663176245771), Put(b"/e", b"8")),
        (Range.prefix(b"/g/"), DeleteRange(b"/x")),
    )
    assert encode(txn) == (
        "/v3/kv/txn",
        {
            "compare": [
                {"key": "L20=", "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
                {"key": "L2U=", "target": "MOD", "result": "EQUAL", "mod_revision": "7"},
                {"key": "L3Y=", "target": "VALUE", "result": "NOT_EQUAL", "value": "eA=="},
                {"key": "L2w=", "target": "LEASE", "result": "GREATER", "lease": "9"},
                {"key": "L24=", "target": "VERSION", "result": "LESS", "version": "2"},
            ],
            "success": [
                {"request_put": {"key": "L20=", "value": "bWU=", "lease": "2324035663176245771"}},
                {"request_put": {"key": "L2U=", "value": "OA=="}},
            ],
            "failure": [
                {"request_range": {"key": "L2cv", "range_end": "L2cw"}},
                {"request_delete_range": {"key": "L3g="}},
            ],
        },
    )
    assert writes(txn)
    assert not writes(Txn((), (Range(b"/a"),), (Range(b"/b"),)))
    assert writes(Txn((), (), (DeleteRange(b"/b"),)))


@pytest.mark.parametrize(
    ("request_", "path", "body", "is_write"),
    [
        (Range(b"/a"), "/v3/kv/range", {"key": "L2E="}, False),
        (Range(b"\0", b"\0"), "/v3/kv/range", {"key": "AA==", "range_end": "AA=="}, False),
        (Put(b"k", b""), "/v3/kv/put", {"key": "aw==", "value": ""}, True),
        (DeleteRange(b"k", b"l"), "/v3/kv/deleterange", {"key": "aw==", "range_end": "bA=="}, True),
        (LeaseGrant(3), "/v3/lease/grant", {"TTL": "3"}, False),
        (LeaseKeepAlive(2**62), "/v3/lease/keepalive", {"ID": str(2**62)}, False),
        (LeaseRevoke(5), "/v3/lease/revoke", {"ID": "5"}, False),
    ],
)
def test_each_request_has_its_path_and_body(
    request_: Any, path: str, body: dict[str, Any], is_write: bool
) -> None:
    assert encode(request_) == (path, body)
    assert writes(request_) is is_write


def test_a_watch_starts_at_a_revision_and_asks_for_progress() -> None:
    assert watch_create(Range.prefix(b"/g/"), 12) == {
        "create_request": {
            "key": "L2cv",
            "range_end": "L2cw",
            "start_revision": "12",
            "progress_notify": True,
        }
    }


# --- replies ----------------------------------------------------------------------------------


def test_a_transaction_reply_with_every_kind_of_operation() -> None:
    txn = Txn((), (Put(b"new", b"a"), DeleteRange(b"foo"), Range(b"new")))
    reply = {
        "header": HEADER,
        "succeeded": True,
        "responses": [
            {"response_put": {"header": {"revision": "3"}}},
            {"response_delete_range": {"header": {"revision": "3"}, "deleted": "1"}},
            {
                "response_range": {
                    "header": {"revision": "3"},
                    "kvs": [
                        {
                            "key": "bmV3",
                            "create_revision": "3",
                            "mod_revision": "3",
                            "version": "1",
                            "value": "YQ==",
                        }
                    ],
                    "count": "1",
                }
            },
        ],
    }
    assert decode(txn, reply) == TxnResponse(
        3,
        True,
        (
            PutResponse(3),
            DeleteRangeResponse(3, 1),
            RangeResponse(3, (KeyValue(b"new", b"a", 3, 3, 1),)),
        ),
    )


def test_a_failed_compare_runs_the_failure_branch_and_missing_fields_are_zero() -> None:
    txn = Txn((Compare.absent(b"foo"),), (Put(b"foo", b"a"),), (Range(b"foo"), Range(b"none")))
    reply = {
        "header": HEADER,  # "succeeded" left out: false
        "responses": [
            {
                "response_range": {
                    "header": {"revision": "2"},
                    "kvs": [{"key": "Zm9v", "create_revision": "2", "mod_revision": "2"}],
                }
            },
            {"response_range": {"header": {"revision": "2"}}},
        ],
    }
    assert decode(txn, reply) == TxnResponse(
        3,
        False,
        (RangeResponse(2, (KeyValue(b"foo", b"", 2, 2, 0, 0),)), RangeResponse(2)),
    )


def test_lease_replies_and_the_stream_wrapper() -> None:
    granted = {"header": HEADER, "ID": "2324035663176245771", "TTL": "5"}
    assert decode(LeaseGrant(5), granted) == LeaseGrantResponse(3, 2324035663176245771, 5)
    alive = {"result": {"header": HEADER, "ID": "7", "TTL": "5"}}
    assert decode(LeaseKeepAlive(7), alive) == LeaseKeepAliveResponse(3, 7, 5)
    gone = {"result": {"header": HEADER, "ID": "12345"}}  # TTL left out: the lease is gone
    response = decode(LeaseKeepAlive(12345), gone)
    assert response == LeaseKeepAliveResponse(3, 12345, 0)
    assert isinstance(response, LeaseKeepAliveResponse)
    assert not response.alive
    assert decode(LeaseRevoke(7), {"header": HEADER}) == LeaseRevokeResponse(3)
    refused = {"header": HEADER, "error": "lease already exists"}
    assert decode(LeaseGrant(5), refused) == EtcdError(ErrorCode.OTHER, "lease already exists")


def test_watch_messages_created_events_progress_and_compaction() -> None:
    created = decode_watch({"result": {"header": HEADER, "created": True}})
    assert created.created
    assert not created.progress
    events = decode_watch(
        {
            "result": {
                "header": HEADER,
                "events": [
                    {"kv": {"key": "YXg=", "create_revision": "4", "mod_revision": "4"}},
                    {"type": "DELETE", "kv": {"key": "YXg=", "mod_revision": "5"}},
                ],
            }
        }
    )
    assert events.events == (
        WatchEvent(EventType.PUT, KeyValue(b"ax", b"", 4, 4)),
        WatchEvent(EventType.DELETE, KeyValue(b"ax", mod_revision=5)),
    )
    assert decode_watch({"result": {"header": HEADER}}).progress
    compacted = decode_watch(
        {
            "result": {
                "header": {"raft_term": "2"},
                "canceled": True,
                "compact_revision": "4",
            }
        }
    )
    assert (compacted.canceled, compacted.compact_revision, compacted.revision) == (True, 4, 0)


def test_a_member_status() -> None:
    body = {
        "header": HEADER,
        "version": "3.4.23",
        "dbSize": "20480",
        "leader": "3319814642761637952",
        "raftIndex": "4",
        "raftTerm": "2",
    }
    status = decode_status(body)
    assert status == MemberStatus(3319814642761637952, 3319814642761637952, 2, 3, "3.4.23")
    assert status.is_leader
    leaderless = decode_status({"header": HEADER, "version": "3.4.23"})
    assert leaderless.leader == 0
    assert not leaderless.is_leader


@pytest.mark.parametrize(
    "reply",
    [
        {"kvs": []},  # no header
        {"header": HEADER, "kvs": "x"},
        {"header": HEADER, "kvs": [{"key": "not base64!"}]},
        {"header": HEADER, "kvs": [{"key": "YQ==", "version": "one"}]},
        {"header": HEADER, "kvs": [{"key": "YQ==", "version": True}]},
        {"header": {"revision": [1]}},
        {"header": HEADER, "kvs": [7]},
    ],
)
def test_a_reply_etcd_would_not_send_is_a_format_error(reply: dict[str, Any]) -> None:
    with pytest.raises(GatewayFormatError):
        decode(Range(b"a"), reply)


def test_a_transaction_reply_must_match_its_branch() -> None:
    txn = Txn((), (Put(b"a", b"1"),), ())
    with pytest.raises(GatewayFormatError, match="1 operations"):
        decode(txn, {"header": HEADER, "succeeded": True, "responses": []})
    with pytest.raises(GatewayFormatError, match="succeeded"):
        decode(txn, {"header": HEADER, "succeeded": "yes", "responses": []})


def test_lines_of_a_stream_and_text_that_is_not_json() -> None:
    text = '{"result":{"a":1}}\n\n{"result":{"b":2}}\n'
    assert parse_lines(text) == [{"result": {"a": 1}}, {"result": {"b": 2}}]
    for bad in ("", "Not Found\n", "[1, 2]", "<html>"):
        with pytest.raises(GatewayFormatError):
            parse_lines(bad)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ({"error": "etcdserver: requested lease not found", "code": 5}, Refusal.ANSWER),
        (
            {"error": "etcdserver: mvcc: required revision has been compacted", "code": 11},
            Refusal.ANSWER,
        ),
        ({"error": "etcdserver: no leader", "code": 14}, Refusal.NO_LEADER),
        ({"error": "etcdserver: too many requests", "code": 8}, Refusal.BUSY),
        ({"error": "etcdserver: request timed out", "code": 14}, Refusal.MAYBE),
        ({"error": "etcdserver: leader changed", "code": 14}, Refusal.MAYBE),
        ({"error": "etcdserver: user name is empty", "code": 3}, Refusal.AUTH_MISSING),
        (
            {"error": "etcdserver: authentication failed, invalid user ID or password", "code": 3},
            Refusal.AUTH_FAILED,
        ),
        ({"error": "etcdserver: permission denied", "code": 7}, Refusal.PERMISSION),
        ({"error": "etcdserver: invalid auth token", "code": 16}, Refusal.TOKEN),
        ({"error": "etcdserver: authentication is not enabled", "code": 9}, Refusal.AUTH_OFF),
        ({"error": "something new", "code": 14}, Refusal.MAYBE),
        ({"error": "something new", "code": 4}, Refusal.MAYBE),
        ({"error": "something new", "code": 8}, Refusal.BUSY),
        ({"error": "etcdserver: key is not provided", "code": 3}, Refusal.ANSWER),
        # A stream's refusal: the error is an object.
        ({"error": {"grpc_code": 14, "message": "etcdserver: no leader"}}, Refusal.NO_LEADER),
    ],
)
def test_refusals_are_classified_by_message_then_code(
    body: dict[str, Any], refusal: Refusal
) -> None:
    found = gateway_error(body)
    assert found is not None
    assert classify(*found) is refusal


def test_a_reply_without_an_error_is_not_a_refusal() -> None:
    assert gateway_error({"header": HEADER}) is None
    assert gateway_error({"header": HEADER, "error": ""}) is None


# --- endpoints and backoff --------------------------------------------------------------------


def test_endpoints_are_parsed_as_etcdctl_takes_them() -> None:
    assert parse_endpoints("127.0.0.1:2379, http://10.0.0.2:2381,etcd3") == (
        "http://127.0.0.1:2379",
        "http://10.0.0.2:2381",
        "http://etcd3:2379",
    )
    assert parse_endpoints(["http://[::1]:2379/", "http://[::1]:2379"]) == ("http://[::1]:2379",)


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("", "no etcd endpoint"),
        ("https://127.0.0.1:2379", "plain http"),
        ("http://127.0.0.1:2379/v3", "no path"),
        ("http://127.0.0.1:99999", "not a URL"),
    ],
)
def test_a_bad_endpoint_is_a_config_error(text: str, fault: str) -> None:
    with pytest.raises(ConfigError, match=fault):
        parse_endpoints(text)


def test_backoff_is_full_jitter_under_a_growing_cap() -> None:
    rng = random.Random(7)
    for round_ in range(40):
        ceiling = min(1.0, 0.05 * 2**round_)
        delays = [backoff_delay(round_, 0.05, 1.0, rng) for _ in range(50)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2  # spread over the range, not pinned at one end


def test_decoded_samples_survive_a_json_round_trip() -> None:
    # What the client reads is text: the decoder must take ints and strings alike.
    sample = {"header": {"revision": 9}, "kvs": [{"key": "YQ==", "lease": 3}]}
    reply = json.loads(json.dumps(sample))
    assert decode(Range(b"a"), reply) == RangeResponse(9, (KeyValue(b"a", lease=3),))
