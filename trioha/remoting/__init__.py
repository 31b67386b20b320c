"""RocketMQ's client side: the remoting protocol, a name server, consume queues, metadata sync.

The official RocketMQ clients work against a trioha broker unchanged: producers send to the
master, consumers pull from the master or, when it is gone, from the slave. The broker starts
:func:`serve_client_side` next to its store and HA service; :func:`serve_namesrv` is a
stand-alone name server (also ``python -m trioha namesrv``). See ``docs/remoting.md``.
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
from trioha.remoting._namesrv import NamesrvProcessor, RouteInfoManager, serve_namesrv
from trioha.remoting._server import serve_remoting
from trioha.remoting._service import ClientSide, serve_client_side
from trioha.remoting._types import BrokerLike

__all__ = [
    "MAX_FRAME_LENGTH",
    "NO_RESPONSE",
    "BrokerLike",
    "ClientSide",
    "FrameDecoder",
    "HeaderError",
    "NamesrvProcessor",
    "RemotingClientPool",
    "RemotingCommand",
    "RemotingConnection",
    "RequestCode",
    "RequestHandler",
    "ResponseCode",
    "RouteInfoManager",
    "SerializeType",
    "decode_frame",
    "encode",
    "open_client_pool",
    "open_remoting_client",
    "serve_client_side",
    "serve_namesrv",
    "serve_remoting",
]
