"""Command line: ``python -m trioha COMMAND``.

Every bad flag or file becomes one line on stderr and a non-zero exit; Ctrl-C and SIGTERM stop a
running broker cleanly (its store closed, the ``abort`` marker removed). Exit codes are listed in
:data:`EXIT_CODES` (shown under every command's ``--help`` and in docs/operations.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from trioha._config import BrokerConfig, BrokerRole, FlushDiskType, parse_address
from trioha._errors import ConfigError, TriohaError
from trioha._logging import FORMATS, configure_logging

log = logging.getLogger("trioha")

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, not the whole usage
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (binary)."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1073741824 or 64M)") from None


def _addr(text: str) -> str:
    try:
        parse_address(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _version() -> str:
    """The installed distribution's version (the one pyproject.toml names)."""
    try:
        return importlib.metadata.version("trioha")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"not key=value: {text!r} (a key of the -c file, e.g. --set "
            "serverChannelMaxIdleTimeSeconds=120)"
        )
    return key.strip(), value.strip()


def add_config_options(p: argparse.ArgumentParser, file: str, example: str) -> None:
    """``-c FILE`` and ``--set KEY=VALUE``, as a broker and a name server take them."""
    p.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar=file,
        help=f"a RocketMQ {file} (camelCase keys); flags override it",
    )
    p.add_argument(
        "--set",
        dest="settings",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"set any {file} key (camelCase, e.g. --set {example}); repeatable; applied "
        "after -c, the flags above win",
    )


def metrics_address(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` for ``--metrics-listen``; a bare port listens on 127.0.0.1 only."""
    if ":" not in text:
        text = f"127.0.0.1:{text}"
    try:
        return parse_address(text, what="--metrics-listen")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_metrics_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-listen",
        type=metrics_address,
        metavar="[HOST:]PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (off by default; "
        "127.0.0.1 when no host; needs the metrics extra)",
    )


def require_prometheus_client(args: argparse.Namespace) -> None:
    """Fail before starting anything when ``--metrics-listen`` cannot be honoured."""
    if getattr(args, "metrics_listen", None) is None:
        return
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--metrics-listen needs prometheus-client: pip install 'trioha[metrics]'"
        ) from None


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


def _add_broker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store-dir",
        type=Path,
        help="store root (commitlog/ inside); default: storePathRootDir from -c",
    )
    p.add_argument(
        "--mapped-file-size",
        type=_size,
        metavar="BYTES",
        help="commit log segment size (mappedFileSizeCommitLog; default 1G)",
    )
    p.add_argument("--flush-disk-type", choices=[t.value for t in FlushDiskType])
    p.add_argument(
        "--listen",
        type=_addr,
        metavar="HOST:PORT",
        help="broker port for RocketMQ clients (default 127.0.0.1:10911)",
    )
    p.add_argument(
        "--namesrv",
        type=_addr,
        metavar="HOST:PORT",
        help="name server to register with (namesrvAddr)",
    )
    add_config_options(p, "broker.conf", "haSendHeartbeatInterval=5000")
    add_metrics_option(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="trioha",
        description="RocketMQ master-slave HA replication on Trio, wire- and disk-compatible.",
        epilog=_epilog("trioha master --help"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trioha {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    master = sub.add_parser("master", help="run a master broker (serves slaves on its HA port)")
    _add_broker_options(master)
    master.add_argument(
        "--ha-listen",
        type=_addr,
        metavar="HOST:PORT",
        help="HA listen address (default 127.0.0.1:10912; port 0 picks one)",
    )
    master.add_argument("--role", choices=["SYNC_MASTER", "ASYNC_MASTER"])
    master.add_argument(
        "--sync-from-oldest",
        action="store_true",
        help="serve a slave reporting 0 from the oldest offset (a full copy), "
        "not the last segment (ha_sync_from_oldest)",
    )
    master.add_argument(
        "--accept-damaged-log",
        action="store_true",
        help="start even though recovery cut bytes that had been flushed "
        "(damage); slaves holding them are refused (docs/replication.md)",
    )
    master.add_argument(
        "--embedded-namesrv",
        action="store_true",
        help="also run a name server on 127.0.0.1:9876 for a one-command setup",
    )
    master.set_defaults(handler=_run_master)

    slave = sub.add_parser("slave", help="run a slave broker replicating from a master")
    _add_broker_options(slave)
    slave.add_argument(
        "--master-ha",
        type=_addr,
        metavar="HOST:PORT",
        help="the master's HA address (haMasterAddress)",
    )
    slave.add_argument(
        "--ack-flushed",
        action="store_true",
        help="ack only what is flushed to disk (ha_slave_ack_flushed)",
    )
    slave.add_argument(
        "--truncate-to-master",
        action="store_true",
        help="cut a slave its master refused back to where their histories "
        "part (kept in lost+found), then exit (docs/replication.md)",
    )
    slave.set_defaults(handler=_run_slave)

    demo = sub.add_parser("demo", help="run a master and a slave on loopback with a sync workload")
    demo.add_argument(
        "--messages", type=int, help="messages to put (default 20000; 200 with --failover)"
    )
    demo.add_argument("--size", type=_size, default=1024, help="body size (default 1K)")
    demo.add_argument("--producers", type=int, default=16, help="concurrent producers")
    demo.add_argument(
        "--mapped-file-size",
        type=_size,
        default=8 << 20,
        help="segment size (default 8M, so the workload spans segments)",
    )
    demo.add_argument("--dir", type=Path, help="keep the stores here instead of a temp dir")
    demo.add_argument(
        "--failover",
        action="store_true",
        help="automatic failover instead: etcd, a name server and three broker processes of "
        "one group; the master is killed halfway (docs/failover.md; --messages 200 fits)",
    )
    demo.add_argument(
        "--lease-ttl", type=int, default=3, help="with --failover: the etcd lease (seconds)"
    )
    demo.set_defaults(handler=_run_demo)

    for module in ("trioha.pipeline._cli", "trioha._clitools"):
        try:
            register = __import__(module, fromlist=["register_commands"]).register_commands
        except (ImportError, AttributeError):
            continue
        register(sub)
    _finish_commands(sub)
    return parser


def _broker_config(args: argparse.Namespace, role: BrokerRole | None, **extra: Any) -> BrokerConfig:
    settings: list[tuple[str, str]] = args.settings
    if (
        args.store_dir is None
        and args.config is None
        and not any(key == "storePathRootDir" for key, _ in settings)
    ):
        raise ConfigError("a broker needs --store-dir DIR or -c broker.conf (storePathRootDir)")
    overrides: dict[str, Any] = {}
    if args.store_dir is not None:
        overrides["store_path_root_dir"] = str(args.store_dir)
    if role is not None:
        overrides["broker_role"] = role
    if args.mapped_file_size is not None:
        overrides["mapped_file_size_commit_log"] = args.mapped_file_size
    if args.flush_disk_type is not None:
        overrides["flush_disk_type"] = FlushDiskType(args.flush_disk_type)
    if args.listen is not None:
        host, port = parse_address(args.listen, what="--listen")
        overrides.update(broker_ip1=host, listen_port=port)
    if args.namesrv is not None:
        overrides["namesrv_addr"] = args.namesrv
    overrides.update({k: v for k, v in extra.items() if v is not None})
    return BrokerConfig.from_properties(args.config, settings=settings, **overrides)


def _run_master(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {}
    if args.ha_listen is not None:
        host, port = parse_address(args.ha_listen, what="--ha-listen")
        extra.update(ha_listen_host=host, ha_listen_port=port)
    if args.embedded_namesrv:
        extra["embedded_namesrv"] = True
    if args.sync_from_oldest:
        extra["ha_sync_from_oldest"] = True
    if args.accept_damaged_log:
        extra["ha_accept_damaged_log"] = True
    role = BrokerRole(args.role) if args.role else None
    config = _broker_config(args, role, **extra)
    if not config.broker_role.is_master and not config.failover:
        raise ConfigError(f"{args.config}: brokerRole is SLAVE; use `trioha slave` for a slave")
    require_prometheus_client(args)
    trio.run(_serve, config, args.metrics_listen, args.config)
    return 0


def _run_slave(args: argparse.Namespace) -> int:
    config = _broker_config(
        args,
        BrokerRole.SLAVE,
        ha_master_address=args.master_ha,
        ha_slave_ack_flushed=True if args.ack_flushed else None,
    )
    if args.truncate_to_master:
        from trioha._reseed import truncate_to_master

        print(truncate_to_master(config))
        return 0
    if config.ha_master is None and not config.failover:
        raise ConfigError("a slave needs --master-ha HOST:PORT (or haMasterAddress in -c)")
    require_prometheus_client(args)
    trio.run(_serve, config, args.metrics_listen, args.config)
    return 0


async def _serve(
    config: BrokerConfig,
    metrics: tuple[str, int] | None = None,
    config_file: Path | None = None,
) -> None:
    from trioha._tuning import tune_gc_for_serving
    from trioha.broker import open_broker

    tune_gc_for_serving()

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with (
            open_broker(config, config_file=config_file) as broker,
            trio.open_nursery() as nursery,
        ):
            if metrics is not None:
                from trioha.metrics import BrokerCollector, serve_metrics

                await nursery.start(serve_metrics, BrokerCollector(broker), *metrics)
            nursery.start_soon(_report_progress, broker)
            async for signum in signals:
                log.info("%s received; stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


#: Bytes behind the master's end from which a slave reports catch-up progress.
CATCH_UP_BYTES = 1 << 20
#: Seconds between plain status lines (RocketMQ logs 'Slave fall behind master' every 60 s).
REPORT_INTERVAL = 10.0


class BrokerReport:
    """What a running broker logs: a slave's catch-up as progress (bytes, rate, ETA from the
    master's end), otherwise lag or state lines every ``interval`` seconds."""

    def __init__(
        self,
        *,
        interval: float = REPORT_INTERVAL,
        clock: Callable[[], float] | None = None,
        terminal: bool | None = None,
    ) -> None:
        import time

        self.interval = interval
        self.clock = clock or time.monotonic
        self.terminal = terminal
        self.catch_up: Any = None  # a trioha._progress.Progress while catching up
        self._from = 0
        self._last_line = self.clock()

    def tick(self, stats: Any) -> None:
        """Look at one ``statistics()`` snapshot (called about once a second)."""
        client = stats.client
        behind = getattr(client, "behind_bytes", None) if client is not None else None
        if (
            self.catch_up is None
            and behind is not None
            and behind >= CATCH_UP_BYTES
            and client.connected
        ):
            from trioha._progress import Progress

            self._from = stats.max_offset
            self.catch_up = Progress(
                "slave catch-up",
                total=behind,
                unit="B",
                interval=self.interval,
                clock=self.clock,
                terminal=self.terminal,
            )
        if self.catch_up is not None:
            assert client is not None
            master_end = max(client.master_end or 0, stats.max_offset)
            self.catch_up.set(stats.max_offset - self._from, total=master_end - self._from)
            if behind is None or behind < CATCH_UP_BYTES or not client.connected:
                self.catch_up.close()
                self.catch_up = None
                log.info(
                    "slave caught up with master %s at %d"
                    if client.connected
                    else "slave catch-up interrupted (master %s) at %d",
                    client.master,
                    stats.max_offset,
                    extra={"peer": client.master, "offset": stats.max_offset},
                )
            self._last_line = self.clock()
            return
        now = self.clock()
        if now - self._last_line < self.interval:
            return
        self._last_line = now
        self.state_lines(stats)

    def state_lines(self, stats: Any) -> None:
        if stats.ha is not None:
            for slave in stats.ha.slaves:
                log.info(
                    "slave %s acked %d, behind by %d bytes, %.3f s",
                    slave.peer,
                    slave.ack_offset,
                    slave.lag,
                    slave.behind_seconds or 0.0,
                    extra={
                        "peer": slave.peer,
                        "offset": slave.ack_offset,
                        "behind_bytes": slave.lag,
                        "behind_seconds": slave.behind_seconds,
                    },
                )
            if not stats.ha.slaves:
                log.info(
                    "no slave connected; log ends at %d",
                    stats.max_offset,
                    extra={"offset": stats.max_offset},
                )
        elif stats.client is not None and stats.client.needs_reseed:
            log.error(
                "not replicating: diverged from master %s at %d (this slave holds up to "
                "%d); run `trioha slave --truncate-to-master` or re-seed",
                stats.client.master,
                stats.client.diverged_master_offset,
                stats.client.diverged_slave_offset,
                extra={"peer": stats.client.master, "reason": "diverged"},
            )
        elif stats.client is not None:
            state = "connected to" if stats.client.connected else "waiting for"
            behind = stats.client.behind_bytes
            seconds = getattr(stats.client, "behind_seconds", None)
            tail = "" if behind is None else f", {behind} bytes behind"
            if behind is not None and seconds is not None:
                tail += f" ({seconds:.1f} s)"
            log.info(
                "%s master %s; log ends at %d%s",
                state,
                stats.client.master,
                stats.max_offset,
                tail,
                extra={
                    "peer": stats.client.master,
                    "offset": stats.max_offset,
                    "state": stats.client.state,
                    "behind_bytes": behind,
                    "behind_seconds": seconds,
                },
            )


async def _report_progress(broker: Any) -> None:
    report = BrokerReport()
    while True:
        await trio.sleep(1)
        report.tick(broker.statistics())


def _run_demo(args: argparse.Namespace) -> int:
    from trioha._demo import run_demo, run_failover_demo

    if args.messages is None:
        args.messages = 200 if args.failover else 20000
    return trio.run(run_failover_demo if args.failover else run_demo, args)


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
