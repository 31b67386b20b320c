"""A RocketMQ name server: brokers register, clients ask for routes.

Mirrors RocketMQ's ``namesrv`` module: ``RouteInfoManager`` (the tables),
``DefaultRequestProcessor`` (the request codes) and the housekeeping that drops silent brokers.
Run it alone with ``python -m trioha namesrv`` or inside a master with ``--embedded-namesrv``.
"""

from trioha._config import DEFAULT_NAMESRV_PORT
from trioha.namesrv._processor import (
    REGISTRATION_PERIOD,
    NamesrvProcessor,
    check_idle_timeout,
    serve_namesrv,
)
from trioha.namesrv._routes import RouteInfoManager

__all__ = [
    "DEFAULT_NAMESRV_PORT",
    "REGISTRATION_PERIOD",
    "NamesrvProcessor",
    "RouteInfoManager",
    "check_idle_timeout",
    "serve_namesrv",
]
