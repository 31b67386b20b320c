"""RocketMQ's remoting protocol on Trio: the wire, nothing of what a broker does with it.

The codec (``RemotingCommand``, ``NettyDecoder``'s framing), one connection per socket
(``NettyRemotingAbstract``: requests and responses matched by opaque), a server
(``NettyRemotingServer``) and the limits it puts on its peers, a client pool
(``NettyRemotingClient``) and the client calls the CLI and the tests make
(``MQClientAPIImpl``). The broker's request processors live in
:mod:`trioha.broker`, the name server in :mod:`trioha.namesrv`. See ``docs/remoting.md``.
"""

from trioha.remoting._client import RemotingClientPool, open_client_pool, open_remoting_client
from trioha.remoting._codec import (
    MAX_FRAME_LENGTH,
    FrameDecoder,
    HeaderError,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
    encode_response,
    int_field,
    require_field,
)
from trioha.remoting._codes import (
    AUTO_CREATE_TOPIC,
    MASTER_ID,
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    VERSION_4_9_7,
    RequestCode,
    ResponseCode,
)
from trioha.remoting._connection import (
    NO_RESPONSE,
    Burst,
    NoBursts,
    RemotingConnection,
    RequestHandler,
)
from trioha.remoting._dataversion import DataVersion
from trioha.remoting._json import dumps, dumps_bytes, loads_lenient
from trioha.remoting._limits import ConnectionReserve, FrameDeadline, ServerLimits
from trioha.remoting._mqclient import (
    DEFAULT_TOPIC_QUEUE_NUMS,
    BrokerRoute,
    TopicRoute,
    get_route,
    pull_message,
    query_consumer_offset,
    runtime_info,
    send_message,
    update_consumer_offset,
)
from trioha.remoting._server import ConnectionCounters, serve_remoting

__all__ = [
    "AUTO_CREATE_TOPIC",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "MASTER_ID",
    "MAX_FRAME_LENGTH",
    "NO_RESPONSE",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "PULL_FLAG_COMMIT_OFFSET",
    "PULL_FLAG_SUBSCRIPTION",
    "PULL_FLAG_SUSPEND",
    "VERSION_4_9_7",
    "BrokerRoute",
    "Burst",
    "ConnectionCounters",
    "ConnectionReserve",
    "DataVersion",
    "FrameDeadline",
    "FrameDecoder",
    "HeaderError",
    "NoBursts",
    "RemotingClientPool",
    "RemotingCommand",
    "RemotingConnection",
    "RequestCode",
    "RequestHandler",
    "ResponseCode",
    "SerializeType",
    "ServerLimits",
    "TopicRoute",
    "decode_frame",
    "dumps",
    "dumps_bytes",
    "encode",
    "encode_response",
    "get_route",
    "int_field",
    "loads_lenient",
    "open_client_pool",
    "open_remoting_client",
    "pull_message",
    "query_consumer_offset",
    "require_field",
    "runtime_info",
    "send_message",
    "serve_remoting",
    "update_consumer_offset",
]
