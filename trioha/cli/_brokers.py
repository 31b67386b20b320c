"""``python -m trioha master`` and ``slave``: a broker from flags and ``broker.conf``, served
until Ctrl-C or SIGTERM (RocketMQ's ``mqbroker``)."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from typing import Any

import trio

from trioha._config import BrokerConfig, BrokerRole, parse_address
from trioha._errors import ConfigError
from trioha.cli._report import BrokerReport
from trioha.cli._shared import (
    add_config_options,
    add_metrics_option,
    address,
    require_prometheus_client,
    size,
)
from trioha.store import FlushDiskType

log = logging.getLogger("trioha")


def register_commands(sub: Any) -> None:
    """Add ``master`` and ``slave`` to the ``trioha`` command."""
    master = sub.add_parser("master", help="run a master broker (serves slaves on its HA port)")
    _add_broker_options(master)
    master.add_argument(
        "--ha-listen",
        type=address,
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
        "--accept-lost-acknowledged",
        action="store_true",
        help="start even though recovery ended below messages this master answered "
        "PUT_OK and sent to slaves (ha_accept_lost_acknowledged): they are discarded, and "
        "slaves holding them are refused (docs/replication.md)",
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
        type=address,
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
    slave.add_argument(
        "--truncate-to",
        type=int,
        metavar="OFFSET",
        help="cut a stopped store back to OFFSET (a message boundary; kept in lost+found), "
        "then exit: for a store its master's refusal left no record in, such as a Java "
        "RocketMQ slave's (the master's log names the offset)",
    )
    slave.set_defaults(handler=_run_slave)


def _add_broker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store-dir",
        type=Path,
        help="store root (commitlog/ inside); default: storePathRootDir from -c",
    )
    p.add_argument(
        "--mapped-file-size",
        type=size,
        metavar="BYTES",
        help="commit log segment size (mappedFileSizeCommitLog; default 1G)",
    )
    p.add_argument("--flush-disk-type", choices=[t.value for t in FlushDiskType])
    p.add_argument(
        "--listen",
        type=address,
        metavar="HOST:PORT",
        help="broker port for RocketMQ clients (default 127.0.0.1:10911)",
    )
    p.add_argument(
        "--namesrv",
        type=address,
        metavar="HOST:PORT",
        help="name server to register with (namesrvAddr)",
    )
    add_config_options(p, "broker.conf", "haSendHeartbeatInterval=5000")
    add_metrics_option(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


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
    if args.accept_lost_acknowledged:
        extra["ha_accept_lost_acknowledged"] = True
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
    if args.truncate_to_master and args.truncate_to is not None:
        raise ConfigError("give --truncate-to-master or --truncate-to OFFSET, not both")
    if args.truncate_to_master:
        from trioha.cli._reseed import truncate_to_master

        print(truncate_to_master(config))
        return 0
    if args.truncate_to is not None:
        from trioha.cli._reseed import truncate_to_offset

        print(truncate_to_offset(config, args.truncate_to))
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


async def _report_progress(broker: Any) -> None:
    report = BrokerReport()
    while True:
        await trio.sleep(1)
        report.tick(broker.statistics())
