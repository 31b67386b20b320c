"""Instructions per send and per replicated MiB, counted by callgrind: figures load cannot move.

    PYTHONPATH=. .venv/bin/python bench/instructions.py            # about 6 minutes
    PYTHONPATH=. .venv/bin/python bench/instructions.py --only send --repeat 1

Wall-clock rates on a shared machine follow whatever else runs on it; the number of machine
instructions a process executes for a fixed piece of work does not. Each figure here is one run
of the work under ``valgrind --tool=callgrind`` (all threads counted, start-up and warm-up left
out: :mod:`bench._icount`), repeated ``--repeat`` times to show that it repeats:

* **per send**: ``bench/send_path.py --bursts N`` (a real broker in-process, ASYNC_MASTER,
  bursts of 32 sends encoded as the C++ client encodes them, 1 KiB bodies, the consume-queue
  builder running), instructions in the window divided by the messages sent;
* **per replicated MiB, slave**: a slave starting empty copies a fixed backlog (``--backlog-mib``
  of 1 KiB messages with a key each, ``bench/_backlog.py``) from a master running natively, and
  builds its consume queues and index for it; counted from the moment it may receive until its
  log and its consume queues cover the backlog. A relay in this process holds the connection
  until the slave's window is open, so nothing arrives before it;
* **per replicated MiB, master**: the master serving that backlog to an empty slave running
  natively, counted from before the slave connects until the slave's ack covers the backlog;
* ``--bare`` adds both catch-up figures for the replication path alone (store, ``HAService`` /
  ``HAClient`` and the flusher; no consume queues, no client port).

Time stands still inside a window (a Trio ``MockClock`` at rate 0), so periodic work does not
land in it however slowly callgrind runs the process; what remains run to run is the work
itself, plus how the kernel splits the stream into reads, which the spread column shows.
The first line says which build of trioha ran (pure Python or compiled modules).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._backlog import make_backlog
from bench._common import MIB, ROOT, open_child
from bench._icount import (
    DETERMINISTIC_ENV,
    callgrind_command,
    read_window,
    run_counted,
    valgrind_missing,
)
from trioha import build_info

SEGMENT = 64 * MIB


def count_sends(bursts: int, burst: int, keep: Path | None = None) -> float:
    """Instructions per send over *bursts* bursts of *burst* sends (one callgrind run)."""
    command = [
        sys.executable,
        "bench/send_path.py",
        "--bursts",
        str(bursts),
        "--burst",
        str(burst),
    ]
    total, _ = run_counted(command, cwd=ROOT, keep=keep)
    return total / (bursts * burst)


async def _relay(listener: trio.SocketListener, master: tuple[str, int]) -> None:
    """Accept one connection and join it to *master*, both ways, until either side ends."""
    inbound = await listener.accept()
    outbound = await trio.open_tcp_stream(*master)

    async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
        while chunk := await src.receive_some(1 << 20):
            await dst.send_all(chunk)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, inbound, outbound)
            nursery.start_soon(pump, outbound, inbound)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await inbound.aclose()
        await outbound.aclose()


def _node_args(kind: str, store: Path, bare: bool) -> list[str]:
    args = [kind, "--store", str(store), "--segment-size", str(SEGMENT), "--interval", "3600"]
    return [*args, "--bare"] if bare else args


async def count_catchup(
    work: Path, backlog: Path, end: int, *, side: str, bare: bool, keep: Path | None = None
) -> float:
    """Instructions per MiB on *side* (``slave`` or ``master``) copying *backlog* (one run)."""
    out = work / f"callgrind-{side}.out"
    wrapper = callgrind_command(out)
    slave_store = work / f"slave-{side}-{'bare' if bare else 'broker'}-{time.monotonic_ns()}"
    master_args = [*_node_args("master", backlog, bare), "--sync-from-oldest"]
    slave_args = _node_args("slave", slave_store, bare)
    if side == "slave":
        async with (
            open_child("_node", master_args, "master") as master,
            trio.open_nursery() as nursery,
        ):
            host, port = (await master.next_event("ready"))["ha"]
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            relay_port = listeners[0].socket.getsockname()[1]
            args = [*slave_args, "--master", f"127.0.0.1:{relay_port}", "--until", str(end)]
            async with open_child(
                "_node", [*args, "--counted"], "slave", DETERMINISTIC_ENV, wrapper
            ) as sl:
                await sl.next_event("ready")  # its window is open: let the bytes through
                assert isinstance(listeners[0], trio.SocketListener)
                nursery.start_soon(_relay, listeners[0], (host, port))
                await sl.next_event("counted")
                await sl.process.wait()
            nursery.cancel_scope.cancel()
    else:
        args = [*master_args, "--until", str(end), "--counted"]
        async with open_child("_node", args, "master", DETERMINISTIC_ENV, wrapper) as master:
            host, port = (await master.next_event("ready"))["ha"]
            args = [*slave_args, "--master", f"{host}:{port}"]
            async with open_child("_node", args, "slave"):
                await master.next_event("counted")
                await master.process.wait()
    return read_window(out, keep=keep) / (end / MIB)


def _kept(keep: Path | None, what: str) -> Path | None:
    """Where a run's profiles go (``callgrind.<what>.<n>-<thread>``), a new name per run."""
    if keep is None:
        return None
    keep.mkdir(parents=True, exist_ok=True)
    n = sum(1 for _ in keep.glob(f"callgrind.{what}.*-01"))
    return keep / f"callgrind.{what}.{n + 1}"


def _repeat(what: str, unit: str, repeat: int, one: Callable[[], float]) -> dict[str, Any]:
    runs = []
    for k in range(repeat):
        t0 = time.perf_counter()
        runs.append(one())
        print(f"  {what}, run {k + 1}: {runs[-1]:,.0f} {unit} ({time.perf_counter() - t0:.0f} s)")
    return {"what": what, "unit": unit, "runs": runs}


def _report(rows: list[dict[str, Any]]) -> None:
    print()
    print("| figure | runs | median | spread |")
    print("|---|---|---|---|")
    for row in rows:
        runs = row["runs"]
        med = statistics.median(runs)
        spread = (max(runs) - min(runs)) / med if med else 0.0
        listed = " / ".join(f"{r:,.0f}" for r in runs)
        print(f"| {row['what']} ({row['unit']}) | {listed} | {med:,.0f} | {spread:.3%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", default="send,slave,master", help="send, slave, master (catchup: both sides)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs of each figure")
    parser.add_argument("--bursts", type=int, default=100, help="send: bursts counted")
    parser.add_argument("--burst", type=int, default=32, help="send: sends per burst")
    parser.add_argument("--backlog-mib", type=int, default=128, help="catch-up: backlog size")
    parser.add_argument("--bare", action="store_true", help="catch-up: also the bare HA path")
    parser.add_argument(
        "--keep", type=Path, default=None, help="leave the callgrind profiles in this directory"
    )
    args = parser.parse_args()
    missing = valgrind_missing()
    if missing:
        sys.exit(f"instructions: {missing}")
    only = set(args.only.replace("catchup", "slave,master").split(","))
    sides = [side for side in ("slave", "master") if side in only]
    print(f"trioha build: {build_info().describe()}")
    rows = []
    if "send" in only:
        rows.append(
            _repeat(
                f"per send, bursts of {args.burst}",
                "instructions",
                args.repeat,
                lambda: count_sends(args.bursts, args.burst, _kept(args.keep, "send")),
            )
        )
    if sides:
        with tempfile.TemporaryDirectory(prefix="instructions-") as tmp:
            work = Path(tmp)
            backlog = work / "backlog"
            end = make_backlog(
                backlog, total=args.backlog_mib * MIB, segment_size=SEGMENT, body_size=1024
            )
            modes = [False, True] if args.bare else [False]
            for bare in modes:
                for side in sides:
                    label = (
                        f"per replicated MiB, {side}{', replication path alone' if bare else ''}"
                    )
                    rows.append(
                        _repeat(
                            label,
                            "instructions",
                            args.repeat,
                            lambda side=side, bare=bare: trio.run(  # type: ignore[misc]
                                functools.partial(
                                    count_catchup,
                                    work,
                                    backlog,
                                    end,
                                    side=side,
                                    bare=bare,
                                    keep=_kept(args.keep, f"{side}{'-bare' if bare else ''}"),
                                )
                            ),
                        )
                    )
    _report(rows)


if __name__ == "__main__":
    main()
