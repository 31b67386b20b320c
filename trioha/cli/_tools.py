"""Command line tools on trioha's own remoting client: ``namesrv``, ``put``, ``tail``, ``status``.

``register_commands(subparsers)`` adds them to ``python -m trioha``:

* ``namesrv [-c namesrv.properties] [--set KEY=VALUE] [--listen HOST:PORT] [--acl-file
  plain_acl.yml] [--tls-config tls.properties]``: a name server (default 127.0.0.1:9876) with
  RocketMQ's ``namesrv.properties`` settings (``trioha._config.NamesrvConfig``), and the ACL and
  TLS of docs/security.md;
* ``put --namesrv HOST:PORT --topic T [--count N] [--size B]``: send N messages to the
  topic's masters, round robin over the queues, one status line each;
* ``tail --namesrv HOST:PORT --topic T --group G``: consume every queue of the topic as group
  G from its committed offsets, print each message, commit offsets every 5 s; when a master
  is gone it reads from the slave (the route lists it);
* ``status HOST:PORT``: a broker's runtime figures (GET_BROKER_RUNTIME_INFO): role, offsets,
  slaves and their lag, metadata versions;
* ``failover-state -c broker.conf``: a failover group's keys as etcd has them;
* ``failover-elect -c broker.conf --broker-id ID [--timeout S]``: hand the group's master
  role to a chosen member of its SyncStateSet (docs/failover.md).

``put``, ``tail`` and ``status`` sign their requests with ``TRIOHA_ACCESS_KEY`` and
``TRIOHA_SECRET_KEY`` when those are set (the ACL, docs/security.md; ``status`` needs an admin
account), and speak TLS when ``TRIOHA_TLS=1`` (any server certificate) or ``TRIOHA_TLS_TRUST``
names the CA file to verify the server against. Secrets stay out of the process's arguments.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import trio

from trioha._config import DEFAULT_NAMESRV_PORT, BrokerConfig, NamesrvConfig, parse_address
from trioha._errors import ConfigError, RemotingError
from trioha.cli._shared import (
    add_config_options,
    add_metrics_option,
    address,
    require_prometheus_client,
    run,
)
from trioha.namesrv import serve_namesrv
from trioha.remoting import (
    DEFAULT_TOPIC_QUEUE_NUMS,
    BrokerRoute,
    RemotingClientPool,
    ResponseCode,
    TopicRoute,
    get_route,
    open_client_pool,
    pull_message,
    query_consumer_offset,
    runtime_info,
    send_message,
    update_consumer_offset,
)

if TYPE_CHECKING:
    from trioha.broker import HandoverOutcome
    from trioha.etcd import EtcdClient
    from trioha.failover import GroupKeys

log = logging.getLogger("trioha.cli")

#: Seconds a request may take before the tool gives up on it.
REQUEST_TIMEOUT = 10.0
#: Long-poll hold asked of the broker by ``tail`` (RocketMQ's push consumer uses 15 s).
TAIL_SUSPEND_MS = 15_000
COMMIT_INTERVAL = 5.0


def register_commands(subparsers: Any) -> None:
    """Add ``namesrv``, ``put``, ``tail`` and ``status`` to the ``trioha`` command."""
    namesrv = subparsers.add_parser("namesrv", help="run a RocketMQ name server")
    namesrv.add_argument(
        "--listen",
        type=address,
        metavar="HOST:PORT",
        help=f"listen address (default: listenHost and listenPort from -c, else "
        f"127.0.0.1:{DEFAULT_NAMESRV_PORT}; port 0 picks one)",
    )
    add_config_options(namesrv, "namesrv.properties", "serverChannelMaxIdleTimeSeconds=300")
    namesrv.add_argument(
        "--acl-file",
        type=Path,
        metavar="plain_acl.yml",
        help="check every request against this RocketMQ ACL file (reloaded when it changes): "
        "a valid signature always, an admin account for anything but reads",
    )
    namesrv.add_argument(
        "--tls-config",
        type=Path,
        metavar="tls.properties",
        help="RocketMQ TLS settings (tls.server.mode, tls.server.certPath, tls.server.keyPath, "
        "...) for the name server port",
    )
    add_metrics_option(namesrv)
    namesrv.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    namesrv.set_defaults(handler=_run_namesrv)

    put = subparsers.add_parser("put", help="send messages through a name server's routes")
    put.add_argument("--namesrv", type=address, required=True, metavar="HOST:PORT")
    put.add_argument("--topic", required=True)
    put.add_argument("--count", type=int, default=1, help="messages to send (default 1)")
    put.add_argument("--size", type=int, default=64, help="body size in bytes (default 64)")
    put.add_argument("--tags", help="tag of every message")
    put.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    put.set_defaults(handler=_run_put)

    tail = subparsers.add_parser("tail", help="consume a topic as a group and print messages")
    tail.add_argument("--namesrv", type=address, required=True, metavar="HOST:PORT")
    tail.add_argument("--topic", required=True)
    tail.add_argument("--group", required=True)
    tail.add_argument("--count", type=int, help="stop after this many messages")
    tail.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    tail.set_defaults(handler=_run_tail)

    status = subparsers.add_parser("status", help="a broker's role, offsets, slaves and lag")
    status.add_argument("broker", type=address, metavar="HOST:PORT", help="the broker port")
    status.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    status.set_defaults(handler=_run_status)

    state = subparsers.add_parser(
        "failover-state",
        help="a failover group's state as etcd has it: master, epoch, SyncStateSet, brokers",
    )
    add_config_options(state, "broker.conf", "failoverEtcdEndpoints=http://127.0.0.1:2379")
    state.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    state.set_defaults(handler=_run_failover_state)

    elect = subparsers.add_parser(
        "failover-elect",
        help="hand a failover group's master role to a chosen in-sync broker (mqadmin electMaster)",
    )
    add_config_options(elect, "broker.conf", "failoverEtcdEndpoints=http://127.0.0.1:2379")
    elect.add_argument(
        "--broker-id",
        type=int,
        required=True,
        metavar="ID",
        help="the failoverBrokerId of the broker to become master (a SyncStateSet member)",
    )
    elect.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds the master may stay fenced waiting for the target to catch up "
        "(default 5; the master caps it at haMaxTimeSlaveNotCatchup)",
    )
    elect.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    elect.set_defaults(handler=_run_failover_elect)


# --- namesrv ---------------------------------------------------------------------------------


def _run_namesrv(args: argparse.Namespace) -> int:
    from trioha.acl import PlainAcl, TlsAcceptor
    from trioha.namesrv import NamesrvProcessor

    require_prometheus_client(args)
    overrides: dict[str, Any] = {}
    if args.listen is not None:
        host, port = parse_address(args.listen, what="--listen")
        overrides.update(listen_host=host, listen_port=port)
    config = NamesrvConfig.from_properties(args.config, settings=args.settings, **overrides)
    acl = PlainAcl.load(args.acl_file) if args.acl_file else None
    tls = None
    if args.tls_config:
        tls = TlsAcceptor.for_config(
            BrokerConfig.from_properties(args.tls_config), what="name server"
        )

    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                processor = NamesrvProcessor(order_message_enable=config.order_message_enable)
                await nursery.start(
                    partial(
                        serve_namesrv,
                        config=config,
                        processor=processor,
                        setting="--listen" if args.listen else "listenHost/listenPort",
                        acl=acl,
                        tls=tls,
                    )
                )
                if args.metrics_listen is not None:
                    from trioha.metrics import NamesrvCollector, serve_metrics

                    await nursery.start(
                        serve_metrics, NamesrvCollector(processor), *args.metrics_listen
                    )
                if acl is not None:
                    nursery.start_soon(acl.watch)
                async for signum in signals:
                    log.info("%s received; stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

    run(main)
    return 0


def _open_pool() -> AbstractAsyncContextManager[RemotingClientPool]:
    """A client pool signing and speaking TLS as the environment says (module docstring)."""
    from trioha.acl import RequestSigner

    access_key, secret_key = (
        os.environ.get("TRIOHA_ACCESS_KEY"),
        os.environ.get("TRIOHA_SECRET_KEY"),
    )
    if access_key and not secret_key:
        raise ConfigError("TRIOHA_ACCESS_KEY is set but TRIOHA_SECRET_KEY is not")
    signer = RequestSigner(access_key, secret_key or "") if access_key else None
    trust = os.environ.get("TRIOHA_TLS_TRUST")
    context: ssl.SSLContext | None = None
    if trust or os.environ.get("TRIOHA_TLS") == "1":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # as RocketMQ: the chain is checked, not the host name
        if trust:
            try:
                context.load_verify_locations(trust)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"TRIOHA_TLS_TRUST={trust}: {exc}") from None
        else:
            context.verify_mode = ssl.CERT_NONE
    return open_client_pool(rpc_hook=signer, ssl_context=context)


# --- put -------------------------------------------------------------------------------------


async def put_messages(
    namesrv: str,
    topic: str,
    *,
    count: int,
    size: int,
    tags: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Send ``count`` messages; one line per status. Returns how many were not stored."""
    failed = 0
    async with _open_pool() as pool:
        route = await _route(pool, namesrv, topic, allow_missing=True)
        targets = _write_queues(route) if route else []
        if not targets:
            # A new topic: send through the brokers that auto-create from TBW102.
            # Like a Java producer, use at most defaultTopicQueueNums of its queues: the new
            # topic gets that many.
            template = await _route(pool, namesrv, "TBW102", allow_missing=True)
            targets = [
                t
                for t in (_write_queues(template) if template else [])
                if t[2] < DEFAULT_TOPIC_QUEUE_NUMS
            ]
        if not targets:
            raise RemotingError(f"no route to topic {topic} (nor TBW102) on name server {namesrv}")
        cycle = itertools.cycle(targets)
        for i in range(count):
            broker, address, queue_id = next(cycle)
            body = _body(i, size)
            try:
                with trio.fail_after(REQUEST_TIMEOUT):
                    result = await send_message(
                        pool,
                        address,
                        topic=topic,
                        body=body,
                        queue_id=queue_id,
                        tags=tags,
                        keys=f"trioha-{i}",
                    )
            except (RemotingError, trio.TooSlowError) as exc:
                failed += 1
                print(f"#{i} FAILED {broker}/{queue_id}: {exc or 'timeout'}", file=out, flush=True)
                continue
            stored = result.code in (0, 10, 11, 12)
            failed += not stored
            print(
                f"#{i} {result.status} {broker}/{result.queue_id} offset={result.queue_offset} "
                f"msgId={result.msg_id}",
                file=out,
                flush=True,
            )
    return failed


def _body(i: int, size: int) -> bytes:
    head = f"trioha message {i} ".encode()
    return (head * (size // len(head) + 1))[:size] if size > 0 else b""


def _write_queues(route: TopicRoute) -> list[tuple[str, str, int]]:
    return [
        (broker.broker_name, broker.master, queue_id)
        for broker in route.brokers
        if broker.master is not None
        for queue_id in range(broker.write_queue_nums)
    ]


async def _route(
    pool: RemotingClientPool, namesrv: str, topic: str, *, allow_missing: bool = False
) -> TopicRoute | None:
    try:
        with trio.fail_after(REQUEST_TIMEOUT):
            return await get_route(pool, namesrv, topic)
    except RemotingError as exc:
        if allow_missing and exc.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        raise
    except trio.TooSlowError:
        raise RemotingError(f"name server {namesrv} did not answer") from None


def _run_put(args: argparse.Namespace) -> int:
    failed = run(
        lambda: put_messages(
            args.namesrv, args.topic, count=args.count, size=args.size, tags=args.tags
        )
    )
    return 1 if failed else 0


# --- tail ------------------------------------------------------------------------------------


class _Tail:
    """A single consumer of every queue of a topic (no rebalancing with other members)."""

    def __init__(
        self,
        pool: RemotingClientPool,
        namesrv: str,
        topic: str,
        group: str,
        *,
        out: TextIO,
        limit: int | None,
        done: Callable[[], None],
    ) -> None:
        self.pool = pool
        self.namesrv = namesrv
        self.topic = topic
        self.group = group
        self.out = out
        self.limit = limit
        self.done = done
        self.printed = 0
        self.offsets: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.route: TopicRoute | None = None

    async def refresh(self) -> TopicRoute:
        self.route = await _route(self.pool, self.namesrv, self.topic)
        assert self.route is not None
        return self.route

    def address(self, broker_name: str) -> str | None:
        for broker in self.route.brokers if self.route else ():
            if broker.broker_name == broker_name:
                return broker.readable_address()
        return None

    async def run(self) -> None:
        route = await self.refresh()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.commit_loop)
            for broker in route.brokers:
                for queue_id in range(broker.read_queue_nums):
                    nursery.start_soon(self.follow, broker, queue_id)

    async def follow(self, broker: BrokerRoute, queue_id: int) -> None:
        key = (broker.broker_name, queue_id)
        while True:
            address = self.address(broker.broker_name)
            try:
                if address is None:
                    raise RemotingError(f"no address for broker {broker.broker_name}")
                if key not in self.offsets:
                    with trio.fail_after(REQUEST_TIMEOUT):
                        found = await query_consumer_offset(
                            self.pool,
                            address,
                            group=self.group,
                            topic=self.topic,
                            queue_id=queue_id,
                        )
                    self.offsets[key] = self.committed[key] = found or 0
                with trio.fail_after(REQUEST_TIMEOUT + TAIL_SUSPEND_MS / 1000):
                    result = await pull_message(
                        self.pool,
                        address,
                        group=self.group,
                        topic=self.topic,
                        queue_id=queue_id,
                        offset=self.offsets[key],
                        suspend_ms=TAIL_SUSPEND_MS,
                    )
            except (RemotingError, trio.TooSlowError) as exc:
                log.warning("%s/%d: %s; retrying with a fresh route", *key, exc or "timeout")
                await trio.sleep(1)
                try:
                    await self.refresh()
                except RemotingError as route_error:
                    log.warning("route refresh failed: %s", route_error)
                continue
            for message in result.messages:
                body = message.body.decode("utf-8", "replace")
                print(
                    f"{broker.broker_name}/{queue_id}@{message.queue_offset} "
                    f"tags={message.tags or ''} keys={message.keys or ''}: {body}",
                    file=self.out,
                    flush=True,
                )
                self.printed += 1
                if self.limit is not None and self.printed >= self.limit:
                    self.offsets[key] = message.queue_offset + 1
                    await self.commit()
                    self.done()
                    return
            # Past the messages (and whatever the filter skipped), or where the broker
            # says to go (PULL_OFFSET_MOVED); unchanged when nothing is there yet.
            self.offsets[key] = result.next_begin_offset
            if result.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
                await trio.sleep(0.1)  # e.g. a slave behind the consumer: do not spin

    async def commit(self) -> None:
        for key, offset in list(self.offsets.items()):
            if self.committed.get(key) == offset:
                continue
            address = self.address(key[0])
            if address is None:
                continue
            try:
                with trio.fail_after(REQUEST_TIMEOUT):
                    await update_consumer_offset(
                        self.pool,
                        address,
                        group=self.group,
                        topic=self.topic,
                        queue_id=key[1],
                        offset=offset,
                    )
                self.committed[key] = offset
            except (RemotingError, trio.TooSlowError) as exc:
                log.warning("commit of %s/%d failed: %s", *key, exc or "timeout")

    async def commit_loop(self) -> None:
        try:
            while True:
                await trio.sleep(COMMIT_INTERVAL)
                await self.commit()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(REQUEST_TIMEOUT):
                await self.commit()


async def tail_messages(
    namesrv: str, topic: str, group: str, *, count: int | None = None, out: TextIO = sys.stdout
) -> int:
    """Consume and print until cancelled (or ``count`` messages); returns how many printed."""
    async with _open_pool() as pool, trio.open_nursery() as nursery:
        tail = _Tail(
            pool, namesrv, topic, group, out=out, limit=count, done=nursery.cancel_scope.cancel
        )
        nursery.start_soon(tail.run)
    return tail.printed


def _run_tail(args: argparse.Namespace) -> int:
    async def main() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def consume() -> None:
                    await tail_messages(args.namesrv, args.topic, args.group, count=args.count)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(consume)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    run(main)
    return 0


# --- status ----------------------------------------------------------------------------------


async def broker_status(broker: str, *, out: TextIO = sys.stdout) -> dict[str, str]:
    """Print and return a broker's runtime table."""
    async with _open_pool() as pool:
        with trio.fail_after(REQUEST_TIMEOUT):
            table = await runtime_info(pool, broker)
    width = max((len(k) for k in table), default=0)
    for key in sorted(table):
        print(f"{key.ljust(width)}  {table[key]}", file=out)
    return table


def _group_of(config: BrokerConfig, command: str) -> GroupKeys:
    """The failover group *config* names (its etcd endpoints must be set)."""
    from trioha.failover import GroupKeys

    if not config.failover_etcd_endpoints:
        raise ConfigError(f"{command} needs failoverEtcdEndpoints (in -c or --set)")
    try:
        return GroupKeys.of(
            config.broker_cluster_name, config.broker_name, root=config.failover_etcd_root
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _open_group_etcd(config: BrokerConfig) -> AbstractAsyncContextManager[EtcdClient]:
    from trioha.etcd import open_etcd_client

    return open_etcd_client(
        config.failover_etcd_endpoints or "",  # _group_of refused a config without them
        user=config.failover_etcd_user,
        password=config.failover_etcd_password,
    )


async def failover_state(config: BrokerConfig, *, out: TextIO = sys.stdout) -> list[str]:
    """Print and return a failover group's state, read from the etcd *config* names."""
    from trioha.broker import describe_group, read_group

    keys = _group_of(config, "failover-state")
    async with _open_group_etcd(config) as client:
        revision, view = await read_group(client, keys)
    lines = describe_group(keys, revision, view)
    for line in lines:
        print(line, file=out)
    return lines


def _run_failover_state(args: argparse.Namespace) -> int:
    config = BrokerConfig.from_properties(args.config, settings=args.settings)
    run(lambda: failover_state(config))
    return 0


async def failover_elect(
    config: BrokerConfig, broker_id: int, *, catch_up: float = 5.0, out: TextIO = sys.stdout
) -> HandoverOutcome:
    """Hand the master role of *config*'s group to broker *broker_id* and print one line
    (``trioha.broker.hand_over``; a refusal raises :class:`HandoverRefusedError`)."""
    from trioha.broker import hand_over

    keys = _group_of(config, "failover-elect")
    if broker_id < 1:
        raise ConfigError(f"--broker-id must be a failover broker id (1 and up), got {broker_id}")
    if not 0 < catch_up <= 3600:
        raise ConfigError(f"--timeout must be between 0 and 3600 seconds, got {catch_up:g}")
    async with _open_group_etcd(config) as client:
        done = await hand_over(
            client, keys, broker_id, catch_up=catch_up, lease_ttl=config.failover_lease_ttl
        )
    if done.already:
        line = f"broker {done.master_id} is master of epoch {done.epoch} already; nothing to do"
    else:
        line = (
            f"broker {done.master_id} is master of epoch {done.epoch} (was broker "
            f"{done.old_master_id} at epoch {done.old_epoch}), handed over in {done.seconds:.2f} s"
        )
    print(f"failover-elect: {line}", file=out)
    return done


def _run_failover_elect(args: argparse.Namespace) -> int:
    config = BrokerConfig.from_properties(args.config, settings=args.settings)
    run(lambda: failover_elect(config, args.broker_id, catch_up=args.timeout))
    return 0


def _run_status(args: argparse.Namespace) -> int:
    try:
        run(lambda: broker_status(args.broker))
    except trio.TooSlowError:
        raise RemotingError(
            f"broker {args.broker} did not answer in {REQUEST_TIMEOUT:g} s"
        ) from None
    return 0
