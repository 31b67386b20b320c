"""Snapshots as Prometheus metric families: what ``/metrics`` shows, named by convention.

Names follow Prometheus's rules: the ``trioha_`` prefix, base units (bytes, seconds), ``_total``
for counters, labels for what varies (a slave's address, a request code, a status). Each scrape
reads one ``statistics()`` snapshot, so the figures of one scrape agree with each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from trioha._histogram import HistogramSnapshot


def _gauge(name: str, doc: str, value: float, **labels: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _counts(name: str, doc: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter with one label, one sample per key of *counts* (sorted)."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(counts.items()):
        family.add_metric([key], n)
    return family


def _histogram(
    name: str, doc: str, snaps: dict[tuple[str, ...], HistogramSnapshot], labels: list[str]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, snap in sorted(snaps.items()):
        buckets = [("+Inf" if b == float("inf") else repr(b), n) for b, n in snap.buckets]
        family.add_metric(list(values), buckets, snap.sum)
    return family


def _failover(stats: Any) -> Iterator[Metric]:
    """Automatic failover's figures (``FailoverStatistics``, docs/failover.md)."""
    yield _gauge(
        "trioha_failover_phase_info",
        "The replica manager's phase (value 1): STARTING, REGISTERING, FOLLOWER, CAMPAIGNING, "
        "MASTER, FENCED, HANDING_OVER, STOPPED.",
        1,
        phase=stats.phase,
    )
    yield _gauge("trioha_failover_epoch", "The epoch etcd's master holds.", stats.master_epoch)
    yield _gauge(
        "trioha_failover_master_id", "The stable id of etcd's master (0: none).", stats.master_id
    )
    yield _gauge(
        "trioha_failover_sync_state_set_size",
        "Brokers in the SyncStateSet as etcd has it.",
        len(stats.sync_state_set),
    )
    if stats.lease_deadline_in is not None:
        yield _gauge(
            "trioha_failover_lease_deadline_seconds",
            "Seconds until this master stops acknowledging unless a keepalive succeeds.",
            stats.lease_deadline_in,
        )
    yield _counter("trioha_failover_elections", "Elections this broker won.", stats.elections)
    yield _counter(
        "trioha_failover_role_changes", "Role changes made by this broker.", stats.role_changes
    )
    yield _counter("trioha_failover_fences", "Times this broker fenced itself.", stats.fences)
    yield _counter(
        "trioha_failover_fenced_seconds",
        "Seconds spent fenced while holding the master key.",
        stats.fenced_seconds,
    )


class BrokerCollector:
    """Metrics of a running :class:`~trioha.broker.Broker` (master or slave)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        stats = self.broker.statistics()
        role = stats.role.value
        yield _gauge("trioha_broker_info", "The broker's role (value 1).", 1, role=role)
        yield _gauge(
            "trioha_commitlog_min_offset_bytes",
            "First offset still in the commit log.",
            stats.min_offset,
        )
        yield _gauge(
            "trioha_commitlog_max_offset_bytes", "End of the commit log.", stats.max_offset
        )
        yield _gauge(
            "trioha_commitlog_flushed_offset_bytes", "End of what is on disk.", stats.flushed_offset
        )
        yield _counter("trioha_puts", "Messages stored by puts.", stats.puts)
        yield from self._puts(stats)
        yield from self._disk(stats)
        if stats.ha is not None:
            yield from self._master(stats.ha, stats.max_offset)
        if stats.client is not None:
            yield from self._slave(stats.client)
        failover = getattr(stats, "failover", None)
        if failover is not None:
            yield from _failover(failover)
        side = getattr(self.broker, "client_side", None)
        if side is not None:
            yield from _client_port(side)

    def _puts(self, stats: Any) -> Iterator[Metric]:
        results = getattr(stats, "put_results", None)
        if results is not None:
            yield _counts(
                "trioha_put_results", "Put results by RocketMQ PutMessageStatus.", "status", results
            )
        latency = getattr(stats, "put_latency", None)
        if latency is not None:
            yield _histogram(
                "trioha_put_latency_seconds",
                "Time from a put's arrival to its answer, by replication mode.",
                {(mode,): snap for mode, snap in latency.items()},
                ["mode"],
            )

    def _disk(self, stats: Any) -> Iterator[Metric]:
        ratio = getattr(stats, "disk_used_ratio", None)
        if ratio is not None:
            yield _gauge(
                "trioha_disk_used_ratio",
                "Share of the commit log's file system in use (0-1).",
                ratio,
            )
        retention = getattr(stats, "retention", None)
        if retention is not None:
            yield _counts(
                "trioha_retention_deleted_files",
                "Files retention deleted, by kind.",
                "kind",
                {
                    "commitlog": retention.segments_deleted,
                    "consumequeue": retention.consume_queue_files_deleted,
                    "index": retention.index_files_deleted,
                },
            )
            yield _counter(
                "trioha_retention_deleted_bytes",
                "Commit log bytes retention deleted.",
                retention.bytes_deleted,
            )

    def _master(self, ha: Any, max_offset: int) -> Iterator[Metric]:
        per_slave = {
            "trioha_ha_slave_ack_offset_bytes": (
                "Last offset the slave acknowledged.",
                "ack_offset",
                GaugeMetricFamily,
            ),
            "trioha_ha_slave_behind_bytes": (
                "Bytes the master has that the slave has not acked.",
                "lag",
                GaugeMetricFamily,
            ),
            "trioha_ha_slave_behind_seconds": (
                "Time since the master's log first reached the slave's acked offset.",
                "behind_seconds",
                GaugeMetricFamily,
            ),
            "trioha_ha_slave_connected_seconds": (
                "Age of the slave's connection.",
                "connected_seconds",
                GaugeMetricFamily,
            ),
            "trioha_ha_slave_sent_bytes": (
                "Bytes sent to the slave (headers and bodies).",
                "bytes_sent",
                CounterMetricFamily,
            ),
            "trioha_ha_slave_frames_sent": (
                "Frames with data sent to the slave.",
                "frames_sent",
                CounterMetricFamily,
            ),
            "trioha_ha_slave_heartbeats_sent": (
                "Heartbeat frames sent to the slave.",
                "heartbeats_sent",
                CounterMetricFamily,
            ),
        }
        for name, (doc, attr, kind) in per_slave.items():
            family = kind(name, doc, labels=["peer"])
            for slave in ha.slaves:
                value = getattr(slave, attr, None)
                if value is not None:
                    family.add_metric([slave.peer], value)
            yield family
        yield _gauge("trioha_ha_slaves_connected", "Slave connections in transfer.", len(ha.slaves))
        yield _gauge(
            "trioha_ha_replicated_offset_bytes",
            "Highest offset that enough slaves vouch for (sync replication).",
            ha.replicated_offset,
        )
        yield _gauge(
            "trioha_ha_sync_puts_waiting", "Sync puts waiting for slave acks.", ha.waiting_puts
        )
        yield _counter(
            "trioha_ha_connections_accepted",
            "Connections accepted on the HA port.",
            ha.connections_accepted,
        )
        reasons = getattr(ha, "closed_by_reason", None)
        yield _counts(
            "trioha_ha_connections_closed",
            "HA connections closed, by reason.",
            "reason",
            reasons if reasons is not None else {"any": ha.connections_closed},
        )

    def _slave(self, client: Any) -> Iterator[Metric]:
        yield _gauge(
            "trioha_ha_client_connected",
            "1 while connected to the master.",
            1 if client.connected else 0,
            master=client.master,
        )
        state = getattr(client, "state", None)
        if state is not None:
            yield _gauge(
                "trioha_ha_client_state_info",
                "The slave's replication state.",
                1,
                state=str(getattr(state, "value", state)),
            )
        yield _gauge(
            "trioha_ha_client_reported_offset_bytes",
            "Last offset reported to the master.",
            client.reported_offset,
        )
        yield _counter(
            "trioha_ha_client_received_bytes",
            "Bytes received from the master.",
            client.bytes_received,
        )
        appended = getattr(client, "bytes_appended", None)
        if appended is not None:
            yield _counter(
                "trioha_ha_client_appended_bytes",
                "Replicated bytes written to this slave's commit log.",
                appended,
            )
        behind = getattr(client, "behind_bytes", None)
        if behind is not None:  # once the master's end is learned (metadata sync)
            yield _gauge(
                "trioha_ha_client_behind_bytes",
                "Bytes the master has that this slave has not (as last learned).",
                behind,
            )
        seconds = getattr(client, "behind_seconds", None)
        if seconds is not None:
            yield _gauge(
                "trioha_ha_client_behind_seconds",
                "0 when this slave holds the master's end as last learned, else the age of "
                "the last message it holds (now minus its store timestamp).",
                seconds,
            )
        yield _counter(
            "trioha_ha_client_connects", "Connections made to the master.", client.connects
        )
        reasons = getattr(client, "closed_by_reason", None)
        if reasons is not None:
            yield _counts(
                "trioha_ha_client_disconnects",
                "Connections to the master that ended, by reason.",
                "reason",
                reasons,
            )


def _client_port(side: Any) -> Iterator[Metric]:
    processor = side.processor
    requests = CounterMetricFamily(
        "trioha_remoting_requests",
        "Client-port requests answered, by request and response code.",
        labels=["code", "response"],
    )
    for key, n in sorted(processor.served.items()):
        code, _, response = key.rpartition(".")
        requests.add_metric([code, response], n)
    yield requests
    latency = getattr(processor, "latency", None)
    if latency is not None:
        yield _histogram(
            "trioha_remoting_request_latency_seconds",
            "Time to answer a client-port request, by request code.",
            {(code,): h.snapshot() for code, h in latency.items()},
            ["code"],
        )
    yield _gauge(
        "trioha_remoting_connections", "Open client-port connections.", side.connections.open
    )
    yield _counter(
        "trioha_remoting_connections_refused",
        "Client-port connections refused by the connection cap or its reserve.",
        side.connections.refused,
    )
    yield _counter(
        "trioha_remoting_connections_reserve_refused",
        "Client-port connections refused because only reserved slots were left and their "
        "address held many.",
        side.connections.reserve_refused,
    )
    yield _counter(
        "trioha_remoting_connections_slow_frame_closed",
        "Client-port connections closed because a frame missed its deadline.",
        side.connections.slow_frame_closed,
    )
    yield _gauge(
        "trioha_consumequeue_dispatch_behind_bytes",
        "Commit log bytes not yet indexed into consume queues (reput lag).",
        side.reput.behind,
    )


class NamesrvCollector:
    """Metrics of a running name server: what it knows."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def collect(self) -> Iterator[Metric]:
        routes = self.processor.routes
        yield _gauge("trioha_namesrv_brokers", "Live brokers registered.", len(routes.live))
        yield _gauge("trioha_namesrv_topics", "Topics with a route.", len(routes.topic_queues))
        yield _gauge("trioha_namesrv_clusters", "Clusters known.", len(routes.clusters))
