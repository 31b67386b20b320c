"""RocketMQ's remoting numbers: request codes, response codes, languages, flags.

Values are RocketMQ's own (``common/protocol/RequestCode.java``, ``ResponseCode.java``,
``remoting/protocol/LanguageCode.java``, 4.9.4); only the ones trioha speaks or answers
are listed. They are ``IntEnum`` so that a frame's plain ``int`` compares equal.
"""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_CONSUMER_RUNNING_INFO = 307
    SEND_MESSAGE_V2 = 310
    GET_BROKER_CONSUME_STATS = 317
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322


class ResponseCode(enum.IntEnum):
    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206
    NO_MESSAGE = 208


#: ``LanguageCode``: the byte the binary ("ROCKETMQ") header form carries.
LANGUAGE_CODES: dict[str, int] = {
    "JAVA": 0,
    "CPP": 1,
    "DOTNET": 2,
    "PYTHON": 3,
    "DELPHI": 4,
    "ERLANG": 5,
    "RUBY": 6,
    "OTHER": 7,
    "HTTP": 8,
    "GO": 9,
    "PHP": 10,
    "OMS": 11,
    "RUST": 12,
}
LANGUAGE_NAMES: dict[int, str] = {code: name for name, code in LANGUAGE_CODES.items()}

#: ``MQVersion.CURRENT_VERSION`` of RocketMQ 4.9.7 (``Version.V4_9_7.ordinal()``; the enum
#: is not one ordinal per release, so V4_9_4 is 401): the version trioha puts in its frames
#: and reports as ``brokerVersion``, the release it answers as.
VERSION_4_9_7 = 407

#: RemotingCommand flag bits (``RPC_TYPE`` and ``RPC_ONEWAY``).
FLAG_RESPONSE = 0b01
FLAG_ONEWAY = 0b10

#: ``MixAll.MASTER_ID``: a master's broker id.
MASTER_ID = 0

#: ``PermName``: topic permission bits.
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1

#: ``TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC``: the template topic of auto-creation.
AUTO_CREATE_TOPIC = "TBW102"

#: ``PullSysFlag`` bits of a PULL_MESSAGE request.
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
