"""A broker: a commit log store, HA replication by role, and the put API, as one Trio service.

``async with open_broker(config) as broker`` runs a master (ASYNC_MASTER or SYNC_MASTER: the HA
service plus puts) or a slave (the HA client; puts are refused) until the block exits, then
stops every task and closes the store cleanly (its ``abort`` marker removed).

The put path mirrors ``CommitLog.asyncPutMessage`` (spec §5.1): append under the (here: the
event loop's) put lock, then a flush request by ``flush_disk_type`` and a replica request by
role, the two waited on together; the replica status wins when both fail.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from trioha._config import BrokerConfig, BrokerRole, FlushDiskType
from trioha._errors import MessageTooLargeError, StorageError
from trioha._status import PutResult, PutStatus
from trioha.broker._clientside import ClientSide, serve_client_side
from trioha.net import HAClient, HAClientStatistics, HAService, HAServiceStatistics
from trioha.net._waiters import OffsetWaiters
from trioha.net._wakeup import Wakeup
from trioha.store import AppendResult, HostAddress, Store, open_store
from trioha.store._message import PROPERTY_KEYS, PROPERTY_TAGS

log = logging.getLogger("trioha.broker")


@attrs.frozen
class BrokerStatistics:
    """A snapshot of a broker (``Broker.statistics()``)."""

    role: BrokerRole
    min_offset: int
    max_offset: int
    flushed_offset: int
    puts: int
    ha: HAServiceStatistics | None
    client: HAClientStatistics | None


class _GroupFlusher:
    """SYNC_FLUSH's ``GroupCommitService``: one fsync serves every put waiting for it."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.waiters = OffsetWaiters(
            broker.config.sync_flush_timeout / 1000,
            covered=PutStatus.PUT_OK,
            expired=PutStatus.FLUSH_DISK_TIMEOUT,
        )
        self.wakeup = Wakeup()

    async def wait_flushed(self, end: int) -> PutStatus:
        if self.broker.store.commitlog.flushed_offset >= end:
            return PutStatus.PUT_OK
        self.wakeup.notify()
        return await self.waiters.wait(end)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        commitlog = self.broker.store.commitlog
        async with trio.open_nursery() as nursery:
            await nursery.start(self.waiters.expire)
            task_status.started()
            while True:
                if not self.waiters:
                    await self.wakeup.wait()
                    continue
                self.waiters.release(await trio.to_thread.run_sync(commitlog.flush))


def message_record(message: Mapping[str, Any]) -> dict[str, Any]:
    """A put's keyword arguments as the store's ``append_batch`` takes them.

    ``tags`` and ``keys`` become RocketMQ's TAGS and KEYS properties (several keys joined by
    spaces, as ``Message.setKeys``); the born timestamp defaults to now.
    """
    props = dict(message.get("properties") or {})
    keys = message.get("keys")
    if keys:
        props[PROPERTY_KEYS] = keys if isinstance(keys, str) else " ".join(keys)
    if message.get("tags"):
        props[PROPERTY_TAGS] = message["tags"]
    record: dict[str, Any] = {
        "topic": message["topic"],
        "body": bytes(message["body"]),
        "queue_id": message.get("queue_id", 0),
        "flag": message.get("flag", 0),
        "sysflag": message.get("sysflag", 0),
        "properties": props,
        "born_timestamp": message.get("born_timestamp") or int(time.time() * 1000),
        "reconsume_times": message.get("reconsume_times", 0),
    }
    if message.get("born_host") is not None:
        record["born_host"] = message["born_host"]
    return record


def _appended(result: AppendResult) -> PutResult:
    """A stored message's result before the flush and replication policies are waited for."""
    return PutResult(
        PutStatus.PUT_OK,
        offset=result.physical_offset,
        end_offset=result.end_offset,
        queue_offset=result.queue_offset,
        msg_id=result.msg_id,
    )


class Broker:
    """A running broker; obtain one from :func:`open_broker`."""

    def __init__(self, config: BrokerConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.role = config.broker_role
        self.ha_service: HAService | None = None
        self.ha_client: HAClient | None = None
        self.ha_address: tuple[str, int] | None = None
        #: The client side (broker port, consume queues, name server registration, metadata
        #: sync), once started; ``client_side.broker_addr`` is the bound broker address.
        self.client_side: ClientSide | None = None
        self._flusher = _GroupFlusher(self)
        self._log_grew = Wakeup()
        self._puts = 0
        self._closed = False

    # --- the put API ------------------------------------------------------------------------
    async def put(
        self,
        *,
        topic: str,
        body: bytes,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        queue_id: int = 0,
        flag: int = 0,
        sysflag: int = 0,
        born_timestamp: int | None = None,
        born_host: tuple[str, int] | None = None,
        reconsume_times: int = 0,
    ) -> PutResult:
        """Store one message; returns when the flush and replication policies are satisfied."""
        return await self.put_batch(
            [
                {
                    "topic": topic,
                    "body": body,
                    "tags": tags,
                    "keys": keys,
                    "properties": properties,
                    "queue_id": queue_id,
                    "flag": flag,
                    "sysflag": sysflag,
                    "born_timestamp": born_timestamp,
                    "born_host": born_host,
                    "reconsume_times": reconsume_times,
                }
            ]
        )

    async def put_batch(self, messages: Sequence[Mapping[str, Any]]) -> PutResult:
        """Store several messages as consecutive records (RocketMQ's batch put)."""
        if self._closed or not self.role.is_master:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE)
        if not messages:
            return PutResult(PutStatus.MESSAGE_ILLEGAL)
        results = self._append([message_record(message) for message in messages])
        if isinstance(results, PutStatus):
            return PutResult(results)
        self._on_log_grew()
        first, last = results[0], results[-1]
        status = await self._wait_policies(first.physical_offset, last.end_offset)
        return PutResult(
            status,
            offset=first.physical_offset,
            end_offset=last.end_offset,
            queue_offset=first.queue_offset,
            msg_id=first.msg_id,
        )

    def append_each(self, messages: Sequence[Mapping[str, Any]]) -> list[PutResult]:
        """Append independent messages now, without waiting; one result per message.

        What a burst of sends from one read needs: the valid messages are appended in one
        write (a refused one is appended alone to find it), and the log's growth is announced
        once. A stored message's result says PUT_OK and where it is; the flush and
        replication policies are still to be waited for, once, with :meth:`wait_stored` up
        to the last one's ``end_offset``. A refused message's result carries its status.
        """
        if self._closed or not self.role.is_master:
            return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE) for _ in messages]
        records = [message_record(message) for message in messages]
        together = self._append(records) if len(records) > 1 else None
        if isinstance(together, list):
            out = [_appended(r) for r in together]
        else:
            out = []
            for record in records:
                one = self._append([record])
                out.append(PutResult(one) if isinstance(one, PutStatus) else _appended(one[0]))
        if any(result.offset >= 0 for result in out):
            self._on_log_grew()
        return out

    async def wait_stored(self, start: int, end: int) -> PutStatus:
        """Wait for the flush and replication policies to cover ``[start, end)``."""
        return await self._wait_policies(start, end)

    def _append(self, records: list[dict[str, Any]]) -> list[AppendResult] | PutStatus:
        """Append records as one batch; the refusal's status when the store refuses them."""
        try:
            results = self.store.commitlog.append_batch(records)
        except MessageTooLargeError as exc:
            log.warning("put refused: %s", exc)
            if "propert" in str(exc):
                return PutStatus.PROPERTIES_SIZE_EXCEEDED
            return PutStatus.MESSAGE_ILLEGAL
        except (ValueError, TypeError) as exc:
            log.warning("put refused: %s", exc)
            return PutStatus.MESSAGE_ILLEGAL
        except StorageError as exc:
            log.error("put failed: %s", exc)
            return PutStatus.CREATE_MAPPED_FILE_FAILED
        self._puts += len(results)
        return results

    async def _wait_policies(self, start: int, end: int) -> PutStatus:
        sync_flush = self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        sync_replica = self.role is BrokerRole.SYNC_MASTER and self.ha_service is not None
        if not sync_flush and not sync_replica:
            # Nothing to wait for, but a put is still a checkpoint: a loop of ASYNC puts must
            # not starve the tasks that replicate what it writes.
            await trio.lowlevel.checkpoint()
            return PutStatus.PUT_OK
        if not sync_flush:
            assert self.ha_service is not None
            return await self.ha_service.wait_replicated(end, start=start)
        if not sync_replica:
            return await self._flusher.wait_flushed(end)
        assert self.ha_service is not None
        statuses: dict[str, PutStatus] = {}

        async def flush() -> None:
            statuses["flush"] = await self._flusher.wait_flushed(end)

        async def replica() -> None:
            assert self.ha_service is not None
            statuses["replica"] = await self.ha_service.wait_replicated(end, start=start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            nursery.start_soon(replica)
        # handleDiskFlushAndHA: a failed replica status overrides a failed flush status.
        if statuses["replica"] is not PutStatus.PUT_OK:
            return statuses["replica"]
        return statuses["flush"]

    # --- log growth -------------------------------------------------------------------------
    def _on_log_grew(self) -> None:
        if self.ha_service is not None:
            self.ha_service.notify_log_grew()
        self._log_grew.notify()

    async def wait_log_grew(self, beyond_offset: int, deadline: float = math.inf) -> bool:
        """Wait until the commit log ends beyond *beyond_offset*; False at *deadline*."""
        if deadline == math.inf:  # the reput service's wait, once per batch: no cancel scope
            await self._wait_grown(beyond_offset)
            return True
        with trio.move_on_at(deadline):
            await self._wait_grown(beyond_offset)
            return True
        return False

    async def _wait_grown(self, beyond_offset: int) -> None:
        while self.store.commitlog.max_offset <= beyond_offset:
            await self._log_grew.wait()

    # --- running ----------------------------------------------------------------------------
    async def _run_async_flusher(self) -> None:
        """ASYNC_FLUSH's ``FlushRealTimeService``: flush what is written every interval."""
        commitlog = self.store.commitlog
        interval = self.config.flush_interval_commit_log / 1000
        while True:
            await trio.sleep(interval)
            if commitlog.max_offset > commitlog.flushed_offset:
                await trio.to_thread.run_sync(commitlog.flush)

    async def _start(self, nursery: trio.Nursery) -> None:
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH and self.role.is_master:
            await nursery.start(self._flusher.run)
        else:
            nursery.start_soon(self._run_async_flusher)
        if self.role.is_master:
            self.ha_service = HAService(self.config, self.store.commitlog)
            self.ha_address = await nursery.start(self.ha_service.serve)
            if self.role is BrokerRole.SYNC_MASTER and self.config.required_slave_acks == 0:
                log.warning(
                    "SYNC_MASTER with in_sync_replicas=%d waits for no slave (as RocketMQ 5.x)",
                    self.config.in_sync_replicas,
                )
        else:
            self.ha_client = HAClient(
                self.config, self.store.commitlog, on_appended=self._on_log_grew
            )
            await nursery.start(self.ha_client.run)
        self.client_side = await nursery.start(serve_client_side, self)

    def statistics(self) -> BrokerStatistics:
        commitlog = self.store.commitlog
        return BrokerStatistics(
            role=self.role,
            min_offset=commitlog.min_offset,
            max_offset=commitlog.max_offset,
            flushed_offset=commitlog.flushed_offset,
            puts=self._puts,
            ha=self.ha_service.statistics() if self.ha_service else None,
            client=self.ha_client.statistics() if self.ha_client else None,
        )


@asynccontextmanager
async def open_broker(config: BrokerConfig) -> AsyncIterator[Broker]:
    """Open the store under ``config.store_path_root_dir`` and run the broker by role."""
    store = await trio.to_thread.run_sync(
        lambda: open_store(
            config.store_root,
            segment_size=config.mapped_file_size_commit_log,
            flush_disk_type=config.flush_disk_type,
            flush_interval_ms=config.flush_interval_commit_log,
            check_crc=config.check_crc_on_recover,
            store_host=HostAddress(config.broker_ip1, config.listen_port),
            max_message_size=config.max_message_size,
        )
    )
    try:
        broker = Broker(config, store)
        async with trio.open_nursery() as nursery:
            await broker._start(nursery)
            log.info(
                "%s started: store %s, log [%d, %d)",
                config.broker_role.value,
                config.store_root,
                store.commitlog.min_offset,
                store.commitlog.max_offset,
            )
            try:
                yield broker
            finally:
                broker._closed = True
                nursery.cancel_scope.cancel()
    finally:
        # Shielded: a broker stopped by an outer cancellation must still release its store
        # (lock, abort marker), or a restart in the same process finds it locked.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.close)
        log.info("%s stopped; store closed cleanly", config.broker_role.value)
