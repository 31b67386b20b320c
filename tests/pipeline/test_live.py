"""Structured streaming against running brokers: puts land while the streams run.

A master (and, for the lag query, a slave) runs in-process on 127.0.0.1 in a Trio loop on its
own thread; the test thread drives Spark and asks the loop for puts. This is what the
``test_stream.py`` tests cannot show: a log written by the broker's own put path (async
flush, segments opened by the broker) while the driver walks its tail.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio

from trioha import BrokerConfig
from trioha._config import BrokerRole
from trioha.broker import Broker, open_broker, producer_properties
from trioha.store import NewMessage, open_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SEG = 64 * 1024
FAST: dict[str, Any] = {
    "mapped_file_size_commit_log": SEG,
    "ha_listen_port": 0,
    "listen_port": 0,
    "flush_interval_commit_log": 50,
    "ha_send_heartbeat_interval": 200,
    "ha_housekeeping_interval": 1000,
    "slave_timeout": 500,
    "ha_reconnect_backoff_max": 200,
}


class LiveBroker:
    """A broker running in a Trio loop on a thread; :meth:`call` runs a coroutine there."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker: Broker | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test thread by start/close
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with open_broker(self.config) as broker:
            self.broker = broker
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()

    def start(self) -> LiveBroker:
        self._thread.start()
        if not self._ready.wait(30) or self.broker is None:
            raise RuntimeError(f"broker did not start: {self._error!r}")
        return self

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def close(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)
        assert not self._thread.is_alive(), "broker did not stop"
        if self._error is not None:
            raise self._error

    @property
    def root(self) -> Path:
        return Path(self.config.store_path_root_dir)

    def put(self, first: int, count: int) -> None:
        """Put messages *first* .. *first* + *count*, each waiting for its put result."""
        broker = self.broker
        assert broker is not None

        async def puts() -> None:
            for i in range(first, first + count):
                result = await broker.put(
                    NewMessage(
                        topic=f"{i % 3:03d}",
                        body=bytes([i % 251]) * (200 + i % 700),
                        queue_id=i % 4,
                        properties=producer_properties(keys=f"k{i}"),
                    )
                )
                assert result.status.name == "PUT_OK", result

        self.call(puts)

    def flushed(self) -> int:
        """Flush the commit log now; the written end."""
        broker = self.broker
        assert broker is not None

        async def flush() -> int:
            await broker.flush_commitlog()
            return broker.store.commitlog.max_offset

        return int(self.call(flush))


@contextmanager
def running(config: BrokerConfig) -> Iterator[LiveBroker]:
    live = LiveBroker(config).start()
    try:
        yield live
    finally:
        live.close()


def master_config(root: Path) -> BrokerConfig:
    return BrokerConfig(broker_role=BrokerRole.ASYNC_MASTER, store_path_root_dir=str(root), **FAST)


def stored_offsets(root: Path) -> list[int]:
    with open_store(root, segment_size=SEG) as store:
        return [m.physical_offset for m in store.commitlog.iter_messages()]


def export(spark: SparkSession, root: Path, out: Path, checkpoint: Path) -> Any:
    from trioha.pipeline import start_stream

    return start_stream(
        spark.readStream.format("commitlog")
        .load(str(root))
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
    )


def test_a_continuous_export_of_a_running_master_is_exactly_once_across_a_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    with running(master_config(tmp_path / "master")) as master:
        master.put(0, 30)
        query = export(spark, master.root, out, checkpoint)
        try:
            master.put(30, 150)  # while the stream runs: crosses segment boundaries
            query.processAllAvailable()
        finally:
            query.stop()
        master.put(180, 60)  # while no stream runs
        query = export(spark, master.root, out, checkpoint)
        try:
            master.put(240, 60)
            end = master.flushed()
            query.processAllAvailable()
        finally:
            query.stop()
    expected = stored_offsets(tmp_path / "master")
    assert len(expected) == 300 and expected[-1] < end
    rows = spark.read.parquet(str(out)).select("physical_offset", "topic", "keys").collect()
    assert sorted(r.physical_offset for r in rows) == expected  # none missing, none twice
    assert {r.topic for r in rows} == {"000", "001", "002"}
    assert sorted(int(r["keys"][1:]) for r in rows) == list(range(300))


def lag_stream(spark: SparkSession, master: Path, slave: Path) -> DataFrame:
    """Each side's log end as seen in a micro-batch: the documented replication-lag query."""
    from pyspark.sql import functions as F

    def side(name: str, root: Path) -> DataFrame:
        return (
            spark.readStream.format("commitlog")
            .load(str(root))
            .select(
                F.lit(name).alias("side"),
                (F.col("physical_offset") + F.col("size")).alias("end"),
            )
        )

    return side("master", master).unionByName(side("slave", slave))


def test_a_streaming_replication_lag_query_over_a_master_and_a_slave(
    spark: SparkSession, tmp_path: Path
) -> None:
    from trioha.pipeline import start_stream

    seen: dict[str, int] = {"master": 0, "slave": 0}
    lags: list[int] = []

    def batch(df: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        for row in df.groupBy("side").agg(F.max("end").alias("end")).collect():
            seen[row.side] = max(seen[row.side], int(row.end))
        lags.append(seen["master"] - seen["slave"])

    slave_root = tmp_path / "slave"
    (slave_root / "commitlog").mkdir(parents=True)
    with running(master_config(tmp_path / "master")) as master:
        master.put(0, 100)
        end = master.flushed()
        query = start_stream(
            lag_stream(spark, master.root, slave_root)
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="100 milliseconds")
        )
        try:
            query.processAllAvailable()
            assert seen == {"master": end, "slave": 0} and lags[-1] == end  # no slave yet
            assert master.broker is not None and master.broker.ha_address is not None
            host, port = master.broker.ha_address
            slave_config = BrokerConfig(
                broker_role=BrokerRole.SLAVE,
                store_path_root_dir=str(slave_root),
                ha_master_address=f"{host}:{port}",
                **FAST,
            )
            with running(slave_config) as slave:
                master.put(100, 100)  # replicated while both streams run
                end = master.flushed()

                async def caught_up() -> None:
                    assert slave.broker is not None
                    with trio.fail_after(20):
                        while (at := slave.broker.store.commitlog.max_offset) < end:
                            await slave.broker.wait_log_grew(at, trio.current_time() + 0.5)
                    await slave.broker.flush_commitlog()

                slave.call(caught_up)
                query.processAllAvailable()
        finally:
            query.stop()
    assert seen == {"master": end, "slave": end}
    assert lags[-1] == 0 and max(lags) > 0
