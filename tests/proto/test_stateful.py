"""The sans-IO master and slave, replicating through partial reads, drops, crashes and lies.

:class:`trioha.testing.ReplicationMachine` holds the rules and invariants (its docstring lists
them); this module runs it with options drawn per run and with a few fixed configurations, one
of them built from a :class:`~trioha.BrokerConfig` the way a user would.

Hypothesis remembers every example of a run, which for long stateful runs is about half a
megabyte each, so a profile asking for many examples (``nightly``) gets them in rounds of at
most :data:`ROUND` examples, each round a fresh Hypothesis run with fresh random choices.
Every failure Hypothesis has found is kept below as an explicit regression test.
"""

from __future__ import annotations

import itertools
import logging
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from trioha import BrokerConfig
from trioha.store import FileCommitLog
from trioha.testing import PairOptions, ReplicaLog, ReplicationMachine, replication_machine

ROUND = 1000

MACHINES: dict[str, tuple[type[ReplicationMachine], float]] = {
    # name: (machine, share of the profile's examples)
    "drawn-options": (ReplicationMachine, 1.0),
    "flushed-acks-tiny-frames": (
        replication_machine(PairOptions(segment_size=512, batch_size=3, ack_flushed=True)),
        0.25,
    ),
    "epoch-mode": (
        replication_machine(PairOptions(segment_size=1024, batch_size=64, epoch_mode=True)),
        0.25,
    ),
    "from-broker-config": (
        replication_machine(
            PairOptions.from_config(
                BrokerConfig(
                    mapped_file_size_commit_log=2048,
                    ha_transfer_batch_size=1000,
                    ha_sync_from_oldest=True,
                )
            )
        ),
        0.25,
    ),
}


def _rounds() -> list[tuple[str, int]]:
    examples = settings().max_examples
    out = []
    for name, (_machine, share) in MACHINES.items():
        wanted = max(10, int(examples * share))
        out += [(name, i) for i in range(math.ceil(wanted / ROUND))]
    return out


@pytest.fixture(autouse=True)
def _quiet_store() -> Iterator[None]:
    """Crashes truncate logs and the store logs each truncation; over a long run pytest would
    keep every one of those records in memory."""
    logger = logging.getLogger("trioha.store")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.mark.parametrize(("name", "round_"), _rounds())
def test_replication_machine(name: str, round_: int) -> None:
    machine, share = MACHINES[name]
    current = settings()
    per_round = min(ROUND, max(10, int(current.max_examples * share)))
    run_state_machine_as_test(machine, settings=settings(current, max_examples=per_round))


# --- failures Hypothesis found, kept as explicit programs ------------------------------------


class Replay:
    """Runs rules of a :class:`ReplicationMachine` by hand, checking the invariants after each
    step exactly as Hypothesis does (the failing programs it prints read the same way)."""

    def __init__(self, options: PairOptions) -> None:
        self.state = replication_machine(options)()
        self.state.setup(data=None)  # fixed options: nothing is drawn
        self.state.assert_invariants()

    def __getattr__(self, name: str) -> Any:
        rule = getattr(self.state, name)

        def step(**kwargs: Any) -> None:
            rule(**kwargs)
            self.state.assert_invariants()

        return step


SMALL = PairOptions(segment_size=512, batch_size=7)


def test_regression_slave_emptied_by_crash_resyncs() -> None:
    """Found by this machine: an empty log now starts over where the master serves it."""
    state = Replay(SMALL)
    state.connect()
    state.converge()  # both empty: the slave will start at 0
    state.put(body=b"", sync=False)
    state.converge()  # the slave holds [0, 100), none of it flushed
    state.slave_crashes(where=0.0, master_notices=True)  # back to an empty segment at 0
    for _ in range(5):
        state.put(body=b"", sync=False)  # the master's last segment now starts at 512
    state.converge()  # the slave asks for 0, is sent 512, cannot append, reconnects...


@pytest.mark.parametrize(
    "options",
    [SMALL, PairOptions(segment_size=512, batch_size=3, ack_flushed=True)],
    ids=["written-acks", "flushed-acks"],
)
def test_regression_put_ok_needs_the_put_on_the_slave(options: PairOptions) -> None:
    """Found by this machine (and model/): fixed by ``trioha.proto.vouch``."""
    state = Replay(options)
    state.converge()  # an empty slave connects and is streaming (ack 0)
    state.drop(master_notices=False, slave_notices=False)  # half-open: still counted
    for _ in range(3):
        state.put(body=b"", sync=False)  # [0, 300)
    state.put(body=b"", sync=True)  # [300, 400) waits for an ack of 400
    state.put(body=b"\x00" * 5, sync=False)  # starts the segment at 512
    # The dead link goes; the empty slave reconnects and is served from 512 (RocketMQ's rule
    # for a report of 0); its ack of 617 must not answer the put at [300, 400) PUT_OK.
    state.converge()


def test_regression_lie_judged_when_read() -> None:
    """A report beyond what was sent when written may be honest by the time it is read: the
    machine's lie is delivered at once, and the master must close."""
    state = Replay(SMALL)
    state.converge()
    state.slave_lies(beyond=1)  # asserts the master closed
    state.put(body=b"", sync=False)
    state.converge()


# --- the documented recipe for users (docs/testing.md), with the file commit log ---------------


def test_documented_recipe_with_file_logs(tmp_path: Path) -> None:
    """docs/testing.md: the same machine over real segment files, with a broker.conf's options."""
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "mappedFileSizeCommitLog=1024\nhaTransferBatchSize=100\nhaSlaveAckFlushed=true\n"
    )
    config = BrokerConfig.from_properties(conf)
    counter = itertools.count()
    opened: list[FileCommitLog] = []

    def file_log(segment_size: int, clock_ms: Callable[[], int]) -> ReplicaLog:
        log = FileCommitLog.open(
            tmp_path / f"log-{next(counter)}" / "commitlog",
            segment_size=segment_size,
            clock_ms=clock_ms,
        )
        opened.append(log)
        return log

    machine = replication_machine(PairOptions.from_config(config), log_factory=file_log)
    try:
        run_state_machine_as_test(
            machine, settings=settings(max_examples=5, stateful_step_count=30, database=None)
        )
    finally:
        for log in opened:
            log.close()


def test_importing_trioha_testing_needs_neither_pytest_nor_hypothesis() -> None:
    """Users embed ``trioha.testing`` in their own test set-ups; only the Hypothesis parts
    (strategies, the state machine) may load Hypothesis, and only when used."""
    code = (
        "import sys, trioha, trioha.testing\n"
        "from trioha.testing import ProtocolPair, FaultyStream, faulty_stream_pair\n"
        "assert 'pytest' not in sys.modules, 'pytest'\n"
        "assert 'hypothesis' not in sys.modules, 'hypothesis'\n"
        "from trioha.testing import ReplicationMachine\n"
        "assert 'hypothesis' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- classic mode: a master's power loss, the refusal, the operator's cut ---------------------


def test_power_loss_refuses_the_slave_holding_lost_bytes_until_it_is_cut_back() -> None:
    state = Replay(PairOptions(segment_size=512, batch_size=64))
    machine = state.state
    state.connect()
    state.put(body=b"", sync=False)
    state.converge()
    state.master_flushes()  # [0, 100) is durable on the master
    state.put(body=b"", sync=False)
    state.put(body=b"", sync=False)
    state.converge()  # the slave holds [0, 300); the master sent it all
    state.drop(master_notices=True, slave_notices=True)
    state.master_loses_power()  # the master is back at 100 and starts anew at 512
    pair = machine.p
    assert pair.master_lost == ((100, 300),)
    assert pair.master_log.max_offset == 512
    assert machine.holds_lost is not None
    for _ in range(5):
        state.put(body=b"", sync=False)  # the master's log grows far past the slave's 300
    state.connect()
    state.master_reads(which=0, n=8)  # refused: 300 is inside (100, 300]
    link = pair.links[-1]
    assert not link.master_open
    assert "inside [100, 300)" in link.closes[0][1]
    state.slave_reads(which=0, n=400)  # the refusal header: the master's history ends at 100
    assert "pushed offset 100 but the slave's log ends at 300" in link.closes[-1][1]
    state.connect()  # however often it comes back, it is refused and never served
    state.master_reads(which=0, n=8)
    state.slave_reads(which=0, n=400)
    state.truncate_to_master()
    assert pair.slave_log.max_offset == 100
    state.converge()  # the padding, then the new history, byte for byte
    assert pair.slave_is_prefix()
    assert pair.slave_log.max_offset == pair.master_log.max_offset
    # Healthy now, in the new history: it reconnects and is served, not refused.
    state.drop(master_notices=True, slave_notices=True)
    state.put(body=b"", sync=True)
    state.converge()
    assert pair.links[-1].master_open
    assert pair.slave_log.max_offset == pair.master_log.max_offset


def test_power_loss_leaves_a_slave_that_holds_nothing_lost_alone() -> None:
    state = Replay(PairOptions(segment_size=512, batch_size=64))
    state.connect()
    state.put(body=b"", sync=False)
    state.converge()
    state.master_flushes()
    state.drop(master_notices=True, slave_notices=True)
    state.put(body=b"", sync=False)  # no connection: [100, 200) is never sent
    state.master_loses_power()
    pair = state.state.p
    assert pair.master_lost == ()
    assert state.state.holds_lost is None
    state.put(body=b"", sync=False)
    state.converge()
    assert pair.slave_log.max_offset == pair.master_log.max_offset == 200
