"""A RocketMQ name server: brokers register, clients ask for routes.

Mirrors RocketMQ's ``namesrv`` module: ``RouteInfoManager`` (the tables),
``DefaultRequestProcessor`` (the request codes) and the housekeeping that drops silent brokers.
Run it alone with ``python -m trioha namesrv`` or inside a master with ``--embedded-namesrv``.
"""

from trioha.namesrv._processor import NamesrvProcessor, serve_namesrv
from trioha.namesrv._routes import DEFAULT_NAMESRV_PORT, RouteInfoManager

__all__ = ["DEFAULT_NAMESRV_PORT", "NamesrvProcessor", "RouteInfoManager", "serve_namesrv"]
