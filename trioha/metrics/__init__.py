"""Prometheus metrics for a broker or a name server, on an opt-in HTTP port.

``python -m trioha master|slave|namesrv --metrics-listen HOST:PORT`` serves ``/metrics`` in
Prometheus's text format. Nothing is counted for it on the hot paths: the broker, its HA service
and client, the client port and the name server keep plain counters and histograms in their
``statistics()`` (as they do anyway for ``status`` and GET_BROKER_RUNTIME_INFO), and a collector
turns one snapshot into metric families at each scrape. ``docs/operations.md`` lists every
metric. Needs the ``metrics`` extra (``pip install 'trioha[metrics]'``).
"""

from trioha.metrics._collect import BrokerCollector, NamesrvCollector
from trioha.metrics._http import serve_metrics

__all__ = ["BrokerCollector", "NamesrvCollector", "serve_metrics"]
