"""RocketMQ's remoting protocol on Trio: the wire, nothing of what a broker does with it.

The codec (``RemotingCommand``, ``NettyDecoder``'s framing), one connection per socket
(``NettyRemotingAbstract``: requests and responses matched by opaque), a server
(``NettyRemotingServer``) and the limits it puts on its peers, a client pool
(``NettyRemotingClient``) and the client calls the CLI and the tests make
(``MQClientAPIImpl``). The broker's request processors live in
:mod:`trioha.broker`, the name server in :mod:`trioha.namesrv`. See ``docs/remoting.md``.
"""

from trioha.remoting._client import (
    RemotingClientPool,
    open_client_pool,
    open_remoting_client,
)
from trioha.remoting._codec import (
    MAX_FRAME_LENGTH,
    FrameDecoder,
    HeaderError,
    RemotingCommand,
    SerializeType,
    decode_frame,
    encode,
    int_field,
)
from trioha.remoting._codes import RequestCode, ResponseCode
from trioha.remoting._connection import (
    NO_RESPONSE,
    Burst,
    NoBursts,
    RemotingConnection,
    RequestHandler,
)
from trioha.remoting._dataversion import DataVersion
from trioha.remoting._limits import ConnectionReserve, FrameDeadline, ServerLimits
from trioha.remoting._server import ConnectionCounters, serve_remoting

__all__ = [
    "MAX_FRAME_LENGTH",
    "NO_RESPONSE",
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
    "decode_frame",
    "encode",
    "int_field",
    "open_client_pool",
    "open_remoting_client",
    "serve_remoting",
]
