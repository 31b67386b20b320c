"""Command line: ``python -m trioha COMMAND``.

Every bad flag or file becomes one line on stderr and a non-zero exit; Ctrl-C and SIGTERM stop a
running broker cleanly (its store closed, the ``abort`` marker removed). Exit codes are listed in
:data:`EXIT_CODES` (shown under every command's ``--help`` and in docs/operations.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any

from trioha._errors import TriohaError
from trioha._logging import FORMATS, configure_logging
from trioha.cli import _brokers, _demo, _tools
from trioha.cli._shared import CommandParser
from trioha.pipeline import register_commands as register_pipeline_commands

Handler = Callable[[argparse.Namespace], int]


def _version() -> str:
    """The installed distribution's version (the one pyproject.toml names)."""
    try:
        return importlib.metadata.version("trioha")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


#: What ``python -m trioha`` returns.
EXIT_CODES = (
    (0, "success; a server stopped cleanly by Ctrl-C or SIGTERM"),
    (1, "a runtime or configuration error (one line on stderr), or a `put` that was not stored"),
    (2, "a usage error: an unknown flag, a bad value, no command"),
    (130, "interrupted by Ctrl-C outside a server's clean stop"),
)

#: The pipeline's commands (``audit``, ``export``, ``stats``) report every error with 2.
PIPELINE_EXIT_CODES = (
    (0, "success (audit: the replicas agree)"),
    (1, "audit: the replicas differ or a record is damaged"),
    (2, "a usage error, or any error the command reports (a store it cannot read, Spark)"),
    (130, "interrupted by Ctrl-C"),
)

#: Per command: what it does (the help's description) and an example (its epilog).
COMMAND_HELP: dict[str, tuple[str, str]] = {
    "master": (
        "Run a master broker: RocketMQ clients on its broker port, slaves on its HA port. "
        "A SYNC_MASTER answers a put once a slave holds it; an ASYNC_MASTER at once.",
        "trioha master --store-dir /var/lib/trioha/m --role SYNC_MASTER "
        "--listen 0.0.0.0:10911 --ha-listen 0.0.0.0:10912 --namesrv ns:9876 "
        "--metrics-listen 9100",
    ),
    "slave": (
        "Run a slave broker replicating a master's commit log over the HA port (catching up "
        "from wherever its store ends) and serving reads.",
        "trioha slave --store-dir /var/lib/trioha/s --master-ha master:10912 "
        "--listen 0.0.0.0:10921 --namesrv ns:9876 --metrics-listen 9101",
    ),
    "namesrv": (
        "Run a RocketMQ name server: brokers register their topics, clients ask it for routes.",
        "trioha namesrv -c /etc/trioha/namesrv.properties --listen 0.0.0.0:9876 "
        "--metrics-listen 9102",
    ),
    "put": (
        "Send messages to a topic's masters through a name server's routes, one status line "
        "per message (SEND_OK, FLUSH_SLAVE_TIMEOUT, ...).",
        "trioha put --namesrv 127.0.0.1:9876 --topic Orders --count 10 --size 256",
    ),
    "tail": (
        "Consume every queue of a topic as a consumer group from its committed offsets and "
        "print each message; offsets are committed every 5 s.",
        "trioha tail --namesrv 127.0.0.1:9876 --topic Orders --group audit --count 100",
    ),
    "status": (
        "Print a broker's runtime figures (GET_BROKER_RUNTIME_INFO): role, offsets, slaves "
        "and their lag, metadata versions.",
        "trioha status 127.0.0.1:10911",
    ),
    "demo": (
        "Run a SYNC_MASTER and a slave on loopback, put a workload through them and report "
        "throughput and latency.",
        "trioha demo --messages 20000 --size 1K --producers 16",
    ),
    "failover-state": (
        "Print a failover group's state as etcd has it (docs/failover.md): the master and "
        "its epoch, the epoch counter, the SyncStateSet and every live broker's log end.",
        "trioha failover-state -c /etc/trioha/broker-a-1.conf",
    ),
    "failover-elect": (
        "Hand a failover group's master role to a chosen broker of its SyncStateSet "
        "(docs/failover.md, RocketMQ's mqadmin electMaster): the master stops acknowledging, "
        "waits until the target holds its whole log and gives it the master key; prints the "
        "new master, its epoch and the time taken, or exits 1 with the reason for a refusal.",
        "trioha failover-elect -c /etc/trioha/broker-a-1.conf --broker-id 2",
    ),
    # The pipeline's commands carry their own descriptions; these add the examples.
    "audit": ("", "trioha audit /var/lib/trioha/m /var/lib/trioha/s1 /var/lib/trioha/s2"),
    "export": ("", "trioha export /var/lib/trioha/m /data/orders-parquet --mode overwrite"),
    "stats": ("", "trioha stats /var/lib/trioha/m"),
}


def _epilog(example: str, exit_codes: tuple[tuple[int, str], ...] = EXIT_CODES) -> str:
    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in exit_codes)
    return f"example:\n  {example}\n\nexit codes:\n{codes}"


def _finish_commands(sub: Any) -> None:
    """Give every command a description, an example, the exit codes and ``--log-format``."""
    for name, p in sub.choices.items():
        description, example = COMMAND_HELP.get(name, (None, f"trioha {name} --help"))
        if description and not p.description:
            p.description = description
        if not p.epilog:
            pipeline = name in {"audit", "export", "stats"}
            p.epilog = _epilog(example, PIPELINE_EXIT_CODES if pipeline else EXIT_CODES)
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.add_argument(
            "--log-format",
            choices=FORMATS,
            default="text",
            help="log lines as plain text (default) or one JSON object per line",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="trioha",
        description="RocketMQ master-slave HA replication on Trio, wire- and disk-compatible.",
        epilog=_epilog("trioha master --help"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trioha {_version()}")
    sub: Any = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    # In the order ``--help`` lists them: the brokers, the demo, the pipeline, the tools.
    _brokers.register_commands(sub)
    _demo.register_commands(sub)
    register_pipeline_commands(sub)
    _tools.register_commands(sub)

    _finish_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        sys.exit(2)
    configure_logging(verbose=getattr(args, "verbose", False), fmt=args.log_format)
    handler: Handler = args.handler
    try:
        code = handler(args)
    except KeyboardInterrupt:
        code = 130
    except (TriohaError, OSError, BaseExceptionGroup) as exc:
        error = _trioha_error(exc)
        if error is None:
            raise
        print(f"trioha {args.command}: error: {error_line(error)}", file=sys.stderr)
        code = 1
    sys.exit(code)


def _trioha_error(exc: BaseException) -> TriohaError | OSError | None:
    """The error behind *exc* worth one line: a TriohaError, else an OSError (a start-up
    failure: a file, a socket), looking inside the groups Trio's nurseries raise."""
    if isinstance(exc, TriohaError | OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [_trioha_error(inner) for inner in exc.exceptions]
        for error in found:
            if isinstance(error, TriohaError):
                return error
        for error in found:
            if error is not None:
                return error
    return None


def error_line(error: BaseException) -> str:
    """*error* as one line, with the OSError behind it when its message does not say it."""
    if isinstance(error, OSError) and not isinstance(error, TriohaError):
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror or error}{where}"
    text = str(error)
    cause = error.__cause__
    if isinstance(cause, OSError) and cause.strerror and cause.strerror not in text:
        text = f"{text} (caused by: {cause.strerror})"
    return text
