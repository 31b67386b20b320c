"""trioha's Spark pipeline: read RocketMQ commit logs as DataFrames, audit replicas, export.

Needs the ``spark`` extra (``pip install 'trioha[spark]'``: pyspark, pyarrow, numpy) and a
Java runtime. Importing this package does not import any of them: the names that need them
load on first use, so the CLI can offer its commands without them. See docs/pipeline.md.

    from trioha.pipeline import spark_session, audit_replicas
    spark = spark_session("local[*]")          # also registers the data sources
    df = spark.read.format("commitlog").load("/data/store")
    print(audit_replicas(spark, "/data/master", ["/data/slave"]).render())
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from trioha.pipeline._format import Problem, ProblemKind
from trioha.pipeline._layout import LogLayout, Segment, read_layout
from trioha.pipeline._options import Engine, Output, ReadOptions
from trioha.pipeline._plan import ScanPartition, ScanRange, plan_partitions
from trioha.pipeline._verdict import (
    AuditReport,
    Divergence,
    MessageSide,
    OffsetRange,
    ReplicaInfo,
    SlaveAudit,
    Verdict,
)

if TYPE_CHECKING:
    from trioha.pipeline._audit import audit_replicas
    from trioha.pipeline._cli import register_commands
    from trioha.pipeline._export import (
        Damage,
        ExportSummary,
        LogStats,
        QueueStats,
        TopicStats,
        export_parquet,
        log_damage,
        log_stats,
        read_export,
    )
    from trioha.pipeline._jvm import read_commitlog
    from trioha.pipeline._schema import MESSAGE_SCHEMA, PROBLEM_SCHEMA
    from trioha.pipeline._session import spark_session
    from trioha.pipeline._source import CommitLogDataSource, CommitLogProblemsDataSource, register
    from trioha.pipeline._stream import start_stream

#: The file to hand to ``spark-submit`` (it runs :func:`trioha.pipeline._cli.main`).
SUBMIT_FILE = os.path.join(os.path.dirname(__file__), "__main__.py")

_LAZY = {
    "audit_replicas": "trioha.pipeline._audit",
    "register_commands": "trioha.pipeline._cli",
    "Damage": "trioha.pipeline._export",
    "ExportSummary": "trioha.pipeline._export",
    "LogStats": "trioha.pipeline._export",
    "QueueStats": "trioha.pipeline._export",
    "TopicStats": "trioha.pipeline._export",
    "export_parquet": "trioha.pipeline._export",
    "log_damage": "trioha.pipeline._export",
    "log_stats": "trioha.pipeline._export",
    "read_export": "trioha.pipeline._export",
    "read_commitlog": "trioha.pipeline._jvm",
    "spark_session": "trioha.pipeline._session",
    "start_stream": "trioha.pipeline._stream",
    "MESSAGE_SCHEMA": "trioha.pipeline._schema",
    "PROBLEM_SCHEMA": "trioha.pipeline._schema",
    "CommitLogDataSource": "trioha.pipeline._source",
    "CommitLogProblemsDataSource": "trioha.pipeline._source",
    "register": "trioha.pipeline._source",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "MESSAGE_SCHEMA",
    "PROBLEM_SCHEMA",
    "SUBMIT_FILE",
    "AuditReport",
    "CommitLogDataSource",
    "CommitLogProblemsDataSource",
    "Damage",
    "Divergence",
    "Engine",
    "ExportSummary",
    "LogLayout",
    "LogStats",
    "MessageSide",
    "OffsetRange",
    "Output",
    "Problem",
    "ProblemKind",
    "QueueStats",
    "ReadOptions",
    "ReplicaInfo",
    "ScanPartition",
    "ScanRange",
    "Segment",
    "SlaveAudit",
    "TopicStats",
    "Verdict",
    "audit_replicas",
    "export_parquet",
    "log_damage",
    "log_stats",
    "plan_partitions",
    "read_commitlog",
    "read_export",
    "read_layout",
    "register",
    "register_commands",
    "spark_session",
    "start_stream",
]
