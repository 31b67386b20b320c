"""Catch-up through whole brokers, trioha's and Java's, started and watched the same way.

Each broker's master starts on a copy of the same backlog's commit log (the RocketMQ on-disk
format both read) and builds its consume queues; once its ``GET_BROKER_RUNTIME_INFO`` says
``dispatchBehindBytes`` 0, its slave starts holding only the log's first message. A slave
reporting 0 would be served from the last segment only (``HAConnection``'s rule for a new slave,
docs/rocketmq-protocol.md), so one message is what makes both masters send the whole backlog.
The clock runs from the slave's first answer to ``GET_BROKER_RUNTIME_INFO`` (so a JVM's start
is not counted, nor Python's) until it reports ``commitLogMaxOffset`` at the master's end **and**
``dispatchBehindBytes`` 0: the log copied and its consume queues built; the rate counts the
bytes copied in that time.
The slave process is sampled from ``/proc`` meanwhile (CPU seconds, peak RSS, and the peak of
its anonymous memory, the part not backed by files: the JVM's heap, Python's objects).
"""

from __future__ import annotations

import shutil
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import trio

from bench import _clusters
from bench._common import MIB, phase_progress, proc_sample

DONE_TIMEOUT = 900.0
POLL = 0.1


def _seed_slave(backlog: Path, slave: Path, *, segment_size: int) -> int:
    """A slave store whose log holds the backlog's first message only; returns its end."""
    first = backlog / "commitlog" / f"{0:020d}"
    with first.open("rb") as f:
        head = f.read(4)
        size = int.from_bytes(head, "big")
        record = head + f.read(size - 4)
    (slave / "commitlog").mkdir(parents=True, exist_ok=True)
    with (slave / "commitlog" / f"{0:020d}").open("wb") as out:
        out.write(record)
        out.truncate(segment_size)
    return size


def _copy_log(backlog: Path, master: Path) -> None:
    (master / "commitlog").mkdir(parents=True, exist_ok=True)
    for path in sorted((backlog / "commitlog").iterdir()):
        shutil.copyfile(path, master / "commitlog" / path.name)


async def _info(pool: Any, broker: str) -> dict[str, str] | None:
    from trioha._errors import TriohaError
    from trioha.remoting import runtime_info

    try:
        with trio.fail_after(5):
            return await runtime_info(pool, broker)
    except (TriohaError, OSError, trio.TooSlowError):
        return None


def _caught_up(info: dict[str, str] | None, end: int) -> bool:
    return (
        info is not None
        and int(info.get("commitLogMaxOffset", -1)) >= end
        and info.get("dispatchBehindBytes") == "0"
    )


async def full_catch_up(
    work: Path, *, kind: str, backlog: Path, end: int, segment_size: int
) -> dict[str, Any]:
    """Master on a copy of *backlog*, slave from its first message; *kind* trioha or java."""
    from trioha.remoting import open_client_pool

    root = work / f"catchup-{kind}"
    shutil.rmtree(root, ignore_errors=True)
    master_store, slave_store = root / "master", root / "slave"
    await trio.to_thread.run_sync(_copy_log, backlog, master_store)
    seed = _seed_slave(backlog, slave_store, segment_size=segment_size)
    cluster = _clusters.Cluster(kind, "127.0.0.1:9876")
    size = str(segment_size)
    if kind == "java":
        script = str(_clusters.JAVA_HOME_DIR / "rocketmq.sh")
        master_addr, slave_addr = "127.0.0.1:10911", "127.0.0.1:10921"
        mconf, sconf = root / "master.conf", root / "slave.conf"
        _clusters._java_conf(
            mconf,
            store=master_store,
            role="ASYNC_MASTER",
            broker_id=0,
            port=10911,
            namesrv=cluster.namesrv,
            segment_size=segment_size,
        )
        _clusters._java_conf(
            sconf,
            store=slave_store,
            role="SLAVE",
            broker_id=1,
            port=10921,
            namesrv=cluster.namesrv,
            segment_size=segment_size,
            master_ha="127.0.0.1:10912",
        )
        master_cmd = [script, "broker", str(mconf), str(root / "m")]
        slave_cmd = [script, "broker", str(sconf), str(root / "s")]
    else:
        listen, ha, slave_listen = (_clusters.free_port() for _ in range(3))
        master_addr, slave_addr = f"127.0.0.1:{listen}", f"127.0.0.1:{slave_listen}"
        py = [sys.executable, "-m", "trioha"]
        master_cmd = [
            *py,
            "master",
            "--store-dir",
            str(master_store),
            "--role",
            "ASYNC_MASTER",
            "--listen",
            master_addr,
            "--ha-listen",
            f"127.0.0.1:{ha}",
            "--mapped-file-size",
            size,
        ]
        slave_cmd = [
            *py,
            "slave",
            "--store-dir",
            str(slave_store),
            "--listen",
            slave_addr,
            "--master-ha",
            f"127.0.0.1:{ha}",
            "--mapped-file-size",
            size,
        ]
    out: dict[str, Any] = {"broker": kind, "seed": seed}
    try:
        async with open_client_pool() as pool:
            master = await _clusters._spawn(master_cmd, root / "master.log", cluster)
            cluster.master_pid = master.pid
            started = time.perf_counter()
            with trio.fail_after(DONE_TIMEOUT):
                # within a closing blank record (smaller than a message's 4 MiB limit) of *end*
                while not _caught_up(await _info(pool, master_addr), end - 4 * MIB):
                    _check_alive(cluster)
                    await trio.sleep(0.5)
            out["master_index_s"] = time.perf_counter() - started
            # Java counts a segment's closing blank record out of the log, trioha in: each
            # slave is timed to its own master's end.
            info = await _info(pool, master_addr)
            assert info is not None
            end = int(info["commitLogMaxOffset"])
            slave = await _clusters._spawn(slave_cmd, root / "slave.log", cluster)
            cluster.slave_pid = slave.pid
            spawned = time.perf_counter()
            peak_anon = peak_rss = 0
            t0: float | None = None
            base = cpu0 = mcpu0 = 0.0
            log_done: float | None = None
            with trio.fail_after(DONE_TIMEOUT), ExitStack() as reporting:
                while True:
                    _check_alive(cluster)
                    sample = proc_sample(slave.pid)
                    peak_anon = max(peak_anon, sample.rss_anon)
                    peak_rss = max(peak_rss, sample.rss)
                    info = await _info(pool, slave_addr)
                    if info is None:
                        await trio.sleep(POLL)
                        continue
                    now = time.perf_counter()
                    if t0 is None:  # the clock starts once the slave answers: up, not booting
                        t0, base = now, int(info["commitLogMaxOffset"])
                        cpu0, mcpu0 = sample.cpu, proc_sample(master.pid).cpu
                        out["slave_boot_s"] = now - spawned
                        progress = reporting.enter_context(
                            phase_progress(f"{kind} slave catch-up", end - base)
                        )
                    progress.set(int(info["commitLogMaxOffset"]) - base)
                    if log_done is None and int(info["commitLogMaxOffset"]) >= end:
                        log_done = now - t0
                    if _caught_up(info, end):
                        break
                    await trio.sleep(POLL)
            elapsed = time.perf_counter() - t0
            last = proc_sample(slave.pid)
            copied = end - base
            out.update(
                backlog=copied,
                seconds=elapsed,
                log_seconds=log_done,
                mib_s=copied / MIB / elapsed,
                log_mib_s=copied / MIB / log_done if log_done else None,
                slave_cpu_s=last.cpu - cpu0,
                master_cpu_s=proc_sample(master.pid).cpu - mcpu0,
                slave_peak_rss=max(peak_rss, last.hwm),
                slave_peak_anon=max(peak_anon, last.rss_anon),
            )
    finally:
        await _clusters._stop(cluster)
        shutil.rmtree(master_store, ignore_errors=True)  # the logs stay, for a failed run
        shutil.rmtree(slave_store, ignore_errors=True)
    return out


def _check_alive(cluster: _clusters.Cluster) -> None:
    for process in cluster.processes:
        if process.returncode is not None:
            raise RuntimeError(
                f"{cluster.name}: a process exited with code "
                f"{process.returncode} ({str(process.args)[:160]})"
            )
