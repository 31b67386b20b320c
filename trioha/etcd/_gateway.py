"""etcd v3's JSON gateway, sans IO: the failover core's request values to bodies, replies back.

etcd (3.4 and later) serves its gRPC API as JSON over HTTP/1.1 on its client port: ``POST
/v3/kv/range`` with a JSON ``RangeRequest`` answers a JSON ``RangeResponse``. The mapping is
protobuf's JSON mapping as etcd's gateway prints it:

* ``bytes`` fields (keys, values, a VALUE compare's operand) are base64;
* ``int64`` fields (revisions, versions, lease ids, TTLs) are decimal *strings*;
* a field at its default (0, false, empty, the first enum value such as ``PUT``) is left out,
  so every reader here takes a missing field as 0/false/empty;
* the streaming calls (``/v3/lease/keepalive``, ``/v3/watch``) answer newline-delimited JSON
  objects, each ``{"result": {...}}`` or ``{"error": {...}}``; one keepalive POST gets one
  answer and the response ends, a watch POST stays open and carries one object per batch;
* a refusal is ``{"error": ..., "message": ..., "code": <gRPC code>}`` with an HTTP status
  derived from the code (``code 5`` NotFound is HTTP 404, ``16`` Unauthenticated is 401).

Nothing here does IO, so every byte of the mapping is tested without an etcd
(``tests/etcd/test_gateway.py``); :mod:`trioha.etcd._client` sends what :func:`encode` builds
and hands what comes back to :func:`decode`. Malformed replies raise :class:`GatewayFormatError`,
which the client turns into a one-line error naming the endpoint.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Mapping
from typing import Any, TypeAlias, assert_never

import attrs

from trioha.failover import (
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
    Op,
    OpResponse,
    Put,
    PutResponse,
    Range,
    RangeResponse,
    Request,
    Target,
    Txn,
    TxnResponse,
    WatchEvent,
)

__all__ = [
    "AUTHENTICATE_PATH",
    "STATUS_PATH",
    "WATCH_PATH",
    "ClientRequest",
    "ClientResponse",
    "GatewayFormatError",
    "MemberStatus",
    "Refusal",
    "WatchMessage",
    "classify",
    "decode",
    "decode_status",
    "decode_watch",
    "encode",
    "gateway_error",
    "parse_lines",
    "refusal_value",
    "watch_create",
    "writes",
]

#: What the client sends: the core's requests, plus a bare put or delete (``/v3/kv/put``,
#: ``/v3/kv/deleterange``) for tools that change one key outside a transaction.
ClientRequest: TypeAlias = Request | Put | DeleteRange
ClientResponse: TypeAlias = (
    TxnResponse
    | RangeResponse
    | PutResponse
    | DeleteRangeResponse
    | LeaseGrantResponse
    | LeaseKeepAliveResponse
    | LeaseRevokeResponse
    | EtcdError
)

STATUS_PATH = "/v3/maintenance/status"
WATCH_PATH = "/v3/watch"
AUTHENTICATE_PATH = "/v3/auth/authenticate"


class GatewayFormatError(ValueError):
    """A reply is not what etcd's gateway sends (not JSON, a field of the wrong kind)."""


# --- requests ---------------------------------------------------------------------------------


def encode(request: ClientRequest) -> tuple[str, dict[str, Any]]:
    """The gateway path and JSON body that carry *request*."""
    match request:
        case Txn():
            return "/v3/kv/txn", {
                "compare": [_compare(c) for c in request.compare],
                "success": [_op(op) for op in request.success],
                "failure": [_op(op) for op in request.failure],
            }
        case Range():
            return "/v3/kv/range", _range(request)
        case Put():
            return "/v3/kv/put", _put(request)
        case DeleteRange():
            return "/v3/kv/deleterange", _range(request)
        case LeaseGrant(ttl=ttl):
            return "/v3/lease/grant", {"TTL": str(ttl)}
        case LeaseKeepAlive(lease=lease):
            return "/v3/lease/keepalive", {"ID": str(lease)}
        case LeaseRevoke(lease=lease):
            return "/v3/lease/revoke", {"ID": str(lease)}
        case _:
            assert_never(request)


def writes(request: ClientRequest) -> bool:
    """Whether *request* may change the keys: such a request, once sent, is never sent again
    without knowing whether the first copy landed. Leases are not keys: granting twice
    leaves an unused lease that expires by itself, and keepalives and revokes repeat safely."""
    match request:
        case Txn():
            return any(
                isinstance(op, Put | DeleteRange) for op in request.success + request.failure
            )
        case Put() | DeleteRange():
            return True
        case Range() | LeaseGrant() | LeaseKeepAlive() | LeaseRevoke():
            return False
        case _:
            assert_never(request)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


#: ``Compare.target_union``: the field that holds the operand, per target.
_OPERAND_FIELD = {
    Target.VERSION: "version",
    Target.CREATE: "create_revision",
    Target.MOD: "mod_revision",
    Target.VALUE: "value",
    Target.LEASE: "lease",
}


def _compare(compare: Compare) -> dict[str, Any]:
    operand = compare.operand
    value = _b64(operand) if isinstance(operand, bytes) else str(operand)
    return {
        "key": _b64(compare.key),
        "target": compare.target.value,
        "result": compare.result.value,
        _OPERAND_FIELD[compare.target]: value,
    }


def _range(request: Range | DeleteRange) -> dict[str, Any]:
    body = {"key": _b64(request.key)}
    if request.range_end:
        body["range_end"] = _b64(request.range_end)
    return body


def _put(put: Put) -> dict[str, Any]:
    body = {"key": _b64(put.key), "value": _b64(put.value)}
    if put.lease:
        body["lease"] = str(put.lease)
    return body


def _op(op: Op) -> dict[str, Any]:
    match op:
        case Put():
            return {"request_put": _put(op)}
        case DeleteRange():
            return {"request_delete_range": _range(op)}
        case Range():
            return {"request_range": _range(op)}
        case _:
            assert_never(op)


def watch_create(watched: Range, start_revision: int) -> dict[str, Any]:
    """The first (and only) message of a watch stream: every event on *watched* from
    *start_revision* on. ``progress_notify`` asks etcd for an empty batch now and then on a
    quiet watch, so a resumed watch can start past revisions that changed nothing watched."""
    body = _range(watched)
    body["start_revision"] = str(start_revision)
    body["progress_notify"] = True
    return {"create_request": body}


# --- replies ----------------------------------------------------------------------------------


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a reply: one for a unary call, one per line for a stream."""
    out = []
    for line in text.splitlines():
        if line.strip():
            out.append(_object(line))
    if not out:
        raise GatewayFormatError("an empty reply")
    return out


def _object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise GatewayFormatError(f"not JSON ({_clip(text)!r})") from e
    if not isinstance(value, dict):
        raise GatewayFormatError(f"not a JSON object ({_clip(text)!r})")
    return value


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def decode(request: ClientRequest, body: Mapping[str, Any]) -> ClientResponse:
    """The reply to *request*, from the JSON object etcd answered it with (HTTP 200).

    A stream's ``{"result": ...}`` wrapper is taken off here.
    """
    if "result" in body:
        body = _mapping(body, "result")
    if "header" not in body:
        raise GatewayFormatError(f"no header in {_clip(json.dumps(body))!r}")
    revision = _revision(body)
    match request:
        case Txn():
            ops = request.success if _bool(body, "succeeded") else request.failure
            replies = body.get("responses", [])
            if not isinstance(replies, list) or len(replies) != len(ops):
                raise GatewayFormatError(f"{len(ops)} operations, replies {_clip(str(replies))}")
            return TxnResponse(
                revision,
                _bool(body, "succeeded"),
                tuple(_op_response(op, reply) for op, reply in zip(ops, replies, strict=True)),
            )
        case Range():
            return _range_response(body)
        case Put():
            return PutResponse(revision)
        case DeleteRange():
            return DeleteRangeResponse(revision, _int(body, "deleted"))
        case LeaseGrant():
            error = body.get("error")
            if error:
                return EtcdError(ErrorCode.OTHER, str(error))
            return LeaseGrantResponse(revision, _int(body, "ID"), _int(body, "TTL"))
        case LeaseKeepAlive():
            return LeaseKeepAliveResponse(revision, _int(body, "ID"), _int(body, "TTL"))
        case LeaseRevoke():
            return LeaseRevokeResponse(revision)
        case _:
            assert_never(request)


def _op_response(op: Op, reply: Any) -> OpResponse:
    if not isinstance(reply, dict):
        raise GatewayFormatError(f"an operation's reply is not an object: {_clip(str(reply))}")
    match op:
        case Range():
            return _range_response(_mapping(reply, "response_range"))
        case Put():
            return PutResponse(_revision(_mapping(reply, "response_put")))
        case DeleteRange():
            inner = _mapping(reply, "response_delete_range")
            return DeleteRangeResponse(_revision(inner), _int(inner, "deleted"))
        case _:
            assert_never(op)


def _range_response(body: Mapping[str, Any]) -> RangeResponse:
    kvs = body.get("kvs", [])
    if not isinstance(kvs, list):
        raise GatewayFormatError(f"kvs is not a list: {_clip(str(kvs))}")
    return RangeResponse(_revision(body), tuple(_key_value(kv) for kv in kvs))


def _key_value(kv: Any) -> KeyValue:
    if not isinstance(kv, dict):
        raise GatewayFormatError(f"a key-value is not an object: {_clip(str(kv))}")
    return KeyValue(
        _bytes(kv, "key"),
        _bytes(kv, "value"),
        _int(kv, "create_revision"),
        _int(kv, "mod_revision"),
        _int(kv, "version"),
        _int(kv, "lease"),
    )


def _mapping(body: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = body.get(name, {})
    if not isinstance(value, dict):
        raise GatewayFormatError(f"{name} is not an object: {_clip(str(value))}")
    return value


def _revision(body: Mapping[str, Any]) -> int:
    return _int(_mapping(body, "header"), "revision")


def _int(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise GatewayFormatError(f"{name} is not an integer: {value!r}")
    try:
        return int(value)
    except ValueError as e:
        raise GatewayFormatError(f"{name} is not an integer: {value!r}") from e


def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise GatewayFormatError(f"{name} is not a boolean: {value!r}")
    return value


def _bytes(body: Mapping[str, Any], name: str) -> bytes:
    value = body.get(name, "")
    if not isinstance(value, str):
        raise GatewayFormatError(f"{name} is not base64 text: {value!r}")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as e:
        raise GatewayFormatError(f"{name} is not base64: {_clip(value)!r}") from e


def _str(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name, "")
    return value if isinstance(value, str) else str(value)


# --- watches ----------------------------------------------------------------------------------


@attrs.frozen
class WatchMessage:
    """One object of a watch stream (``WatchResponse``).

    *revision* is the store's revision when etcd sent it; a message with no events that is
    neither the creation nor the cancellation is a progress notice: every event up to
    *revision* has been delivered.
    """

    revision: int
    events: tuple[WatchEvent, ...] = ()
    created: bool = False
    canceled: bool = False
    #: Set when the watch was cancelled because its start revision was compacted away.
    compact_revision: int = 0
    cancel_reason: str = ""

    @property
    def progress(self) -> bool:
        return not (self.events or self.created or self.canceled)


def decode_watch(body: Mapping[str, Any]) -> WatchMessage:
    """One ``{"result": WatchResponse}`` object of the stream."""
    result = _mapping(body, "result")
    if "header" not in result:
        raise GatewayFormatError(f"a watch message without a header: {_clip(str(body))}")
    events = result.get("events", [])
    if not isinstance(events, list):
        raise GatewayFormatError(f"events is not a list: {_clip(str(events))}")
    return WatchMessage(
        _revision(result),
        tuple(_event(e) for e in events),
        _bool(result, "created"),
        _bool(result, "canceled"),
        _int(result, "compact_revision"),
        _str(result, "cancel_reason"),
    )


def _event(event: Any) -> WatchEvent:
    if not isinstance(event, dict):
        raise GatewayFormatError(f"an event is not an object: {_clip(str(event))}")
    kind = _str(event, "type") or "PUT"
    try:
        event_type = EventType(kind)
    except ValueError as e:
        raise GatewayFormatError(f"unknown event type {kind!r}") from e
    return WatchEvent(event_type, _key_value(_mapping(event, "kv")))


# --- status -----------------------------------------------------------------------------------


@attrs.frozen
class MemberStatus:
    """``/v3/maintenance/status``: what one member says of itself, answered locally (no
    consensus), so it answers even when the cluster has no quorum. *leader* is 0 while the
    member knows of no leader."""

    member_id: int
    leader: int
    raft_term: int
    revision: int
    version: str

    @property
    def is_leader(self) -> bool:
        return self.leader != 0 and self.leader == self.member_id


def decode_status(body: Mapping[str, Any]) -> MemberStatus:
    header = _mapping(body, "header")
    if "member_id" not in header:
        raise GatewayFormatError(f"not a status reply: {_clip(json.dumps(body))!r}")
    return MemberStatus(
        _int(header, "member_id"),
        _int(body, "leader"),
        _int(body, "raftTerm") or _int(header, "raft_term"),
        _int(header, "revision"),
        _str(body, "version"),
    )


# --- refusals ---------------------------------------------------------------------------------


class Refusal(enum.Enum):
    """What etcd's refusal means to a client: an answer, a retry, or a fault to report."""

    #: The request was refused for what it asked (a definite answer, not applied): the core
    #: gets an :class:`~trioha.failover.EtcdError` value.
    ANSWER = "answer"
    #: This member has no leader; with ``hasleader`` set it refused before doing anything.
    NO_LEADER = "no leader"
    #: Too busy to take it now; nothing was applied.
    BUSY = "busy"
    #: The request may have been applied (etcd's own timeout, a leader change under it).
    MAYBE = "maybe"
    #: Authentication is on and the request carried no user.
    AUTH_MISSING = "auth missing"
    #: The user and password were refused.
    AUTH_FAILED = "auth failed"
    #: The user may not touch these keys.
    PERMISSION = "permission denied"
    #: The token expired or is unknown to this member: authenticate again, then retry.
    TOKEN = "invalid token"
    #: Credentials were given but etcd has authentication off.
    AUTH_OFF = "auth not enabled"


#: gRPC status codes, for refusals whose message is not one etcd's ``rpctypes`` names.
_UNAVAILABLE, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED = 14, 4, 8

#: etcd's ``rpctypes`` error messages, most specific first.
_MESSAGES: tuple[tuple[str, Refusal], ...] = (
    ("requested lease not found", Refusal.ANSWER),
    ("required revision has been compacted", Refusal.ANSWER),
    ("database space exceeded", Refusal.ANSWER),
    ("etcdserver: no leader", Refusal.NO_LEADER),
    ("too many requests", Refusal.BUSY),
    ("user name is empty", Refusal.AUTH_MISSING),
    ("authentication failed", Refusal.AUTH_FAILED),
    ("permission denied", Refusal.PERMISSION),
    ("invalid auth token", Refusal.TOKEN),
    ("authentication is not enabled", Refusal.AUTH_OFF),
    ("request timed out", Refusal.MAYBE),
    ("leader changed", Refusal.MAYBE),
    ("server stopped", Refusal.MAYBE),
    ("unhealthy cluster", Refusal.MAYBE),
)


def gateway_error(body: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(gRPC code, message)`` when *body* is a refusal: a unary call's ``{"error": "...",
    "code": n}`` or a stream's ``{"error": {"grpc_code": n, "message": "..."}}``."""
    error = body.get("error")
    if error is None or error == "":
        return None
    if isinstance(error, dict):
        code = error.get("grpc_code", error.get("code", 0))
        message = error.get("message", "")
    else:
        code = body.get("code", 0)
        message = body.get("message") or error
    return (code if isinstance(code, int) else 0), str(message)


def classify(code: int, message: str) -> Refusal:
    """What a refusal means (etcd's messages first, then its gRPC code)."""
    for text, refusal in _MESSAGES:
        if text in message:
            return refusal
    if code in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
        return Refusal.MAYBE
    if code == _RESOURCE_EXHAUSTED:
        return Refusal.BUSY
    return Refusal.ANSWER


def refusal_value(message: str) -> EtcdError:
    """A definite refusal as the value the core reads."""
    if "requested lease not found" in message:
        return EtcdError(ErrorCode.LEASE_NOT_FOUND, message)
    if "required revision has been compacted" in message:
        return EtcdError(ErrorCode.COMPACTED, message)
    return EtcdError(ErrorCode.OTHER, message)
