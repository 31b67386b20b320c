"""``audit``, ``export`` and ``stats`` subcommands.

:func:`register_commands` adds them to any ``argparse`` subparsers object without importing
pyspark (each handler imports it when run), so ``trioha --help`` works without the
``spark`` extra. Each handler returns an exit code: 0 when all is well, 1 when the audit
found a divergence, a hole or damage (and ``export``/``stats`` when the log is damaged, unless
``--allow-damage``), 2 when the pipeline cannot run (no Java, no pyspark, no such directory, a
Spark or Hadoop error such as an unwritable output path): always one line on stderr, never a
Java stack trace.

:func:`main` is the entry point of ``python -m trioha.pipeline`` and of
``spark-submit .../trioha/pipeline/__main__.py`` on a cluster.

While a command runs, its progress is reported (:mod:`trioha.pipeline._jobprogress`): a bar
per job on a terminal, a log line every 10 s otherwise (Spark's own console bar is off);
``--no-progress`` turns it off.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trioha._errors import PipelineError
from trioha.pipeline._jobprogress import Describe, JobProgress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Handler = Callable[[argparse.Namespace], int]

_MASTER_HELP = (
    "Spark master URL (default local[*]; under spark-submit, the master spark-submit was given)"
)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spark-master", metavar="URL", default=None, help=_MASTER_HELP)
    parser.add_argument(
        "--segment-size",
        type=int,
        metavar="BYTES",
        default=None,
        help="segment file size (default: the length most segment files have)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="do not report progress (a bar on a terminal, a log line every 10 s otherwise)",
    )


def _range(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start-offset", type=int, metavar="OFFSET", default=None)
    parser.add_argument("--end-offset", type=int, metavar="OFFSET", default=None)
    parser.add_argument(
        "--allow-damage",
        action="store_true",
        help="exit 0 even when the log is damaged (export then writes the readable messages)",
    )
    parser.add_argument(
        "--engine",
        choices=("auto", "jvm", "python"),
        default="auto",
        help="who decodes: the JVM engine when the session has it (auto), or one of them "
        "(docs/pipeline.md, Engines)",
    )


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``audit``, ``export``, ``stats`` and ``pipeline-dist``; each sets ``handler``
    to a function ``(args) -> exit code``."""
    audit = subparsers.add_parser(
        "audit",
        help="compare a master's commit log with its slaves' (Spark)",
        description=(
            "Compare the commit log of a master with those of its slaves chunk by chunk, "
            "pinpoint the first divergent message, and check the framing and body CRC of "
            "the records where they differ (of every record with --verify-records). "
            "Directories are store roots or commitlog directories."
        ),
    )
    audit.add_argument("master_dir", metavar="MASTER_DIR")
    audit.add_argument("slave_dirs", metavar="SLAVE_DIR", nargs="+")
    audit.add_argument(
        "--chunk-kib",
        type=int,
        default=1024,
        metavar="KIB",
        help="comparison chunk size in KiB (default 1024)",
    )
    audit.add_argument(
        "--verify-records",
        action="store_true",
        help="also check the framing and body CRC of every record of every replica, "
        "not only where the replicas differ",
    )
    _common(audit)
    audit.set_defaults(handler=_audit)

    export = subparsers.add_parser(
        "export",
        help="write a commit log's messages to Parquet, partitioned by topic (Spark)",
        description="Write every message of DIR to Parquet under OUT (topic=... directories).",
    )
    export.add_argument("directory", metavar="DIR")
    export.add_argument("out", metavar="OUT")
    export.add_argument(
        "--mode",
        choices=("errorifexists", "overwrite", "append", "ignore"),
        default="errorifexists",
        help="what to do when OUT exists (default: fail)",
    )
    _range(export)
    _common(export)
    export.set_defaults(handler=_export)

    stats = subparsers.add_parser(
        "stats",
        help="per-topic and per-queue message counts, bytes and time ranges (Spark)",
        description="Count the messages of DIR per topic and queue.",
    )
    stats.add_argument("directory", metavar="DIR")
    _range(stats)
    _common(stats)
    stats.set_defaults(handler=_stats)

    dist = subparsers.add_parser(
        "pipeline-dist",
        help="build the zip Spark executors need to run the pipeline (no Spark started)",
        description=(
            "Write a zip of trioha.pipeline and the pure-Python modules it imports (a few "
            "of trioha's, and attrs) for --py-files, complete for the driver too (which "
            "spark-submit gives the zip first), and beside it a requirements file pinning "
            "the compiled dependencies (numpy, pyarrow, lz4, zstandard) to install into the "
            "executors' Python."
        ),
    )
    dist.add_argument(
        "--out",
        default="trioha-pipeline.zip",
        metavar="ZIP",
        help="where to write the zip (default ./trioha-pipeline.zip)",
    )
    dist.set_defaults(handler=_dist)


def _spark(args: argparse.Namespace) -> SparkSession:
    from trioha.pipeline._session import spark_session

    return spark_session(
        args.spark_master,
        app_name=f"trioha {args.pipeline_command}",
        progress=False,  # ours replaces Spark's console bar (see _run)
        # Errors reach the user as one line from _run; the JVM's own report of them would
        # be a stack trace on stderr.
        log_level="OFF",
    )


def _run(
    args: argparse.Namespace,
    body: Callable[[SparkSession], tuple[int, str]],
    describe: Describe,
) -> int:
    """Start Spark (or join the session already running in this process), run *body*
    reporting its jobs' progress as *describe* names them (unless ``--no-progress``), print
    what it returns (after the last progress line), and stop Spark again if it was started
    here. *body* returns the exit code and the report."""
    try:
        for path in _paths(args):
            if not os.path.isdir(path):
                raise PipelineError(f"not a directory: {path}")
        from trioha.pipeline._session import require_pyspark

        require_pyspark()
        from pyspark.sql import SparkSession

        joined = SparkSession.getActiveSession()
        spark = joined if joined is not None else _spark(args)
        if joined is not None:
            from trioha.pipeline._source import register

            register(joined)
    except PipelineError as exc:
        print(f"trioha: error: {exc}", file=sys.stderr)
        return 2
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    try:
        if args.no_progress:
            code, report = body(spark)
        else:
            # Each thread that talks to Spark has a connection of its own, and py4j logs
            # the progress thread's closing at INFO.
            logging.getLogger("py4j.clientserver").setLevel(logging.WARNING)
            with JobProgress(spark.sparkContext, args.pipeline_command, describe):
                code, report = body(spark)
        print(report)
        return code
    except (PipelineError, PySparkException, Py4JError) as exc:
        print(f"trioha: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    finally:
        if joined is None:
            spark.stop()


def _one_line(exc: BaseException) -> str:
    """The first line of what went wrong: Spark wraps errors raised in its workers and a
    Java exception carries its whole stack; the first line names the cause."""
    java = getattr(exc, "java_exception", None)
    text = str(exc)
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # the gateway may be gone: fall back to the text
            text = str(exc)
    return next((line.strip() for line in text.splitlines() if line.strip()), repr(exc))


def _range_bytes(
    directory: str, start: int | None, end: int | None, segment_size: int | None
) -> int:
    """The bytes of *directory*'s files in ``[start, end)``: what a read of that range plans
    to read (a listing, no file is opened)."""
    from trioha.pipeline._layout import read_layout

    try:
        layout = read_layout(directory, segment_size=segment_size)
    except (PipelineError, OSError):
        return 0
    lo = max(layout.min_offset, 0 if start is None else start)
    hi = layout.file_end if end is None else end
    return sum(max(0, min(s.end, hi) - max(s.start, lo)) for s in layout.segments)


def _scan_jobs(args: argparse.Namespace, last: str) -> Describe:
    """``export``/``stats``: a damage check, then *last*; both read the range."""
    nbytes = _range_bytes(args.directory, args.start_offset, args.end_offset, args.segment_size)

    def describe(description: str) -> tuple[str, int | None]:
        return ("damage check" if "damage" in description else last), nbytes

    return describe


_COMPARED = re.compile(r"compare (\d+) bytes")


def _audit_jobs(args: argparse.Namespace) -> Describe:
    """``audit``: the byte comparison (its description says how many bytes it compares),
    then with ``--verify-records`` a check of every record of every replica."""
    every = sum(
        _range_bytes(d, None, None, args.segment_size) for d in [args.master_dir, *args.slave_dirs]
    )

    def describe(description: str) -> tuple[str, int | None]:
        compared = _COMPARED.search(description)
        if compared is not None:
            return "compare", int(compared.group(1))
        if "every record" in description:
            return "verify records", every
        return "compare", None

    return describe


def _paths(args: argparse.Namespace) -> list[str]:
    if args.pipeline_command == "audit":
        return [args.master_dir, *args.slave_dirs]
    return [args.directory]


def _audit(args: argparse.Namespace) -> int:
    args.pipeline_command = "audit"
    if args.chunk_kib <= 0:
        print("trioha: error: --chunk-kib must be positive", file=sys.stderr)
        return 2

    def body(spark: SparkSession) -> tuple[int, str]:
        from trioha.pipeline._audit import audit_replicas

        report = audit_replicas(
            spark,
            args.master_dir,
            args.slave_dirs,
            chunk_bytes=args.chunk_kib * 1024,
            segment_size=args.segment_size,
            verify_records=args.verify_records,
        )
        return (0 if report.ok else 1), report.render()

    return _run(args, body, _audit_jobs(args))


def _export(args: argparse.Namespace) -> int:
    args.pipeline_command = "export"

    def body(spark: SparkSession) -> tuple[int, str]:
        from trioha.pipeline._export import export_parquet

        summary = export_parquet(
            spark,
            args.directory,
            args.out,
            mode=args.mode,
            start_offset=args.start_offset,
            end_offset=args.end_offset,
            segment_size=args.segment_size,
            allow_damage=args.allow_damage,
            engine=args.engine,
        )
        return (1 if summary.damage and not args.allow_damage else 0), summary.render()

    return _run(args, body, _scan_jobs(args, "write"))


def _stats(args: argparse.Namespace) -> int:
    args.pipeline_command = "stats"

    def body(spark: SparkSession) -> tuple[int, str]:
        from trioha.pipeline._export import log_stats

        stats = log_stats(
            spark,
            args.directory,
            start_offset=args.start_offset,
            end_offset=args.end_offset,
            segment_size=args.segment_size,
            engine=args.engine,
        )
        return (1 if stats.damage and not args.allow_damage else 0), stats.render()

    return _run(args, body, _scan_jobs(args, "count"))


def _dist(args: argparse.Namespace) -> int:
    from trioha.pipeline._dist import build_dist

    try:
        print(build_dist(args.out).render())
    except (PipelineError, OSError) as exc:
        print(f"trioha: error: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trioha.pipeline",
        description="trioha's Spark pipeline: audit replicas, export and count messages.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    register_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse *argv* (default ``sys.argv[1:]``) and run the command; returns the exit code."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    return handler(args)
