"""``python -m trioha demo``: a SYNC_MASTER and a slave on loopback, a workload, a verdict.

The README's main job. It starts both brokers in this process on OS-chosen loopback ports,
puts a sync workload through the master with a progress line, waits for the slave to catch
up, compares the two commit logs byte for byte and prints the figures.

``demo --failover`` shows automatic failover (docs/failover.md): a one-member etcd, a name
server and three ``python -m trioha master -c`` processes of one group on loopback, sync
sends through trioha's client, the master killed with SIGKILL halfway; it prints the time to
the first acknowledged send on the new master, the acked count and the verdict.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import attrs
import trio

from trioha._config import BrokerConfig, BrokerRole
from trioha._errors import RemotingError
from trioha._status import PutStatus
from trioha.broker import producer_properties
from trioha.cli._shared import size
from trioha.store import NewMessage

if TYPE_CHECKING:
    from trioha.broker import Broker
    from trioha.remoting import RemotingClientPool
    from trioha.store import CommitLog


def register_commands(sub: Any) -> None:
    """Add ``demo`` to the ``trioha`` command."""
    demo = sub.add_parser("demo", help="run a master and a slave on loopback with a sync workload")
    demo.add_argument(
        "--messages", type=int, help="messages to put (default 20000; 200 with --failover)"
    )
    demo.add_argument("--size", type=size, default=1024, help="body size (default 1K)")
    demo.add_argument("--producers", type=int, default=16, help="concurrent producers")
    demo.add_argument(
        "--mapped-file-size",
        type=size,
        default=8 << 20,
        help="segment size (default 8M, so the workload spans segments)",
    )
    demo.add_argument("--dir", type=Path, help="keep the stores here instead of a temp dir")
    demo.add_argument(
        "--failover",
        action="store_true",
        help="automatic failover instead: etcd, a name server and three broker processes of "
        "one group; the master is killed halfway (docs/failover.md)",
    )
    demo.add_argument(
        "--lease-ttl", type=int, default=3, help="with --failover: the etcd lease (seconds)"
    )
    demo.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.messages is None:
        args.messages = 200 if args.failover else 20000
    return trio.run(run_failover_demo if args.failover else run_demo, args)


def compare_logs(master: Broker, slave: Broker) -> int | None:
    """The first offset where the two logs differ over the master's range, or None."""
    mlog, slog = master.store.commitlog, slave.store.commitlog
    if slog.min_offset != mlog.min_offset or slog.max_offset != mlog.max_offset:
        return max(mlog.min_offset, min(mlog.max_offset, slog.max_offset))
    return first_difference(mlog, slog)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_demo(args: argparse.Namespace) -> int:
    base = args.dir or Path(tempfile.mkdtemp(prefix="trioha-demo-"))
    try:
        return await _demo(args, base)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


async def _demo(args: argparse.Namespace, base: Path) -> int:
    from trioha.broker import open_broker  # the broker loads when a demo runs, not for --help

    out = sys.stdout
    common = {
        "mapped_file_size_commit_log": args.mapped_file_size,
        "ha_listen_port": 0,
        "listen_port": 0,
    }
    master_cfg = BrokerConfig(
        broker_role=BrokerRole.SYNC_MASTER, store_path_root_dir=str(base / "master"), **common
    )
    print(f"trioha demo: stores under {base}", file=out)
    async with open_broker(master_cfg) as master:
        assert master.ha_address is not None and master.ha_service is not None
        host, port = master.ha_address
        slave_cfg = BrokerConfig(
            broker_role=BrokerRole.SLAVE,
            store_path_root_dir=str(base / "slave"),
            ha_master_address=f"{host}:{port}",
            **common,
        )
        async with open_broker(slave_cfg) as slave:
            print(f"master (SYNC_MASTER) HA on {host}:{port}; slave connecting", file=out)
            if not await master.ha_service.wait_connections(1, trio.current_time() + 10):
                print("the slave did not connect within 10 s", file=out)
                return 1
            statuses: Counter[PutStatus] = Counter()
            latencies: list[float] = []
            body = bytes(range(256)) * (args.size // 256) + bytes(args.size % 256)
            remaining = iter(range(args.messages))

            async def producer(pid: int) -> None:
                for i in remaining:
                    t0 = time.perf_counter()
                    result = await master.put(
                        NewMessage(
                            "TriohaDemo",
                            body,
                            queue_id=pid % 4,
                            properties=producer_properties(tags=f"T{i % 4}", keys=f"k{i}"),
                        )
                    )
                    latencies.append(time.perf_counter() - t0)
                    statuses[result.status] += 1

            async def progress() -> None:
                while True:
                    await trio.sleep(0.5)
                    done = sum(statuses.values())
                    lag = master.store.commitlog.max_offset - slave.store.commitlog.max_offset
                    print(
                        f"\r  {done:>8}/{args.messages} puts, slave behind by {lag:>9} bytes",
                        end="",
                        file=out,
                        flush=True,
                    )

            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(progress)
                async with trio.open_nursery() as producers:
                    for pid in range(args.producers):
                        producers.start_soon(producer, pid)
                elapsed = time.perf_counter() - start
                with trio.move_on_after(30):
                    mlog, slog = master.store.commitlog, slave.store.commitlog
                    while (seen := slog.max_offset) < mlog.max_offset:
                        await slave.wait_log_grew(seen)
                nursery.cancel_scope.cancel()
            print(file=out)
            differs = compare_logs(master, slave)
            mstats = master.statistics()
            segments = len(list((base / "master" / "commitlog").iterdir()))
            total = mstats.max_offset - mstats.min_offset
            print(
                f"puts: {args.messages} x {args.size} B by {args.producers} producers "
                f"in {elapsed:.2f} s = {args.messages / elapsed:,.0f} puts/s, "
                f"{total / elapsed / (1 << 20):.1f} MiB/s",
                file=out,
            )
            print("statuses: " + ", ".join(f"{s.value} {n}" for s, n in statuses.items()), file=out)
            print(
                f"sync put latency: p50 {_percentile(latencies, 0.5) * 1e3:.2f} ms, "
                f"p99 {_percentile(latencies, 0.99) * 1e3:.2f} ms",
                file=out,
            )
            print(
                f"commit log: {total:,} bytes in {segments} segment(s) of "
                f"{args.mapped_file_size:,} bytes",
                file=out,
            )
            if differs is None:
                print(
                    "verdict: the slave's commit log is byte-for-byte identical to the master's",
                    file=out,
                )
            else:
                print(f"verdict: the logs DIFFER from offset {differs}", file=out)
            ok = differs is None and statuses[PutStatus.PUT_OK] == args.messages
            return 0 if ok else 1


# --- demo --failover: a group whose master etcd elects, and a SIGKILL ----------------------


#: Brokers in the failover demo's group.
FAILOVER_GROUP = 3
#: The topic every broker registers: its route names the group's master.
_ROUTE_TOPIC = "TBW102"
_DEMO_TOPIC = "TriohaFailover"
GROUP_BROKER_NAME = "broker-f"
#: Seconds the failover demo waits for anything at most.
_FAILOVER_WAIT = 60.0
#: The commit log's segment size in a failover group's brokers.
SEGMENT_SIZE = 1 << 20


@attrs.define
class DemoBroker:
    """One broker process of a failover group (the demo's, the nemesis harness's)."""

    broker_id: int
    root: Path
    port: int
    log: Path
    conf: Path | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Started and not exited (a paused process is running)."""
        return self.process is not None and self.process.poll() is None

    def start(self, *, log_format: str = "text") -> None:
        """``python -m trioha master -c <conf>``, its output appended to :attr:`log`."""
        assert self.conf is not None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "trioha", "master", "-c", str(self.conf)]
        if log_format != "text":
            command += ["--log-format", log_format]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)

    def signal(self, sig: signal.Signals) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap (a crash: no clean shutdown)."""
        if self.process is not None:
            self.signal(signal.SIGKILL)
            self.process.wait()


@attrs.frozen
class FailoverDemoResult:
    """What ``demo --failover`` saw: every acknowledged send, the brokers, the failover time."""

    #: Message number -> (broker address, commit log offset) of each SEND_OK.
    acked: dict[int, tuple[str, int]]
    brokers: tuple[DemoBroker, ...]
    killed: DemoBroker
    new_master: DemoBroker
    #: Seconds from the SIGKILL to the first SEND_OK on the new master.
    failover_seconds: float
    #: Sends answered otherwise (or unanswered) and sent again.
    retries: int


def demo_body(i: int) -> bytes:
    """The body of message *i*: its number, so that a log shows which message is where."""
    return b"trioha-failover-%08d" % i


def _free_port_pair() -> int:
    from trioha.broker import free_port_pair

    return free_port_pair("127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_group_brokers(
    base: Path,
    etcd: str,
    namesrv: str,
    lease_ttl: int,
    *,
    size: int = FAILOVER_GROUP,
    extra: Sequence[str] = (),
    log_format: str = "text",
) -> list[DemoBroker]:
    """Write a ``broker.conf`` per broker of one failover group under *base* (plus the
    *extra* lines) and start each as ``python -m trioha master -c``."""
    brokers: list[DemoBroker] = []
    for bid in range(1, size + 1):
        broker = DemoBroker(
            bid,
            base / f"broker-{bid}",
            _free_port_pair(),
            base / f"b{bid}.log",
            conf=base / f"broker-{bid}.conf",
        )
        assert broker.conf is not None
        broker.conf.write_text(
            "\n".join(
                [
                    f"brokerName={GROUP_BROKER_NAME}",
                    f"storePathRootDir={broker.root}",
                    f"mappedFileSizeCommitLog={SEGMENT_SIZE}",
                    "brokerIP1=127.0.0.1",
                    f"listenPort={broker.port}",
                    f"haListenPort={_free_port()}",
                    f"namesrvAddr={namesrv}",
                    "enableControllerMode=true",
                    f"failoverEtcdEndpoints={etcd}",
                    f"failoverBrokerId={bid}",
                    f"failoverLeaseTtl={lease_ttl}",
                    *extra,
                    "",
                ]
            )
        )
        broker.start(log_format=log_format)
        brokers.append(broker)
    return brokers


def stop_group_brokers(brokers: Sequence[DemoBroker]) -> None:
    """SIGCONT and SIGTERM to each running broker, SIGKILL to one still there after 30 s."""
    for broker in brokers:
        broker.signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        broker.signal(signal.SIGTERM)
    for broker in brokers:
        if broker.process is not None:
            try:
                broker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                broker.process.kill()
                broker.process.wait()


@attrs.frozen
class SendOutcome:
    """One sync send to the master the name server names. ``status`` is ``SEND_OK``,
    another send status, ``NO_MASTER`` (the route names none: nothing was sent), or
    ``ERROR`` (no answer: the message may or may not be stored)."""

    status: str
    broker: str = ""
    offset: int = -1


async def send_to_master(
    pool: RemotingClientPool,
    namesrv: str,
    *,
    topic: str,
    body: bytes,
    queue_id: int,
    answer_within: float = 5.0,
) -> SendOutcome:
    """Ask the name server for the group's master and send *body* to it synchronously; the
    offset of a SEND_OK is the msgId's last 8 bytes. Each of the two requests may take
    *answer_within* seconds."""
    from trioha.remoting import get_route, send_message

    try:
        with trio.fail_after(answer_within):
            route = await get_route(pool, namesrv, _ROUTE_TOPIC)
    except (RemotingError, trio.TooSlowError, OSError):
        return SendOutcome("NO_MASTER")
    master = next((b.master for b in route.brokers if b.master), None)
    if master is None:
        return SendOutcome("NO_MASTER")
    try:
        with trio.fail_after(answer_within):
            result = await send_message(pool, master, topic=topic, body=body, queue_id=queue_id)
    except (RemotingError, trio.TooSlowError, OSError):
        return SendOutcome("ERROR", master)
    if result.status != "SEND_OK" or result.msg_id is None:
        return SendOutcome(result.status, master)
    return SendOutcome("SEND_OK", master, int(result.msg_id[-16:], 16))


async def _send_once(pool: RemotingClientPool, namesrv: str, i: int) -> tuple[str, int] | None:
    """One sync send to the master the name server names: (broker, offset) if SEND_OK."""
    got = await send_to_master(pool, namesrv, topic=_DEMO_TOPIC, body=demo_body(i), queue_id=i % 4)
    return (got.broker, got.offset) if got.status == "SEND_OK" else None


async def wait_in_sync(etcd: str, size: int) -> list[int]:
    """Wait until the demo group's SyncStateSet in etcd has *size* members; the members."""
    from trioha.broker import read_group
    from trioha.etcd import open_etcd_client
    from trioha.failover import GroupKeys

    keys = GroupKeys.of(BrokerConfig().broker_cluster_name, GROUP_BROKER_NAME)
    async with open_etcd_client(etcd) as client:
        with trio.move_on_after(_FAILOVER_WAIT):
            while True:
                _revision, view = await read_group(client, keys)
                sss = view.sss.current
                if sss is not None and len(sss.members) >= size:
                    return sorted(sss.members)
                await trio.sleep(0.1)
    raise TimeoutError(f"the SyncStateSet did not reach {size} brokers in {_FAILOVER_WAIT:g} s")


async def failover_demo(
    base: Path, *, messages: int = 200, lease_ttl: int = 3, out: TextIO | None = None
) -> FailoverDemoResult:
    """Start one etcd member, a name server and three brokers of one group (processes), send
    *messages* sync sends through trioha's client, wait until every broker is in the
    SyncStateSet (before that, nobody may replace the master), SIGKILL the master, and keep
    sending (the route asked again after every failed send) until all are acknowledged.

    Raises :class:`EtcdMemberError` when etcd is not installed, :class:`TimeoutError` when
    nothing is acknowledged for a minute.
    """
    from trioha.etcd import start_etcd
    from trioha.namesrv import serve_namesrv
    from trioha.remoting import open_client_pool

    acked: dict[int, tuple[str, int]] = {}
    retries = 0

    def say(line: str) -> None:
        if out is not None:
            print(line, file=out, flush=True)

    async def send(pool: RemotingClientPool, namesrv: str, i: int, not_to: str) -> str:
        nonlocal retries
        with trio.move_on_after(_FAILOVER_WAIT):
            while (got := await _send_once(pool, namesrv, i)) is None or got[0] == not_to:
                retries += 1
                await trio.sleep(0.05)
            acked[i] = got
            return got[0]
        raise TimeoutError(f"no SEND_OK for message {i} within {_FAILOVER_WAIT:g} s")

    cluster = await trio.to_thread.run_sync(lambda: start_etcd(base / "etcd"))
    with cluster:
        etcd = cluster.endpoints[0]
        say(f"etcd member at {etcd}")
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_namesrv, "127.0.0.1", 0)
            namesrv = f"{host}:{port}"
            say(f"name server at {namesrv}")
            brokers = start_group_brokers(base, etcd, namesrv, lease_ttl)
            try:
                async with open_client_pool() as pool:
                    half = messages // 2
                    master = ""
                    for i in range(half):
                        master = await send(pool, namesrv, i, not_to="")
                    killed = next(b for b in brokers if b.addr == master)
                    assert killed.process is not None
                    say(f"{half} sends acknowledged by broker {killed.broker_id} ({master})")
                    # Until a slave is in the SyncStateSet, the master is the only broker
                    # that holds every acknowledged send, and nobody may replace it.
                    members = await wait_in_sync(etcd, FAILOVER_GROUP)
                    say(f"SyncStateSet {members}: every broker holds every acknowledged send")
                    killed.process.send_signal(signal.SIGKILL)
                    at = time.monotonic()
                    say(f"SIGKILL to broker {killed.broker_id}, the master")
                    new = await send(pool, namesrv, half, not_to=master)
                    took = time.monotonic() - at
                    for i in range(half + 1, messages):
                        await send(pool, namesrv, i, not_to=master)
            finally:
                await trio.to_thread.run_sync(stop_group_brokers, brokers)
            nursery.cancel_scope.cancel()
    new_master = next(b for b in brokers if b.addr == new)
    return FailoverDemoResult(acked, tuple(brokers), killed, new_master, took, retries)


def first_difference(master: CommitLog, replica: CommitLog) -> int | None:
    """Where *replica* stops being a byte prefix of *master* over their common range (the
    first differing offset), or None."""
    end = min(replica.max_offset, master.max_offset)
    offset = max(master.min_offset, replica.min_offset)
    while offset < end:
        a = bytes(master.read(offset, min(end - offset, 1 << 20)))
        b = bytes(replica.read(offset, len(a)))
        if a != b:
            return offset + next(
                (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)),
            )
        offset += len(a)
    return None


def check_failover(result: FailoverDemoResult, *, segment_size: int = SEGMENT_SIZE) -> list[str]:
    """What is wrong after ``demo --failover`` (nothing: an empty list): every SEND_OK must be
    in the new master's log at its offset, and every surviving replica's log a byte prefix
    of the new master's."""
    from trioha.store import DecodedMessage, decode_record, open_store

    problems: list[str] = []
    with open_store(result.new_master.root, segment_size=segment_size) as master:
        mlog = master.commitlog
        for i, (_broker, offset) in sorted(result.acked.items()):
            if offset >= mlog.max_offset:
                problems.append(f"message {i}: offset {offset} beyond the log ({mlog.max_offset})")
                continue
            decoded = decode_record(bytes(mlog.read(offset, 4096)), base_offset=offset)
            if not isinstance(decoded, DecodedMessage) or decoded.message.body != demo_body(i):
                problems.append(f"message {i}: not at offset {offset} of the new master")
        for broker in result.brokers:
            if broker in (result.new_master, result.killed):
                continue
            with open_store(broker.root, segment_size=segment_size) as replica:
                differs = first_difference(mlog, replica.commitlog)
                if differs is not None:
                    problems.append(f"broker {broker.broker_id} differs before {differs + 1}")
    return problems


async def run_failover_demo(args: argparse.Namespace) -> int:
    from trioha.etcd import EtcdMemberError

    base = args.dir or Path(tempfile.mkdtemp(prefix="trioha-failover-demo-"))
    out = sys.stdout
    try:
        print(f"trioha demo --failover: stores and logs under {base}", file=out)
        try:
            result = await failover_demo(
                base, messages=args.messages, lease_ttl=args.lease_ttl, out=out
            )
        except EtcdMemberError as exc:
            print(f"cannot start etcd: {exc}", file=out)
            return 1
        except TimeoutError as exc:
            print(f"verdict: FAILED: {exc}", file=out)
            return 1
        problems = await trio.to_thread.run_sync(check_failover, result)
        print(
            f"failover: broker {result.killed.broker_id} killed, broker "
            f"{result.new_master.broker_id} acknowledged the first send "
            f"{result.failover_seconds:.2f} s later (lease {args.lease_ttl} s)",
            file=out,
        )
        print(
            f"acked: {len(result.acked)} of {args.messages} sends "
            f"({result.retries} sends answered otherwise and sent again)",
            file=out,
        )
        for problem in problems:
            print(f"  {problem}", file=out)
        if problems:
            print("verdict: FAILED", file=out)
            return 1
        print(
            "verdict: every acknowledged message is on the new master at its offset, and "
            "the surviving replica's log is a byte prefix of the new master's",
            file=out,
        )
        return 0
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
