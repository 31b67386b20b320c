"""RocketMQ's remoting protocol on Trio: the wire, nothing of what a broker does with it.

The codec (``RemotingCommand``, ``NettyDecoder``'s framing), one connection per socket
(``NettyRemotingAbstract``: requests and responses matched by opaque), a server
(``NettyRemotingServer``), a client pool (``NettyRemotingClient``) and the client calls the CLI
and the tests make (``MQClientAPIImpl``). The broker's request processors live in
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
)
from trioha.remoting._codes import RequestCode, ResponseCode
from trioha.remoting._connection import NO_RESPONSE, RemotingConnection, RequestHandler
from trioha.remoting._dataversion import DataVersion
from trioha.remoting._server import serve_remoting

__all__ = [
    "MAX_FRAME_LENGTH",
    "NO_RESPONSE",
    "DataVersion",
    "FrameDecoder",
    "HeaderError",
    "RemotingClientPool",
    "RemotingCommand",
    "RemotingConnection",
    "RequestCode",
    "RequestHandler",
    "ResponseCode",
    "SerializeType",
    "decode_frame",
    "encode",
    "open_client_pool",
    "open_remoting_client",
    "serve_remoting",
]
