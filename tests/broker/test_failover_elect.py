"""Handing the master role to a chosen member on purpose (``failover-elect``, RocketMQ's
``mqadmin electMaster``), with real etcd members and in-process brokers (docs/failover.md,
"Handing the master role over").

The groups are :mod:`tests.broker.test_failover`'s: three brokers, each behind its own proxy
to a real etcd on loopback, a 2 s lease. Every wait is bounded.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from tests.broker.test_failover import (
    Group,
    acked_by_all,
    etcd,
    put,
    read_log,
    running_group,
    wait_in_sync,
)
from trioha._errors import ConfigError, HandoverRefusedError
from trioha._status import PutStatus
from trioha.broker import Broker, producer_properties
from trioha.cli._tools import failover_elect, failover_state
from trioha.etcd import EtcdCluster
from trioha.store import NewMessage

__all__ = ["etcd"]  # the fixture, shared with test_failover


async def _produce(
    master: Broker, acked: list[tuple[int, int, bytes]], stop: trio.Event, start: int
) -> None:
    """Put to *master* until *stop*; remember every PUT_OK's offsets and body."""
    i = start
    while not stop.is_set():
        body = b"h%06d" % i
        result = await master.put(
            NewMessage(
                topic="FailoverTopic", body=body, properties=producer_properties({}, keys=f"h{i}")
            )
        )
        if result.status is PutStatus.PUT_OK:
            acked.append((result.offset, result.end_offset, body))
        i += 1
        await trio.lowlevel.checkpoint()


async def test_a_handover_makes_the_chosen_member_master_and_the_old_one_its_slave(
    tmp_path: Path, etcd: EtcdCluster
) -> None:
    async with running_group(tmp_path, etcd) as group:
        old, end = await acked_by_all(group, 30)
        old_id, old_epoch = group.id_of(old), old.master_epoch
        # The highest id: an ordinary election among equals would pick the lowest.
        target = max(bid for bid in group.brokers if bid != old_id)
        acked: list[tuple[int, int, bytes]] = []
        stop = trio.Event()
        out = io.StringIO()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_produce, old, acked, stop, 1000)
            await group.wait_for("puts acknowledged under load", lambda: len(acked) >= 20)
            done = await failover_elect(old.config, target, catch_up=10.0, out=out)
            stop.set()
        assert (done.master_id, done.old_master_id, done.old_epoch) == (target, old_id, old_epoch)
        assert done.epoch > old_epoch
        assert out.getvalue() == (
            f"failover-elect: broker {target} is master of epoch {done.epoch} (was broker "
            f"{old_id} at epoch {old_epoch}), handed over in {done.seconds:.2f} s\n"
        )
        new = group.brokers[target]
        await group.wait_for(
            "the target acknowledges", lambda: new.role.is_master and new._acking()
        )
        assert new.master_epoch == done.epoch and new.registered_id == 0
        # Not restarted: the same broker object, now a slave following the new master.
        assert group.brokers[old_id] is old
        await group.wait_for(
            "the old master follows the target",
            lambda: (
                not old.role.is_master and old.ha_client is not None and old.ha_client.connected
            ),
        )
        assert old.registered_id == old_id
        # Every acknowledged message is on the new master, where it was acknowledged.
        assert read_log(new, 0, end) == read_log(old, 0, end)
        for offset, stop_at, body in acked:
            assert body in read_log(new, offset, stop_at)
        # The target held the old master's whole log: following it cut nothing.
        client = old.ha_client
        assert client is not None
        assert all(to >= before for before, to in client.truncations)
        results = [await put(new, 5000 + i) for i in range(10)]
        assert {status for status, _, _ in results} == {PutStatus.PUT_OK}
        lines = await failover_state(new.config, out=io.StringIO())
        assert lines[1].startswith(f"master: broker {target}, epoch {done.epoch}, ")
        stats = old.statistics().failover
        assert stats is not None and stats.phase == "FOLLOWER" and stats.master_id == target
        # Asking again for the master it already is changes nothing.
        again = await failover_elect(new.config, target, out=io.StringIO())
        assert again.already and again.epoch == done.epoch
        # And back, through the command itself, once the old master has caught up and joined.
        await wait_in_sync(group, new, 3)
        conf = tmp_path / "elect.conf"
        conf.write_text(f"failoverEtcdEndpoints={etcd.endpoints[0]}\nfailoverLeaseTtl=2\n")
        command = [sys.executable, "-m", "trioha", "failover-elect", "-c", str(conf)]
        proc = await trio.run_process(
            [*command, "--broker-id", str(old_id)], capture_stdout=True, capture_stderr=True
        )
        line = proc.stdout.decode()
        assert re.fullmatch(
            rf"failover-elect: broker {old_id} is master of epoch {done.epoch + 1} \(was broker "
            rf"{target} at epoch {done.epoch}\), handed over in \d+\.\d\d s\n",
            line,
        ), line
        await group.wait_for("the old master acknowledges again", old._acking)
        assert old.master_epoch == done.epoch + 1


async def test_a_handover_is_refused_for_an_unknown_or_out_of_sync_target(
    tmp_path: Path, etcd: EtcdCluster
) -> None:
    async with running_group(tmp_path, etcd) as group:
        master, _end = await acked_by_all(group, 10)
        master_id, epoch = group.id_of(master), master.master_epoch
        lagging = max(bid for bid in group.brokers if bid != master_id)
        with pytest.raises(HandoverRefusedError, match=r"broker 9 is not registered .*"):
            await failover_elect(master.config, 9, out=io.StringIO())
        # The lagging broker stops replicating; it stays registered in etcd, and in the set
        # until haMaxTimeSlaveNotCatchup (5 s here) has passed.
        await group.brokers[lagging]._stop_ha_client()
        with pytest.raises(HandoverRefusedError, match="did not catch up in time"):
            await failover_elect(master.config, lagging, catch_up=0.5, out=io.StringIO())
        assert master.role.is_master and master.master_epoch == epoch
        await _wait_sync_state_set(group, master, lagging)
        with pytest.raises(HandoverRefusedError, match=rf"broker {lagging} is not in the Sync"):
            await failover_elect(master.config, lagging, out=io.StringIO())
        # The master acknowledges again, at the same epoch, after both refusals.
        await group.wait_for("the master acknowledges again", master._acking)
        assert (await put(master, 200))[0] is PutStatus.PUT_OK
        assert master.master_epoch == epoch
        # The command itself: one line on stderr and exit status 1.
        conf = tmp_path / "elect.conf"
        conf.write_text(f"failoverEtcdEndpoints={etcd.endpoints[0]}\nfailoverLeaseTtl=2\n")
        proc = await trio.run_process(
            [
                sys.executable,
                "-m",
                "trioha",
                "failover-elect",
                "-c",
                str(conf),
                "--broker-id",
                str(lagging),
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert proc.returncode == 1
        assert proc.stdout == b""
        err = proc.stderr.decode().strip().splitlines()
        assert err == [
            f"trioha failover-elect: error: broker {lagging} is not in the SyncStateSet "
            f"{sorted(set(group.brokers) - {lagging})}: it may not hold every acknowledged "
            "message; wait until it has caught up and joined"
        ]


async def _wait_sync_state_set(group: Group, master: Broker, without: int) -> None:
    def left() -> bool:
        stats = master.replica_manager.statistics() if master.replica_manager else None
        return stats is not None and without not in stats.sync_state_set

    await group.wait_for(f"broker {without} leaves the SyncStateSet", left)


def test_failover_elect_needs_the_etcd_endpoints_and_a_broker_id() -> None:
    from trioha._config import BrokerConfig

    with pytest.raises(ConfigError, match="failover-elect needs failoverEtcdEndpoints"):
        trio.run(failover_elect, BrokerConfig(), 2)
    config = BrokerConfig(failover_etcd_endpoints="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="--broker-id must be a failover broker id"):
        trio.run(failover_elect, config, 0)


async def test_failover_elect_says_when_etcd_cannot_be_reached(tmp_path: Path) -> None:
    from trioha._config import BrokerConfig
    from trioha._errors import CoordinatorError

    config = BrokerConfig(failover_etcd_endpoints="http://127.0.0.1:9")
    with pytest.raises(CoordinatorError, match=r"127\.0\.0\.1:9"):
        await failover_elect(config, 2, out=io.StringIO())


def test_failover_state_shows_a_pending_handover() -> None:
    from trioha.broker import describe_group
    from trioha.failover import GroupKeys, GroupView, Handover, HandoverState, KeyValue

    keys = GroupKeys.of("DefaultCluster", "broker-a")
    refused = Handover(3, 4, HandoverState.REFUSED, 5000, "broker 3 is not in the SyncStateSet")
    kvs = [KeyValue(keys.handover, refused.encode(), 7, 9), KeyValue(keys.epoch, b"4", 2, 8)]
    lines = describe_group(keys, 9, GroupView().snapshot(keys, 9, kvs))
    assert (
        "handover: refused, to broker 3, addressed to the master of epoch 4: broker 3 is not "
        "in the SyncStateSet"
    ) in lines
