"""Nemesis runs of automatic failover: real etcd, real brokers, real faults, a checker.

    python3 tasks.py nemesis --runs N [--seconds S] [--seed K] [--twin NAME]
    .venv/bin/python -m bench.nemesis --runs N ...      (the same, without the venv check)

Each run starts three etcd members, a name server (in this process) and three
``python -m trioha master -c broker.conf`` processes of one failover group (the brokers of
``demo --failover``, trioha/cli/_demo.py), all on 127.0.0.1 with free ports, under a directory
of its own. Producers send sync messages with unique ids through trioha's client the whole
time (every SEND_OK recorded with its offset, every send without an answer recorded as
indeterminate); after a warm-up (every broker in the SyncStateSet) the run injects one fault
or a pair, chosen by the seed, heals it, lets the group settle, stops every process and
checks the stores offline:

* **lost**: an acknowledged id that is not in the final master's log exactly once at the
  offset it was acknowledged with;
* **diverged**: a replica whose log is not a byte prefix of the final master's (over their
  common range; a replica longer than the master counts too);
* **two masters**: an epoch whose master acknowledged a send after a broker of a newer epoch
  had acknowledged one (or two brokers acknowledging in one epoch). The epoch of an
  acknowledgement is read from the acknowledging broker's own log: its WARNING line
  "becoming master of epoch E" (JSON log lines, millisecond UTC times) last before the
  acknowledgement. "After" is judged soundly from outside: a send acknowledged by a broker
  that was stopped (SIGSTOP) while the send waited was decided no earlier than the SIGCONT,
  otherwise no earlier than the send began;
* **unavailability**: per fault, seconds from the fault to the first SEND_OK of a send begun
  after it; ``failover_p50_s``/``failover_p99_s`` over the faults that take the master away.

The faults (no network namespaces in this mode: kills and pauses only): ``kill-master``,
``kill-slave`` (SIGKILL, restarted after two TTLs), ``pause-master`` (SIGSTOP for two TTLs,
then SIGCONT), ``powercut-master`` (SIGKILL, then the tail after the last record it
the group acknowledged zeroed, as a power cut leaves what was not flushed: a failover
broker acknowledges only what it flushed), ``pause-master-etcd`` (the master and the etcd member its
client talks to, found with ``ss``, SIGSTOPped together; the master resumes after two TTLs
and runs on one more TTL cut off from etcd until its client turns to another member: the
no-namespace stand-in for a master partitioned from etcd), ``kill-etcd-leader`` (SIGKILL,
restarted after two TTLs) and ``pause-etcd-minority`` (one member SIGSTOPped for two TTLs).
A pair's second fault starts up to one TTL after the first and overlaps it.

``--twin NAME`` runs a known-bad twin of docs/failover.md, switched on in the real brokers
(``failoverUnsafe``, a key for tests only), so that the checker can be seen catching it.
The output ends with one summary line and a table per fault.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import attrs
import trio

from trioha._config import BrokerConfig
from trioha._errors import CoordinatorError, RemotingError
from trioha.broker import read_group
from trioha.cli._demo import (
    GROUP_BROKER_NAME,
    SEGMENT_SIZE,
    DemoBroker,
    first_difference,
    send_to_master,
    start_group_brokers,
    stop_group_brokers,
)
from trioha.etcd import EtcdCluster, EtcdMember, EtcdMemberError, open_etcd_client, start_etcd
from trioha.failover import GroupKeys, GroupView
from trioha.namesrv import serve_namesrv
from trioha.remoting import RemotingClientPool, open_client_pool, runtime_info
from trioha.store import DecodedMessage, decode_record, open_store

#: Faults that take the master away: their windows are the failover figures.
MASTER_FAULTS = ("kill-master", "pause-master", "powercut-master", "pause-master-etcd")
#: Every fault the no-namespace mode injects.
FAULTS = (*MASTER_FAULTS, "kill-slave", "kill-etcd-leader", "pause-etcd-minority")
TOPIC = "TriohaNemesis"
#: Producers; producer 0 waits long for an answer (a send a stopped master holds), the
#: others give up after one TTL and ask the route again.
PRODUCERS = 3
#: Seconds a run waits for the group to form, and to settle after the faults.
FORM_WAIT = 60.0
SETTLE_WAIT = 30.0


@attrs.frozen
class Twin:
    """A broker configuration a run uses: the design (``none``) or a known-bad twin."""

    name: str
    conf: tuple[str, ...]
    what: str


TWINS = {
    "none": Twin("none", (), "the design as built"),
    # The model's failover-twin-no-fence trace: a master cut off keeps answering PUT_OK
    # when the SyncStateSet is itself alone. A stopped master's slaves have left it, so it
    # acknowledges alone only when the ack rule asks for no slave: the same twin here runs
    # with inSyncReplicas=1 and allAckInSyncStateSet=false. The same settings with the
    # fence on (``acks-alone``) are the control: they may lose a send the slaves had not
    # received when the master stopped, but never acknowledge in an old epoch.
    "no-self-fence": Twin(
        "no-self-fence",
        (
            "failoverUnsafe=no_self_fence",
            "allAckInSyncStateSet=false",
            "inSyncReplicas=1",
            "minInSyncReplicas=1",
        ),
        "acknowledging without the self-fence (and without waiting for slaves)",
    ),
    "acks-alone": Twin(
        "acks-alone",
        ("allAckInSyncStateSet=false", "inSyncReplicas=1", "minInSyncReplicas=1"),
        "RocketMQ's default ack rule: the master acknowledges alone (failover-twin-ack-any)",
    ),
}


def body_of(i: int) -> bytes:
    return b"nemesis-%010d" % i


_BODY = re.compile(rb"nemesis-(\d{10})")


@attrs.frozen
class Ack:
    broker: str
    offset: int
    sent: float
    done: float


@attrs.define
class History:
    """What the producers saw (wall-clock times, the brokers' logs use the same clock)."""

    acked: dict[int, Ack] = attrs.Factory(dict)
    indeterminate: set[int] = attrs.Factory(set)
    unsent: int = 0
    #: Broker address -> [(SIGSTOP time, SIGCONT time)].
    paused: dict[str, list[tuple[float, float]]] = attrs.Factory(lambda: defaultdict(list))


@attrs.define
class Fault:
    kind: str
    target: str = ""
    at: float = 0.0
    healed: float = 0.0
    #: Seconds from the fault to the first SEND_OK of a send begun after it (None: none).
    window: float | None = None
    skipped: str = ""


@attrs.frozen
class RunResult:
    seed: int
    faults: tuple[Fault, ...]
    acked: int
    indeterminate: int
    lost: tuple[str, ...]
    diverged: tuple[str, ...]
    two_masters: tuple[str, ...]
    unsettled: str
    directory: Path

    @property
    def ok(self) -> bool:
        return not (self.lost or self.diverged or self.two_masters or self.unsettled)


# --- the checker (offline, over the stopped brokers' stores and logs) -------------------------


def read_ids(root: Path) -> tuple[dict[int, list[int]], int]:
    """Every nemesis id in the commit log under *root* with the offsets it is at; the end."""
    where: dict[int, list[int]] = defaultdict(list)
    with open_store(root, segment_size=SEGMENT_SIZE) as store:
        log = store.commitlog
        offset = log.min_offset
        while offset < log.max_offset:
            chunk = bytes(log.read(offset, min(log.max_offset - offset, SEGMENT_SIZE)))
            pos = 0
            while pos < len(chunk):
                decoded = decode_record(chunk, pos, base_offset=offset)
                if not isinstance(decoded, DecodedMessage):
                    break  # a segment's blank end or the chunk's end: read on from there
                if match := _BODY.fullmatch(decoded.message.body):
                    where[int(match[1])].append(offset + pos)
                pos += decoded.size
            if pos == 0:
                # A blank: the rest of the segment is padding.
                offset = (offset // SEGMENT_SIZE + 1) * SEGMENT_SIZE
            else:
                offset += pos
        return where, log.max_offset


def check_lost(acked: dict[int, Ack], ids: dict[int, list[int]]) -> list[str]:
    """Each acknowledged id not exactly once at its acknowledged offset."""
    problems = []
    for i, ack in sorted(acked.items()):
        found = ids.get(i, [])
        if found != [ack.offset]:
            problems.append(
                f"id {i} acknowledged by {ack.broker} at {ack.offset}: "
                + (f"found at {found}" if found else "missing")
            )
    return problems


_BECOMING = re.compile(r"becoming master of epoch (\d+)")


def master_terms(log: Path) -> list[tuple[float, int]]:
    """(time, epoch) of each "becoming master of epoch E" WARNING line in a broker's JSON log."""
    terms = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{") or "becoming master" not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if match := _BECOMING.search(record.get("message", "")):
            stamp = datetime.datetime.fromisoformat(record["time"]).timestamp()
            terms.append((stamp, int(match[1])))
    return sorted(terms)


def check_two_masters(
    history: History, terms: dict[str, list[tuple[float, int]]], slack: float = 0.01
) -> list[str]:
    """Epochs in which two brokers acknowledged, or whose master acknowledged after a newer
    epoch's master had (judged as the module's docstring says)."""
    by_epoch: dict[int, list[tuple[Ack, float]]] = defaultdict(list)
    problems = []
    for i, ack in sorted(history.acked.items()):
        epochs = [e for t, e in terms.get(ack.broker, []) if t <= ack.done + slack]
        if not epochs:
            problems.append(f"id {i}: {ack.broker} acknowledged it as master of no epoch")
            continue
        decided = ack.sent
        for _stopped, resumed in history.paused.get(ack.broker, []):
            if ack.sent < resumed <= ack.done:
                decided = max(decided, resumed)
        by_epoch[epochs[-1]].append((ack, decided))
    for epoch, acks in sorted(by_epoch.items()):
        brokers = {ack.broker for ack, _ in acks}
        if len(brokers) > 1:
            problems.append(f"epoch {epoch}: acknowledged by {sorted(brokers)}")
            continue
        newer = [a.done for e, later in by_epoch.items() if e > epoch for a, _ in later]
        if not newer:
            continue
        first_newer = min(newer)
        stale = [ack for ack, decided in acks if decided > first_newer + slack]
        if stale:
            problems.append(
                f"epoch {epoch}: {stale[0].broker} acknowledged {len(stale)} send(s) after a "
                f"newer epoch's master had acknowledged one"
            )
    return problems


def check_replicas(final: DemoBroker, others: Sequence[DemoBroker]) -> list[str]:
    problems = []
    with open_store(final.root, segment_size=SEGMENT_SIZE) as master:
        for broker in others:
            with open_store(broker.root, segment_size=SEGMENT_SIZE) as replica:
                rlog, mlog = replica.commitlog, master.commitlog
                differs = first_difference(mlog, rlog)
                if differs is not None:
                    problems.append(f"broker {broker.broker_id} differs at offset {differs}")
                elif rlog.max_offset > mlog.max_offset:
                    problems.append(
                        f"broker {broker.broker_id} ends at {rlog.max_offset}, beyond the "
                        f"master's {mlog.max_offset}"
                    )
    return problems


# --- faults -----------------------------------------------------------------------------------


def power_cut(root: Path, cut: int) -> None:
    """What a power cut leaves of a commit log flushed up to *cut*: zeros after it in its
    segment, and no later segment."""
    commitlog = root / "commitlog"
    for segment in sorted(commitlog.iterdir()):
        start = int(segment.name)
        if start > cut:
            segment.unlink()
        elif start + segment.stat().st_size > cut:
            with segment.open("r+b") as f:
                f.seek(cut - start)
                f.write(bytes(start + segment.stat().st_size - cut))


def flushed_at_least(root: Path, history: History, before: float) -> int:
    """Where a power cut may begin in the log under *root* of a broker killed at *before*:
    the end of the last record the group acknowledged by then, when the log holds it there
    (every broker the ack rule counted had flushed it, and a master counts only its own
    flushed copy); else the log's end (no cut: a power cut may also take nothing). Bytes
    after that point were never acknowledged, so cutting them cannot make a loss."""
    with open_store(root, segment_size=SEGMENT_SIZE) as store:
        log = store.commitlog
        offsets = [a.offset for a in history.acked.values() if a.done <= before]
        last = max(offsets, default=-1)
        if last < log.min_offset or last >= log.max_offset:
            return log.max_offset
        decoded = decode_record(bytes(log.read(last, 4096)), base_offset=last)
        return last + decoded.size if isinstance(decoded, DecodedMessage) else log.max_offset


def etcd_member_of(broker: DemoBroker, cluster: EtcdCluster) -> EtcdMember | None:
    """The etcd member *broker*'s process has a connection to (``ss``), or None."""
    if broker.process is None or shutil.which("ss") is None:
        return None
    listing = subprocess.run(
        ["ss", "-Htnp", "state", "established"], capture_output=True, text=True, check=False
    ).stdout
    ports = {m.client_port: m for m in cluster.members if m.running}
    for line in listing.splitlines():
        if f"pid={broker.process.pid}," not in line:
            continue
        fields = line.split()
        peer = fields[3] if len(fields) > 3 else ""
        port = peer.rpartition(":")[2]
        if port.isdigit() and int(port) in ports:
            return ports[int(port)]
    return None


@attrs.define
class Group:
    """The processes of one run."""

    etcd: EtcdCluster
    brokers: list[DemoBroker]
    history: History
    ttl: int
    keys: GroupKeys

    def broker(self, broker_id: int) -> DemoBroker:
        return next(b for b in self.brokers if b.broker_id == broker_id)

    async def view(self) -> GroupView | str:
        """The group's keys in etcd now, or why they could not be read."""
        try:
            with trio.fail_after(self.ttl):
                async with open_etcd_client(self.etcd.endpoints, retry_for=self.ttl) as client:
                    return (await read_group(client, self.keys))[1]
        except (CoordinatorError, trio.TooSlowError, OSError) as exc:
            return f"etcd: {exc or type(exc).__name__}"

    async def master_id(self) -> int:
        """The master etcd names now (0: none, or etcd does not answer)."""
        view = await self.view()
        record = view.master.current if not isinstance(view, str) else None
        return record.broker_id if record is not None else 0


async def inject(group: Group, fault: Fault, rng: random.Random, busy: set[int]) -> None:
    """Inject *fault*, hold it two TTLs, heal it; *busy* holds the brokers already faulted."""
    hold = 2.0 * group.ttl
    kind = fault.kind
    if kind in (*MASTER_FAULTS, "kill-slave"):
        # A pair's second fault on "the master" waits for one that is not already faulted
        # (the first fault's successor): a double failure.
        master = await group.master_id()
        with trio.move_on_after(3 * group.ttl):
            while kind != "kill-slave" and (not master or master in busy):
                await trio.sleep(0.1)
                master = await group.master_id()
        if kind == "kill-slave":
            choices = [b.broker_id for b in group.brokers if b.broker_id != master]
        else:
            choices = [master] if master else []
        choices = [c for c in choices if c not in busy]
        if not choices:
            fault.skipped = "no master" if kind != "kill-slave" else "no free slave"
            return
        broker = group.broker(rng.choice(choices))
        busy.add(broker.broker_id)
        fault.target = f"broker {broker.broker_id}"
        fault.at = time.time()
        if kind in ("pause-master", "pause-master-etcd"):
            its = etcd_member_of(broker, group.etcd) if kind == "pause-master-etcd" else None
            broker.signal(signal.SIGSTOP)
            if its is not None:
                await trio.to_thread.run_sync(its.pause)
                fault.target += f" and {its.name}"
            await trio.sleep(hold)
            broker.signal(signal.SIGCONT)
            group.history.paused[broker.addr].append((fault.at, time.time()))
            if its is not None:
                # The master runs on while its etcd member answers nothing: cut off from
                # etcd until its client turns to another member.
                await trio.sleep(group.ttl)
                await trio.to_thread.run_sync(its.resume)
        else:
            await trio.to_thread.run_sync(broker.kill)
            if kind == "powercut-master":
                root, history = broker.root, group.history
                at = fault.at
                end = await trio.to_thread.run_sync(lambda: flushed_at_least(root, history, at))
                await trio.to_thread.run_sync(power_cut, root, end)
                fault.target += f" (cut at {end})"
            await trio.sleep(hold)
            broker.start(log_format="json")
        fault.healed = time.time()
        busy.discard(broker.broker_id)
        return
    if kind == "kill-etcd-leader":
        member = await trio.to_thread.run_sync(group.etcd.leader)
        fault.target, fault.at = member.name, time.time()
        await trio.to_thread.run_sync(member.kill)
        await trio.sleep(hold)
        await trio.to_thread.run_sync(member.start)
    elif kind == "pause-etcd-minority":
        member = rng.choice([m for m in group.etcd.members if m.running])
        fault.target, fault.at = member.name, time.time()
        await trio.to_thread.run_sync(member.pause)
        await trio.sleep(hold)
        await trio.to_thread.run_sync(member.resume)
    else:
        raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
    fault.healed = time.time()


# --- a run ------------------------------------------------------------------------------------


async def produce(
    pool: RemotingClientPool, namesrv: str, history: History, ids: Iterator[int], wait: float
) -> None:
    """Sync sends of fresh ids until cancelled; each outcome recorded."""
    for i in ids:
        sent = time.time()
        got = await send_to_master(
            pool, namesrv, topic=TOPIC, body=body_of(i), queue_id=i % 4, answer_within=wait
        )
        if got.status == "SEND_OK":
            history.acked[i] = Ack(got.broker, got.offset, sent, time.time())
        elif got.status == "NO_MASTER":
            history.unsent += 1
        else:
            history.indeterminate.add(i)
        if got.status != "SEND_OK":
            await trio.sleep(0.05)


async def settle(group: Group, pool: RemotingClientPool) -> str:
    """With the load stopped, wait until a master leads a SyncStateSet of every broker and
    every broker's log ends where the master's does; "" then, else what was still wrong."""
    seen = "nothing read"
    with trio.move_on_after(SETTLE_WAIT):
        while True:
            await trio.sleep(0.5)
            view = await group.view()
            if isinstance(view, str):  # etcd still recovering: ask again
                seen = view
                continue
            sss = view.sss.current
            ends = {b.broker_id: await log_end(pool, b.addr) for b in group.brokers}
            seen = f"master {view.master.current}, set {sss}, log ends {ends}"
            if (
                view.master.current is not None
                and sss is not None
                and len(sss.members) == len(group.brokers)
                and len(set(ends.values())) == 1
                and None not in ends.values()
            ):
                return ""
    return f"not settled after {SETTLE_WAIT:g} s: {seen}"


async def log_end(pool: RemotingClientPool, broker: str) -> int | None:
    """The broker's commit log end as its runtime info says (None: no answer)."""
    try:
        with trio.fail_after(2):
            return int((await runtime_info(pool, broker))["commitLogMaxOffset"])
    except (RemotingError, trio.TooSlowError, OSError, KeyError, ValueError):
        return None


def choose_faults(rng: random.Random) -> list[str]:
    """One fault or a pair (half the runs each)."""
    if rng.random() < 0.5:
        return [rng.choice(FAULTS)]
    return rng.sample(FAULTS, 2)


async def run_once(
    base: Path,
    seed: int,
    *,
    seconds: float,
    ttl: int = 3,
    twin: Twin = TWINS["none"],
    faults: Sequence[str] | None = None,
    out: TextIO | None = None,
) -> RunResult:
    """One run under *base* (see the module's docstring); the checker's verdict."""
    rng = random.Random(seed)
    kinds = list(faults) if faults is not None else choose_faults(rng)
    history = History()
    plan = [Fault(kind) for kind in kinds]
    cluster = await trio.to_thread.run_sync(lambda: start_etcd(base / "etcd", 3))
    keys = GroupKeys.of(BrokerConfig().broker_cluster_name, GROUP_BROKER_NAME)
    brokers: list[DemoBroker] = []
    unsettled = ""
    final = 0
    with cluster:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_namesrv, "127.0.0.1", 0)
            namesrv = f"{host}:{port}"
            try:
                brokers = start_group_brokers(
                    base,
                    ",".join(cluster.endpoints),
                    namesrv,
                    ttl,
                    extra=twin.conf,
                    log_format="json",
                )
                group = Group(cluster, brokers, history, ttl, keys)
                async with open_client_pool() as pool, trio.open_nursery() as load:
                    ids = itertools.count()
                    for p in range(PRODUCERS):
                        wait = 4.0 * ttl if p == 0 else float(ttl)
                        load.start_soon(produce, pool, namesrv, history, ids, wait)
                    unsettled = await formed_group(group)
                    if not unsettled:
                        await fault_phase(group, plan, rng, seconds)
                    load.cancel_scope.cancel()
                if not unsettled:
                    async with open_client_pool() as pool:
                        unsettled = await settle(group, pool)
                        final = await group.master_id()
                        # The settled group takes a send (recorded like any other).
                        last = next(ids)
                        await produce(pool, namesrv, history, iter([last]), float(ttl))
                        if not unsettled and last not in history.acked:
                            unsettled = "the settled group did not acknowledge a send"
            finally:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(stop_group_brokers, brokers)
                nursery.cancel_scope.cancel()
    for fault in plan:
        fault.window = window(history, fault)
    lost: list[str] = []
    diverged: list[str] = []
    two: list[str] = []
    if final:
        master = next(b for b in brokers if b.broker_id == final)
        ids_at, _end = await trio.to_thread.run_sync(read_ids, master.root)
        lost = check_lost(history.acked, ids_at)
        others = [b for b in brokers if b is not master]
        diverged = await trio.to_thread.run_sync(check_replicas, master, others)
        terms = {b.addr: master_terms(b.log) for b in brokers}
        two = check_two_masters(history, terms)
    elif not unsettled:
        unsettled = "no master at the end"
    result = RunResult(
        seed,
        tuple(plan),
        len(history.acked),
        len(history.indeterminate),
        tuple(lost),
        tuple(diverged),
        tuple(two),
        unsettled,
        base,
    )
    if out is not None:
        report_run(result, out)
    return result


async def formed_group(group: Group) -> str:
    """Wait until a master acknowledged a send and every broker is in its SyncStateSet."""
    with trio.move_on_after(FORM_WAIT):
        while True:
            await trio.sleep(0.1)
            view = await group.view()
            if isinstance(view, str):  # etcd busy: ask again
                continue
            sss = view.sss.current
            if group.history.acked and sss is not None and len(sss.members) == len(group.brokers):
                return ""
    return f"the group did not form within {FORM_WAIT:g} s"


async def fault_phase(group: Group, plan: list[Fault], rng: random.Random, seconds: float) -> None:
    """The faults of *plan* within *seconds*: the first a quarter in, a second (a pair) up to
    one TTL after it, overlapping."""
    start = trio.current_time()
    busy: set[int] = set()
    async with trio.open_nursery() as nursery:
        await trio.sleep(seconds / 4)
        for n, fault in enumerate(plan):
            if n:
                await trio.sleep(rng.uniform(0, group.ttl))
            nursery.start_soon(inject, group, fault, rng, busy)
    await trio.sleep_until(start + seconds)


def window(history: History, fault: Fault) -> float | None:
    if fault.skipped or not fault.at:
        return None
    after = [a.done for a in history.acked.values() if a.sent >= fault.at]
    return min(after) - fault.at if after else None


# --- the batch and its report -----------------------------------------------------------------


def save_result(result: RunResult, path: Path) -> None:
    """Append *result* to a JSON-lines file (a long batch can be summed up part way)."""
    record = attrs.asdict(result)
    record["directory"] = str(result.directory)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def load_results(path: Path) -> list[RunResult]:
    results = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        results.append(
            RunResult(
                seed=record["seed"],
                faults=tuple(Fault(**f) for f in record["faults"]),
                acked=record["acked"],
                indeterminate=record["indeterminate"],
                lost=tuple(record["lost"]),
                diverged=tuple(record["diverged"]),
                two_masters=tuple(record["two_masters"]),
                unsettled=record["unsettled"],
                directory=Path(record["directory"]),
            )
        )
    return results


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report_run(result: RunResult, out: TextIO) -> None:
    faults = ", ".join(
        f"{f.kind} {f.target}"
        + (f" skipped ({f.skipped})" if f.skipped else "")
        + (f" {f.window:.2f} s" if f.window is not None else "")
        for f in result.faults
    )
    verdict = "ok" if result.ok else "FAILED"
    print(
        f"run seed={result.seed}: {faults}; acked {result.acked}, indeterminate "
        f"{result.indeterminate}: {verdict}",
        file=out,
        flush=True,
    )
    for problem in [*result.lost[:5], *result.diverged, *result.two_masters[:5]]:
        print(f"  {problem}", file=out)
    if result.unsettled:
        print(f"  {result.unsettled}", file=out)


def summary(results: Sequence[RunResult]) -> list[str]:
    """The summary line and the table per fault."""
    faults = [f for r in results for f in r.faults if not f.skipped]
    failover = [f.window for f in faults if f.kind in MASTER_FAULTS and f.window is not None]
    lines = [
        f"nemesis: runs={len(results)} faults={len(faults)} "
        f"acked={sum(r.acked for r in results)} lost={sum(len(r.lost) for r in results)} "
        f"diverged={sum(len(r.diverged) for r in results)} "
        f"two_masters={sum(len(r.two_masters) for r in results)} "
        f"failover_p50_s={percentile(failover, 0.5):.2f} "
        f"failover_p99_s={percentile(failover, 0.99):.2f}",
        "",
        "| fault | injected | runs failed | no SEND_OK after it | window p50 s | p99 s | max s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in FAULTS:
        these = [(r, f) for r in results for f in r.faults if f.kind == kind and not f.skipped]
        windows = [f.window for _, f in these if f.window is not None]
        failed = len({id(r) for r, _ in these if not r.ok})
        if not these:
            continue
        lines.append(
            f"| {kind} | {len(these)} | {failed} | {len(these) - len(windows)} | "
            f"{percentile(windows, 0.5):.2f} | {percentile(windows, 0.99):.2f} | "
            f"{max(windows, default=float('nan')):.2f} |"
        )
    kills = [
        f.window
        for r in results
        if len(r.faults) == 1
        for f in r.faults
        if f.kind in ("kill-master", "powercut-master") and f.window is not None
    ]
    indeterminate = sum(r.indeterminate for r in results)
    unsettled = sum(1 for r in results if r.unsettled)
    lines.append("")
    lines.append(
        f"a master killed alone (kill-master, powercut-master as the run's only fault) -> "
        f"first SEND_OK: {len(kills)} runs, p50 {percentile(kills, 0.5):.2f} s, "
        f"p99 {percentile(kills, 0.99):.2f} s, max {max(kills, default=float('nan')):.2f} s"
    )
    lines.append(f"indeterminate sends: {indeterminate}; runs that did not settle: {unsettled}")
    return lines


async def run_batch(
    runs: int,
    *,
    seconds: float,
    seed: int,
    twin: Twin,
    directory: Path | None,
    keep: bool,
    out: TextIO,
    faults: Sequence[str] | None = None,
    ttl: int = 3,
    record: Path | None = None,
) -> list[RunResult]:
    """*runs* runs, seeds from *seed* on. SIGINT or SIGTERM ends the batch after the run
    under way (its processes stopped, its result counted)."""
    results = []
    stopping = trio.Event()

    async def watch_signals() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                print(f"nemesis: {signal.Signals(signum).name}: stopping after this run", file=out)
                stopping.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_signals)
        for n in range(runs):
            if stopping.is_set():
                break
            base = Path(tempfile.mkdtemp(prefix=f"nemesis-{seed + n}-", dir=directory))
            try:
                result = await run_once(
                    base, seed + n, seconds=seconds, ttl=ttl, twin=twin, faults=faults, out=out
                )
            except EtcdMemberError as exc:
                print(f"run seed={seed + n}: cannot start etcd: {exc}", file=out)
                raise
            results.append(result)
            if record is not None:
                save_result(result, record)
            if result.ok and not keep:
                shutil.rmtree(base, ignore_errors=True)
            elif not result.ok:
                print(f"  kept {base}", file=out)
        nursery.cancel_scope.cancel()
    return results


def main(argv: Sequence[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(
        prog="nemesis", description="nemesis runs of automatic failover (docs/failover.md)"
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0, help="each run's fault phase")
    parser.add_argument("--seed", type=int, default=None, help="first run's seed (default: random)")
    parser.add_argument("--twin", choices=sorted(TWINS), default="none")
    parser.add_argument(
        "--fault", action="append", choices=FAULTS, help="these faults in every run"
    )
    parser.add_argument("--lease-ttl", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="make each run's directory here")
    parser.add_argument("--keep", action="store_true", help="keep the directories of good runs")
    parser.add_argument(
        "--record", type=Path, help="append each run's result to this JSON-lines file"
    )
    parser.add_argument(
        "--summarize",
        type=Path,
        metavar="FILE",
        help="run nothing: print the summary of the runs --record wrote to FILE",
    )
    parser.add_argument(
        "--netns",
        action="store_true",
        help="network namespaces and partitions (not built yet: says so and exits)",
    )
    args = parser.parse_args(argv)
    if args.netns:
        print("nemesis: --netns (partitions in network namespaces) is not built yet", file=out)
        return 2
    if args.summarize is not None:
        for line in summary(load_results(args.summarize)):
            print(line, file=out)
        return 0
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    twin = TWINS[args.twin]
    print(
        f"nemesis: {args.runs} run(s) of {args.seconds:g} s, seeds {seed}.., "
        f"lease {args.lease_ttl} s, brokers: {twin.what}",
        file=out,
        flush=True,
    )
    results = trio.run(
        lambda: run_batch(
            args.runs,
            seconds=args.seconds,
            seed=seed,
            twin=twin,
            directory=args.dir,
            keep=args.keep,
            out=out,
            faults=args.fault,
            ttl=args.lease_ttl,
            record=args.record,
        )
    )
    for line in summary(results):
        print(line, file=out)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
