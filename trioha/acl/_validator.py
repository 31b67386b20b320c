"""Who may do what: the decision for one request, sans IO.

Mirrors ``PlainAccessValidator.parse`` (which resources a request needs) and
``PlainPermissionManager.validate``/``checkPerm`` (whether the caller has them), in RocketMQ's
order, first match deciding (docs/rocketmq-protocol.md §12.3):

1. a global white pattern matches the client IP: allowed;
2. no ``AccessKey``: ``No accessKey is configured``;
3. an unknown one: ``No acl config for <ak>``;
4. the account's own white pattern matches: allowed;
5. a wrong signature: ``Check signature failed for accessKey=<ak>``;
6. PUB on ``RMQ_SYS_TRACE_TOPIC``: allowed;
7. an admin-only code from a non-admin account: ``Need admin permission ...``;
8. each needed resource against the account's listed or default permission.

A refusal is a :class:`Denial`, answered as the 4.9.7 broker answers an ``AclException``
escaping its RPC hook: SYSTEM_ERROR with ``e.toString()`` and the top stack frame as remark,
so the official clients react exactly as they do to a Java broker.

Where RocketMQ is known to be wrong, trioha does better (docs/security.md):

* **Admin codes**: RocketMQ requires ``admin`` for five codes only, so any signed account may
  read every consumer offset, the topic table or the ACL itself, and change the ACL
  (codes 50-54), reset a group's offsets (222) or ask its consumers for their running info
  (307). trioha's broker lets ordinary accounts use the client codes below and requires
  ``admin`` for every other code.
* **Codes that skip the resource check**: SEND_BATCH_MESSAGE, QUERY_CONSUMER_OFFSET, the
  offset queries and LOCK/UNLOCK_BATCH_MQ need the same topic and group permissions as their
  siblings; a send to a retry topic needs SUB on that retry topic (RocketMQ names a
  ``%RETRY%``+producer-group resource that no file lists, or none at all).
* **An empty group** names no resource (RocketMQ checks ``%RETRY%`` itself, refusing the C++
  producer's UNREGISTER_CLIENT).
* **QUERY_MESSAGE**: a 4.9.7 client's signature covers ``_UNIQUE_KEY_QUERY`` and is accepted
  (see :func:`~._signature.signature_matches`).
* **The name server** (RocketMQ checks nothing there): every request needs a valid signature;
  only route and KV reads are open to ordinary accounts, everything else (registration,
  KV writes, topic and write-permission changes, its configuration, read or written) needs
  ``admin``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from trioha.acl._permission import PUB, SUB, check_perm, is_retry_topic, print_resource, retry_topic
from trioha.acl._plainacl import AclTable
from trioha.acl._signature import ACCESS_KEY, signature_matches
from trioha.remoting import RemotingCommand, loads_lenient

_EXCEPTION = "org.apache.rocketmq.acl.common.AclException"
_VALIDATE = (
    "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:{})"
)
_CHECK_PERM = (
    "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:{})"
)

#: ``TopicValidator.RMQ_SYS_TRACE_TOPIC``: anyone signed may publish traces.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"

#: ``Permission.ADMIN_CODE`` (RocketMQ 4.9.7): UPDATE_AND_CREATE_TOPIC, UPDATE_BROKER_CONFIG,
#: DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, DELETE_SUBSCRIPTIONGROUP.
ROCKETMQ_ADMIN_CODES = frozenset({17, 25, 215, 200, 207})

#: The codes clients (producers, consumers) send to a broker; every other code is admin-only.
BROKER_CLIENT_CODES = frozenset(
    {
        10,  # SEND_MESSAGE
        11,  # PULL_MESSAGE
        12,  # QUERY_MESSAGE
        14,  # QUERY_CONSUMER_OFFSET
        15,  # UPDATE_CONSUMER_OFFSET
        29,  # SEARCH_OFFSET_BY_TIMESTAMP
        30,  # GET_MAX_OFFSET
        31,  # GET_MIN_OFFSET
        32,  # GET_EARLIEST_MSG_STORETIME
        33,  # VIEW_MESSAGE_BY_ID
        34,  # HEART_BEAT
        35,  # UNREGISTER_CLIENT
        36,  # CONSUMER_SEND_MSG_BACK
        37,  # END_TRANSACTION
        38,  # GET_CONSUMER_LIST_BY_GROUP
        41,  # LOCK_BATCH_MQ
        42,  # UNLOCK_BATCH_MQ
        46,  # CHECK_CLIENT_CONFIG
        310,  # SEND_MESSAGE_V2
        320,  # SEND_BATCH_MESSAGE
        324,  # SEND_REPLY_MESSAGE
        325,  # SEND_REPLY_MESSAGE_V2
    }
)

#: The name server's read codes, open to any signed account: GET_KV_CONFIG,
#: GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
#: GET_KVLIST_BY_NAMESPACE, GET_TOPICS_BY_CLUSTER, GET_SYSTEM_TOPIC_LIST_FROM_NS,
#: GET_UNIT_TOPIC_LIST, GET_HAS_UNIT_SUB_TOPIC_LIST, GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST.
NAMESRV_READ_CODES = frozenset({101, 105, 106, 206, 219, 224, 304, 311, 312, 313})


class Role(enum.Enum):
    """Which server is asking: the code policy differs (see the module docstring)."""

    BROKER = "broker"
    NAMESRV = "namesrv"


@attrs.frozen
class Denial:
    """A refused request: the ``AclException`` message and where Java would have thrown it."""

    message: str
    frame: str
    access_key: str | None = None

    @property
    def remark(self) -> str:
        """``RemotingHelper.exceptionSimpleDesc`` of the exception."""
        return f"{_EXCEPTION}: {self.message}, {self.frame}"


class _Resources:
    """``PlainAccessResource.resourcePermMap``: resource -> perm, later puts overwrite."""

    def __init__(self) -> None:
        self.perms: dict[str, int] = {}

    def add(self, resource: str | None, perm: int) -> None:
        if resource is not None:
            self.perms[resource] = perm


def _java_hash(text: str) -> int:
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h


def java_hashmap_order(keys: list[str]) -> list[str]:
    """The iteration order of a ``java.util.HashMap`` holding *keys* (inserted in this order).

    RocketMQ reports the first failing resource in this order, so a refusal names the same
    resource as the Java broker's.
    """
    size = 16
    while len(keys) > size * 3 // 4:
        size *= 2

    def bucket(key: str) -> int:
        h = _java_hash(key)
        return (h ^ (h >> 16)) & (size - 1)

    return sorted(keys, key=bucket)  # stable: a bucket keeps insertion order


def _retry(group: str | None) -> str | None:
    """A group's resource; an empty group names none. The C++ client sends ``consumerGroup=""``
    when a producer unregisters, which RocketMQ checks as group ``""`` (and refuses)."""
    return retry_topic(group) if group else None


def _send_topic(request: RemotingCommand, resources: _Resources, topic_field: str) -> None:
    topic = request.field(topic_field)
    if topic is not None and is_retry_topic(topic):
        resources.add(topic, SUB)  # a retry topic is its group's resource
    else:
        resources.add(topic, PUB)


def _json_body(request: RemotingCommand) -> dict[str, object]:
    try:
        value = loads_lenient(request.body) if request.body else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def needed_resources(request: RemotingCommand) -> dict[str, int]:
    """``PlainAccessValidator.parse`` for the broker, with trioha's additions."""
    r = _Resources()
    match request.code:
        case 10 | 324:  # SEND_MESSAGE, SEND_REPLY_MESSAGE
            _send_topic(request, r, "topic")
        case 310 | 320 | 325:  # SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, SEND_REPLY_MESSAGE_V2
            _send_topic(request, r, "b" if "b" in request.ext_fields else "topic")
        case 36:  # CONSUMER_SEND_MSG_BACK
            r.add(_retry(request.field("group")), SUB)
        case 11:  # PULL_MESSAGE
            r.add(request.field("topic"), SUB)
            r.add(_retry(request.field("consumerGroup")), SUB)
        case 12 | 29 | 30 | 31 | 32:  # QUERY_MESSAGE and the offset/time queries
            r.add(request.field("topic"), SUB)
        case 34:  # HEART_BEAT: every consumer's group and subscriptions
            consumers = _json_body(request).get("consumerDataSet") or []
            for consumer in consumers if isinstance(consumers, list) else []:
                if not isinstance(consumer, dict):
                    continue
                group = consumer.get("groupName")
                r.add(_retry(str(group)) if group is not None else None, SUB)
                subscriptions = consumer.get("subscriptionDataSet") or []
                for sub in subscriptions if isinstance(subscriptions, list) else []:
                    if isinstance(sub, dict) and sub.get("topic") is not None:
                        r.add(str(sub["topic"]), SUB)
        case 35 | 38:  # UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP
            r.add(_retry(request.field("consumerGroup")), SUB)
        case 14 | 15:  # QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET
            r.add(_retry(request.field("consumerGroup")), SUB)
            r.add(request.field("topic"), SUB)
        case 41 | 42:  # LOCK_BATCH_MQ, UNLOCK_BATCH_MQ: the group and topics in the body
            body = _json_body(request)
            group = body.get("consumerGroup")
            r.add(_retry(str(group)) if group is not None else None, SUB)
            queues = body.get("mqSet") or []
            for queue in queues if isinstance(queues, list) else []:
                if isinstance(queue, dict) and queue.get("topic") is not None:
                    r.add(str(queue["topic"]), SUB)
    return r.perms


def admin_required(code: int, role: Role) -> bool:
    if role is Role.NAMESRV:
        return code not in NAMESRV_READ_CODES
    return code in ROCKETMQ_ADMIN_CODES or code not in BROKER_CLIENT_CODES


def client_ip(peer: str) -> str:
    """``PlainAccessValidator.parse``: the channel address with its last ``:port`` cut off."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")


@attrs.define
class AccessValidator:
    """Decides requests against one :class:`AclTable` (swap :attr:`table` to reload)."""

    table: AclTable
    role: Role = Role.BROKER
    #: How to find the resources a request needs (the broker's table by default).
    resources: Callable[[RemotingCommand], dict[str, int]] = needed_resources

    def check(self, request: RemotingCommand, peer: str) -> Denial | None:
        """None to let *request* from *peer* (``host:port``) through, else the refusal."""
        ip = client_ip(peer)
        table = self.table
        if any(p.matches(ip) for p in table.global_white):
            return None
        fields = request.ext_fields
        access_key = fields.get(ACCESS_KEY)
        if access_key is None:
            return Denial("No accessKey is configured", _VALIDATE.format(663))
        account = table.accounts.get(access_key)
        if account is None:
            return Denial(f"No acl config for {access_key}", _VALIDATE.format(667), access_key)
        if account.white_address.matches(ip):
            return None
        if not signature_matches(fields, request.body, account.secret_key, code=request.code):
            return Denial(
                f"Check signature failed for accessKey={access_key}",
                _VALIDATE.format(683),
                access_key,
            )
        needed = self.resources(request) if self.role is Role.BROKER else {}
        if needed.get(TRACE_TOPIC) == PUB:
            return None
        if admin_required(request.code, self.role) and not account.admin:
            return Denial(
                f"Need admin permission for request code={request.code}, "
                f"but accessKey={access_key} is not",
                _CHECK_PERM.format(580),
                access_key,
            )
        if not needed or (account.resource_perms is None and account.admin):
            return None
        owned = account.resource_perms
        for resource in java_hashmap_order(list(needed)):
            perm = needed[resource]
            if owned is None or resource not in owned:
                default = (
                    account.default_group_perm
                    if is_retry_topic(resource)
                    else account.default_topic_perm
                )
                if not check_perm(perm, default):
                    return Denial(
                        f"No default permission for {print_resource(resource)}",
                        _CHECK_PERM.format(605),
                        access_key,
                    )
            elif not check_perm(perm, owned[resource]):
                return Denial(
                    f"No default permission for {print_resource(resource)}",
                    _CHECK_PERM.format(610),
                    access_key,
                )
        return None
