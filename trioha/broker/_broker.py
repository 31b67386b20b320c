"""A broker: a commit log store, HA replication by role, and the put API, as one Trio service.

``async with open_broker(config) as broker`` runs a master (ASYNC_MASTER or SYNC_MASTER: the HA
service plus puts) or a slave (the HA client; puts are refused) until the block exits, then
stops every task and closes the store cleanly (its ``abort`` marker removed).

With automatic failover (``config.failover``: ``enableControllerMode`` and etcd endpoints,
docs/failover.md) the role is runtime state that etcd decides: the broker starts as a slave
that follows nobody, its replica manager (:mod:`._failover`) campaigns and follows, and
:meth:`Broker.become_master` / :meth:`Broker.become_slave` change the role in the running
process through the one place that switches it, :meth:`Broker._switch_role`. A master then
acknowledges a put only under failover mode's ack rule (``trioha.proto.InSyncQuorum``) and
only before its lease deadline, both asked when the put completes.

The put path mirrors ``CommitLog.asyncPutMessage`` (docs/rocketmq-protocol.md §5.1): append under
the (here: the event loop's) put lock, then a flush request by ``flush_disk_type`` and a replica
request by role, the two waited on together; the replica status wins when both fail.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from trioha._build import build_info
from trioha._config import BrokerConfig, BrokerRole
from trioha._errors import ConfigError, StorageError
from trioha._histogram import HistogramSnapshot, LatencyHistogram
from trioha._progress import Progress
from trioha._status import PutResult, PutStatus, refusal_status
from trioha.acl import HASecurity
from trioha.broker._clientside import ClientSide, serve_client_side
from trioha.broker._delaylevels import apply_delay_levels, parse_delay_levels
from trioha.broker._failover import (
    FailoverStatistics,
    ReplicaManager,
    failover_options,
    open_replica_manager,
)
from trioha.broker._retention import RetentionService, RetentionStatistics
from trioha.failover import MasterRecord, Unsafe
from trioha.net import (
    DIVERGED_FILE,
    HAClient,
    HAClientStatistics,
    HAService,
    HAServiceStatistics,
    MarkKeeper,
    OffsetWaiters,
    Wakeup,
    former_master_divergence,
    open_master_history,
)
from trioha.store import (
    COMMIT_LOG,
    COMMIT_LOG_FLUSH,
    EPOCH_FILE_NAME,
    AppendResult,
    DiskGuard,
    DiskStatistics,
    EpochFile,
    FlushDiskType,
    HostAddress,
    NewMessage,
    SentOffsets,
    Store,
    forget_master_marks,
    open_store,
)

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
    #: Whether puts are taken and why not (disk usage, failing writers).
    disk: DiskStatistics
    #: Which build runs: ``pure Python`` or ``compiled (mypyc: N modules)`` (trioha/_build.py).
    build: str
    #: Messages answered so far, by ``PutStatus`` name.
    put_results: dict[str, int] = attrs.field(factory=dict)
    #: Time from a put's arrival to its answer: ``sync`` (a SYNC_MASTER waiting for slaves)
    #: or ``async``.
    put_latency: dict[str, HistogramSnapshot] = attrs.field(factory=dict)
    #: What retention has done (None until it runs).
    retention: RetentionStatistics | None = None
    #: Automatic failover: the replica manager's state (None without failover).
    failover: FailoverStatistics | None = None

    @property
    def disk_used_ratio(self) -> float:
        """The commit log file system's used share (0-1), as the disk guard last measured."""
        return self.disk.commitlog_ratio


#: How often a failover put waits again when the SyncStateSet grew while it waited.
_IN_SYNC_ROUNDS = 4


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
        async with trio.open_nursery() as nursery:
            await nursery.start(self.waiters.expire)
            task_status.started()
            while True:
                if not self.waiters:
                    await self.wakeup.wait()
                    continue
                flushed = await self.broker.flush_commitlog()
                if flushed is None:  # the flush failed; puts waiting for it time out
                    await trio.sleep(self.broker.disk_check_interval)
                    continue
                self.waiters.release(flushed)


def _appended(first: AppendResult, last: AppendResult) -> PutResult:
    """A stored put's result (its first and last record) before the flush and replication
    policies are waited for."""
    return PutResult(
        PutStatus.PUT_OK,
        first.physical_offset,
        last.physical_offset + last.size,
        first.queue_offset,
        first.msg_id,
    )


class Broker:
    """A running broker; obtain one from :func:`open_broker`."""

    def __init__(
        self,
        config: BrokerConfig,
        store: Store,
        *,
        sent: SentOffsets | None = None,
        config_file: Path | None = None,
    ) -> None:
        self.config = config
        #: The ``-c`` file the broker was started with: UPDATE_BROKER_CONFIG writes there.
        self.config_file = config_file
        self.store = store
        #: A master's durable sent, acknowledged and flushed marks (divergence checks).
        self.sent = sent
        self.role = config.broker_role
        self.ha_service: HAService | None = None
        self.ha_client: HAClient | None = None
        self.ha_address: tuple[str, int] | None = None
        #: The client side (broker port, consume queues, name server registration, metadata
        #: sync), once started; ``client_side.broker_addr`` is the bound broker address.
        self.client_side: ClientSide | None = None
        #: Deletes old files (``cleanFilesPeriodically``), once the client side runs.
        self.retention: RetentionService | None = None
        self._client_side_ready = trio.Event()
        #: Epoch mode (``enable_controller_mode``): the store's epoch history.
        self.epoch_file: EpochFile | None = None
        warning, clean_forcibly, max_used = config.disk_ratios
        self.disk = DiskGuard(
            {"CL": store.commitlog.directory, "CQ": store.root},
            warning_ratio=warning,
            clean_forcibly_ratio=clean_forcibly,
            max_used_ratio=max_used,
            master=config.broker_role.is_master,
        )
        self.disk_check_interval = config.clean_resource_interval / 1000
        #: A master's marks as the HA writers and the put path reserve them.
        self.marks = (
            MarkKeeper(sent, disk=self.disk, retry_interval=self.disk_check_interval)
            if sent is not None
            else None
        )
        #: Whether a PUT_OK must first be covered by the acknowledged mark: not with
        #: SYNC_FLUSH, where every acknowledged byte is flushed, which a crash never loses.
        self._mark_acked = (
            self.marks is not None and config.flush_disk_type is not FlushDiskType.SYNC_FLUSH
        )
        self._flusher = _GroupFlusher(self)
        self._log_grew = Wakeup()
        self._puts = 0
        self._put_results: collections.Counter[str] = collections.Counter()
        #: Put latency by replication mode; a master's mode is fixed by its role.
        self._put_mode = "sync" if config.broker_role is BrokerRole.SYNC_MASTER else "async"
        self._put_latency = LatencyHistogram()
        self._max_delay_level = len(parse_delay_levels(config.message_delay_level))
        self._closed = False
        # --- automatic failover (docs/failover.md) ---
        #: The replica manager, while it runs (None without failover).
        self.replica_manager: ReplicaManager | None = None
        #: Bumped at every role change: a put decided under another role is not acknowledged.
        self._generation = 0
        #: A master acknowledges while ``trio.current_time()`` is below this (failover: the
        #: lease deadline; otherwise always).
        self._ack_until = -math.inf if config.failover else math.inf
        #: The end of the last put answered PUT_OK (the core's confirm offset).
        self._confirm_offset = 0
        #: The epoch this broker is master of (0: not master, or not in failover mode).
        self.master_epoch = 0
        #: The broker id it registers with the name servers as (0: the group's master).
        self.registered_id = config.failover_broker_id if config.failover else config.broker_id
        self._role_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._ha_client_scope: trio.CancelScope | None = None
        self._ha_client_done: trio.Event | None = None
        if config.failover:
            # Nobody is master until etcd says so: start as a slave that follows no one.
            self.role = BrokerRole.SLAVE
            self.config = config.evolve(
                broker_role=BrokerRole.SLAVE, broker_id=config.failover_broker_id
            )
            self.disk.master = False

    # --- the put API ------------------------------------------------------------------------
    async def put(self, message: NewMessage) -> PutResult:
        """Store one message; returns when the flush and replication policies are satisfied.

        Never raises for a refused message: the status says why (see :meth:`put_batch`).
        """
        return await self.put_batch([message])

    def count_puts(self, status: PutStatus, messages: int, seconds: float) -> None:
        """*messages* puts were answered *status* after *seconds* (for ``statistics()``)."""
        self._put_results[status.name] += messages
        self._put_latency.observe(seconds, messages)

    async def put_batch(
        self, messages: Sequence[NewMessage], *, delivery: bool = False
    ) -> PutResult:
        """Store several messages as consecutive records (RocketMQ's batch put); see
        :meth:`_put_batch`. Counted by status and latency."""
        started = time.perf_counter()
        result = await self._put_batch(messages, delivery=delivery)
        self.count_puts(result.status, max(1, len(messages)), time.perf_counter() - started)
        return result

    async def _put_batch(
        self, messages: Sequence[NewMessage], *, delivery: bool = False
    ) -> PutResult:
        """Store several messages as consecutive records (RocketMQ's batch put).

        A message with a ``DELAY`` level is stored in its level's queue of
        ``SCHEDULE_TOPIC_XXXX`` (:func:`~trioha.broker._delaylevels.apply_delay_levels`), unless
        ``delivery`` says this is the delivery of such a message, which also waits for neither
        flush nor replicas (``waitStoreMsgOK`` false, as ``ScheduleMessageService`` puts).

        A refusal is a status, never an exception: SERVICE_NOT_AVAILABLE on a slave or a
        stopped broker, the status :func:`~trioha._status.refusal_status` gives for what the
        store refused (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED, CREATE_MAPPED_FILE_FAILED),
        and the flush and replication outcomes (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
        SLAVE_NOT_AVAILABLE) once stored.
        """
        refused = self._refusal()
        if refused is not None:
            return PutResult(refused)
        if not messages:
            return PutResult(PutStatus.MESSAGE_ILLEGAL)
        results = self._append(messages, delivery=delivery)
        if isinstance(results, PutStatus):
            return PutResult(results)
        self._on_log_grew()
        first, last = results[0], results[-1]
        if delivery:
            await trio.lowlevel.checkpoint()
            status = PutStatus.PUT_OK
        else:
            status = await self._wait_policies(first.physical_offset, last.end_offset)
        return PutResult(
            status,
            offset=first.physical_offset,
            end_offset=last.end_offset,
            queue_offset=first.queue_offset,
            msg_id=first.msg_id,
        )

    def append_each(self, puts: Sequence[Sequence[NewMessage]]) -> list[PutResult]:
        """Append independent puts now, without waiting; one result per put.

        What the sends of one read need: each put is one message, or a batch's messages as
        consecutive records of one segment. Every valid put is appended in one write (when
        one of them is refused, each is appended alone to find it), and the log's growth is
        announced once. A stored put's result says PUT_OK and where it is (its first
        record's offset, queue offset and message id, its last record's end); the flush and
        replication policies are still to be waited for, once, with :meth:`wait_stored` up to
        the last one's ``end_offset``. A refused put's result carries its status.
        """
        refused = self._refusal()
        if refused is not None:
            return [PutResult(refused) for _ in puts]
        together: list[AppendResult] | PutStatus | None = None
        if len(puts) > 1:
            together = self._append([message for put in puts for message in put])
        out: list[PutResult] = []
        if isinstance(together, list):
            if len(together) == len(puts):  # a message each: the usual read of sends
                out = [_appended(result, result) for result in together]
            else:
                i = 0
                for put in puts:
                    n = len(put)
                    out.append(_appended(together[i], together[i + n - 1]))
                    i += n
            grew = True
        else:
            grew = False
            for put in puts:
                alone = self._append(put)
                if isinstance(alone, PutStatus):
                    out.append(PutResult(alone))
                else:
                    out.append(_appended(alone[0], alone[-1]))
                    grew = True
        if grew:
            self._on_log_grew()
        return out

    async def wait_stored(self, start: int, end: int) -> PutStatus:
        """Wait for the flush and replication policies to cover ``[start, end)``."""
        return await self._wait_policies(start, end)

    def _append(
        self, messages: Sequence[NewMessage], *, delivery: bool = False
    ) -> list[AppendResult] | PutStatus:
        """Append messages as one batch; the refusal's status when they cannot be stored.

        Refused up front while the disk guard says the store is not writable
        (``checkStoreStatus``); delayed messages go to their level's schedule queue unless
        this is their delivery; a store refusal becomes its status through
        :func:`~trioha._status.refusal_status`, and an OS error goes to the disk guard.
        """
        if not self.disk.writable:
            # checkStoreStatus: RunningFlags not writeable (DISK_FULL, a failing writer).
            self.disk.refused += 1
            return PutStatus.SERVICE_NOT_AVAILABLE
        try:
            if not delivery:
                messages = apply_delay_levels(messages, self._max_delay_level)
            results = self.store.commitlog.append_batch(messages)
        except (StorageError, ValueError) as exc:  # ValueError: no UTF-8 topic, no host address
            status = refusal_status(exc)
            if isinstance(exc.__cause__, OSError):  # the disk, not the request
                self.disk.failed(COMMIT_LOG, exc)
            elif status is PutStatus.CREATE_MAPPED_FILE_FAILED:
                log.error("put failed: %s", exc)
            else:
                log.warning("put refused: %s", exc)
            return status
        if self.disk.failing(COMMIT_LOG):
            self.disk.succeeded(COMMIT_LOG)
        self._puts += len(results)
        return results

    def _refusal(self) -> PutStatus | None:
        """Why no put is taken now (None: they are): a slave or a stopped broker, and with
        failover a fenced master, or a SyncStateSet smaller than ``minInSyncReplicas``
        (nothing is stored then)."""
        if self._closed or not self.role.is_master:
            return PutStatus.SERVICE_NOT_AVAILABLE
        if self.config.failover:
            if not self._acking():
                return PutStatus.SERVICE_NOT_AVAILABLE
            assert self.ha_service is not None
            if not self.ha_service.in_sync_quorum().enough_members():
                return PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH
        return None

    def _acking(self) -> bool:
        """May this master acknowledge now (before its lease deadline)?"""
        return trio.current_time() < self._ack_until

    async def _wait_in_sync(self, start: int, end: int) -> PutStatus:
        """Failover mode's put: the master's own copy flushed, then every SyncStateSet member
        holding it and ``minInSyncReplicas`` copies, asked again when the put resumes, under
        the same role and before the lease deadline (docs/failover.md, "The ack rule")."""
        generation = self._generation
        flushed = await self._flusher.wait_flushed(end)
        if flushed is not PutStatus.PUT_OK:
            return flushed
        ha = self.ha_service
        assert ha is not None
        # The set may grow while the put waits (a slave that caught up joins): wait again
        # for the newcomer, a few times at most.
        for _ in range(_IN_SYNC_ROUNDS):
            status = await ha.wait_in_sync(end, start=start)
            if status is not PutStatus.PUT_OK:
                return status
            if generation != self._generation or not self._acking():
                return PutStatus.FLUSH_SLAVE_TIMEOUT
            if ha.in_sync_holds(start, end):
                self._confirm_offset = max(self._confirm_offset, end)
                return PutStatus.PUT_OK
        return PutStatus.FLUSH_SLAVE_TIMEOUT

    async def _wait_policies(self, start: int, end: int) -> PutStatus:
        if self.config.failover:
            return await self._wait_in_sync(start, end)
        status = await self._wait_flush_and_replicas(start, end)
        if status is PutStatus.PUT_OK and self._mark_acked:
            marks = self.marks
            assert marks is not None
            if not marks.covers_acked(end) and not await marks.cover_acked(end):
                # Stored, flushed and replicated as asked, but this master could not record
                # that it answered PUT_OK, so it could not promise to keep it after a crash.
                return PutStatus.FLUSH_DISK_TIMEOUT
        return status

    async def _wait_flush_and_replicas(self, start: int, end: int) -> PutStatus:
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

    # --- settings changed at run time (UPDATE_BROKER_CONFIG; broker/_liveconfig.py) -----------
    def update_config(self, config: BrokerConfig) -> None:
        """Run with *config* from now on; it differs from the current one only in keys of
        ``_liveconfig.LIVE_KEYS``, which take effect here (or where they are read again)."""
        self.config = config
        self._flusher.waiters.timeout = config.sync_flush_timeout / 1000
        warning, clean_forcibly, max_used = config.disk_ratios
        self.disk.warning_ratio = warning
        self.disk.clean_forcibly_ratio = clean_forcibly
        self.disk.max_used_ratio = max_used
        self.disk.check(dict(self.disk.ratios))  # the new limits against the last measurement
        self.store.commitlog.max_message_size = config.max_message_size
        if self.ha_service is not None:
            self.ha_service.config = config  # reads ha_slave_fallbehind_max on every put
        if self.retention is not None:
            self.retention.config = config  # reads fileReservedTime, deleteWhen every run

    # --- retention hooks (mqadmin deleteExpiredCommitLog, cleanExpiredCQ) ---------------------
    def delete_expired_commitlog(self) -> bool:
        """``DefaultMessageStore.executeDeleteFilesManually`` (DELETE_EXPIRED_COMMITLOG): have
        the retention service delete expired commit log files at its next runs, whatever the
        hour (``deleteWhen``), the first at once. False while retention does not run."""
        if self.retention is None:
            return False
        self.retention.delete_now()
        return True

    def clean_expired_consume_queues(self) -> bool:
        """``DefaultMessageStore.cleanExpiredConsumerQueue`` (CLEAN_EXPIRED_CONSUMEQUEUE):
        destroy every consume queue whose messages are all below the commit log's min offset.
        False while retention does not run."""
        if self.retention is None:
            return False
        self.retention.clean_expired_queues()
        return True

    # --- running ----------------------------------------------------------------------------
    async def _run_async_flusher(self) -> None:
        """ASYNC_FLUSH's ``FlushRealTimeService``: flush what is written every interval
        (``flush_interval_commit_log``, read again every round)."""
        commitlog = self.store.commitlog
        while True:
            await trio.sleep(self.config.flush_interval_commit_log / 1000)
            dirty = commitlog.max_offset > commitlog.flushed_offset
            if dirty and await self.flush_commitlog() is None:
                await trio.sleep(self.disk_check_interval)

    def flush_log(self) -> int:
        """Flush the commit log (blocking) and keep the master's flushed mark up to date."""
        flushed = self.store.commitlog.flush()
        if self.sent is not None:
            self.sent.note_flushed(flushed, time.monotonic())
        return flushed

    async def flush_commitlog(self) -> int | None:
        """:meth:`flush_log` in a worker thread; None (reported to the disk guard) if the disk
        refuses, so a flusher retries instead of ending the broker."""
        try:
            flushed = await trio.to_thread.run_sync(self.flush_log)
        except StorageError as exc:
            if not isinstance(exc.__cause__, OSError):
                raise
            # Puts go on (a SYNC_FLUSH put gets FLUSH_DISK_TIMEOUT), as in RocketMQ.
            self.disk.failed(COMMIT_LOG_FLUSH, exc, blocks_puts=False)
            return None
        if self.disk.failing(COMMIT_LOG_FLUSH):
            self.disk.succeeded(COMMIT_LOG_FLUSH)
        return flushed

    async def _watch_disk(self) -> None:
        """``isSpaceFull`` every ``cleanResourceInterval``: measure, flip flags, log flips."""
        while True:
            self.disk.check(await trio.to_thread.run_sync(self.disk.measure))
            await trio.sleep(self.disk_check_interval)

    async def _start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self._watch_disk)
        sync_flush = self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH
        if self.config.failover or (sync_flush and self.role.is_master):
            # Failover: a master's put waits for its own flush, whatever flushDiskType says
            # (docs/failover.md, "Durability"); the flusher idles while nobody waits.
            await nursery.start(self._flusher.run)
        if not (sync_flush and self.role.is_master):
            nursery.start_soon(self._run_async_flusher)
        if self.config.enable_controller_mode:
            self.epoch_file = await trio.to_thread.run_sync(
                EpochFile.open, self.store.root / EPOCH_FILE_NAME
            )
        if self.config.failover:
            await self._start_failover(nursery)
        elif self.role.is_master:
            if self.epoch_file is not None:
                commitlog = self.store.commitlog
                epoch = await trio.to_thread.run_sync(
                    self.epoch_file.begin_epoch, commitlog.max_offset, commitlog.min_offset
                )
                log.info("master epoch %d begins at offset %d", epoch, commitlog.max_offset)
            self.ha_service = self._new_ha_service()
            if self.marks is not None:
                await nursery.start(self.marks.run)
            self.ha_address = await nursery.start(self.ha_service.serve)
            if self.role is BrokerRole.SYNC_MASTER and self.config.required_slave_acks == 0:
                log.warning(
                    "SYNC_MASTER with in_sync_replicas=%d waits for no slave (as RocketMQ 5.x)",
                    self.config.in_sync_replicas,
                )
        else:
            self.ha_client = self._new_ha_client(self.config)
            await nursery.start(self.ha_client.run)
        self.client_side = await nursery.start(serve_client_side, self)
        self.retention = RetentionService(
            self.config, self.store.commitlog, self.disk, self.client_side.reput
        )
        await nursery.start(self.retention.run)
        self._client_side_ready.set()
        if self.config.failover:
            await nursery.start(self._run_replica_manager)

    # --- automatic failover: the role as runtime state ------------------------------------
    async def _start_failover(self, nursery: trio.Nursery) -> None:
        """The HA port is bound for the broker's whole life (its address is in etcd), and
        serves slaves only while this broker is master."""
        log.info(
            "automatic failover: etcd at %s decides this broker's role (broker %d of %s/%s; "
            "brokerRole and brokerId in the configuration are not used)",
            self.config.failover_etcd_endpoints,
            self.config.failover_broker_id,
            self.config.broker_cluster_name,
            self.config.broker_name,
        )
        self.ha_service = self._new_ha_service()
        self.ha_address = await nursery.start(self.ha_service.serve)

    def _new_ha_service(self) -> HAService:
        """The master's HA service for this store (failover: bound for the broker's life)."""
        security = HASecurity.for_config(self.config, master=True)
        return HAService(
            self.config,
            self.store.commitlog,
            epoch_file=self.epoch_file,
            accept=security.accept if security is not None else None,
            marks=self.marks,
        )

    async def _run_replica_manager(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        config = self.config
        assert self.client_side is not None and self.ha_address is not None
        assert self.ha_service is not None and config.failover_etcd_endpoints
        try:
            options = failover_options(
                broker_id=config.failover_broker_id,
                cluster=config.broker_cluster_name,
                broker_name=config.broker_name,
                root=config.failover_etcd_root,
                broker_addr=self.client_side.broker_addr,
                ha_addr=f"{config.broker_ip1}:{self.ha_address[1]}",
                lease_ttl=config.failover_lease_ttl,
                ha_max_time_slave_not_catchup=config.ha_max_time_slave_not_catchup,
                enable_elect_unclean_master=config.enable_elect_unclean_master,
            )
        except ValueError as exc:
            raise ConfigError(f"automatic failover: {exc}") from None
        if config.failover_unsafe:
            options = attrs.evolve(options, unsafe=unsafe_twins(config.failover_unsafe))
            log.warning(
                "failoverUnsafe=%s: known-bad twins on, for tests only; this broker can lose "
                "acknowledged messages",
                config.failover_unsafe,
            )
        ha = self.ha_service

        def started(manager: ReplicaManager) -> None:
            self.replica_manager = manager
            ha.on_replica_ack = manager.replica_acked
            ha.on_replica_gone = manager.replica_gone

        try:
            async with open_replica_manager(
                options,
                self,
                endpoints=config.failover_etcd_endpoints,
                user=config.failover_etcd_user,
                password=config.failover_etcd_password,
                on_started=started,
            ):
                task_status.started()
                await trio.sleep_forever()
        finally:
            ha.on_replica_ack = ha.on_replica_gone = None

    def log_facts(self) -> tuple[int, int, int]:
        """The replica manager's ``LogChanged``: log end, last epoch, confirm offset."""
        commitlog = self.store.commitlog
        end = commitlog.max_offset
        last = self.epoch_file.history.last_epoch if self.epoch_file is not None else 0
        if not last and end > commitlog.min_offset:
            last = 1  # data from before epochs were kept counts as epoch 1 (begin_epoch)
        return end, last, self._confirm_offset

    def replica_acks(self) -> dict[int, int]:
        """The replica manager: each streaming slave's broker id and acked offset."""
        return self.ha_service.replica_acks() if self.ha_service is not None else {}

    def fence(self, reason: str) -> None:
        self._ack_until = -math.inf
        self._register_as(self.config.failover_broker_id)

    def unfence(self, until_ms: int) -> None:
        self._ack_until = until_ms / 1000
        if self.role.is_master:
            self._register_as(0)

    def _register_as(self, broker_id: int) -> None:
        """Name servers see a fenced master as a slave (its stable id), an acking one as 0."""
        self.registered_id = broker_id
        if self.client_side is not None:
            self.client_side.register_as(broker_id)

    def fail_in_flight(self, status: PutStatus) -> None:
        if self.ha_service is not None:
            self.ha_service.fail_waiting(status)

    def set_sync_state_set(self, members: frozenset[int]) -> None:
        assert self.ha_service is not None
        self.ha_service.set_members(members)

    async def become_master(self, epoch: int, members: frozenset[int]) -> None:
        """Stop replicating, cut a half-received last record, begin *epoch* at the log's end
        (the epoch file refuses an epoch not above its own), then serve slaves as master."""
        async with self._role_lock:
            await self._stop_ha_client()
            commitlog = self.store.commitlog
            end = commitlog.max_offset
            if end > commitlog.min_offset:
                before, after = commitlog.boundaries_around(end - 1)
                if after != end:
                    log.warning(
                        "cutting the half-received last record [%d, %d) before becoming master",
                        before,
                        end,
                    )
                    await self._truncate_replica(before)
            epoch_file = self.epoch_file
            assert epoch_file is not None and self.ha_service is not None
            begun = await trio.to_thread.run_sync(
                lambda: epoch_file.begin_epoch(
                    commitlog.max_offset, commitlog.min_offset, epoch=epoch
                )
            )
            self._confirm_offset = commitlog.max_offset
            self.master_epoch = begun
            self.ha_service.start_serving()
            self._switch_role(BrokerRole.SYNC_MASTER, master_addr=None)

    async def become_slave(self, master: MasterRecord) -> None:
        """Stop serving as master (if it was), then follow *master* from its epoch on."""
        async with self._role_lock:
            self._ack_until = -math.inf
            if self.ha_service is not None:
                self.ha_service.stop_serving(
                    f"this broker follows broker {master.broker_id} (epoch {master.epoch})"
                )
                self.ha_service.fail_waiting(PutStatus.FLUSH_SLAVE_TIMEOUT)
            self.master_epoch = 0
            self._switch_role(BrokerRole.SLAVE, master_addr=master.broker_addr)
            await self._stop_ha_client()
            await self._start_ha_client(master.ha_addr, master.epoch)

    def _switch_role(self, role: BrokerRole, *, master_addr: str | None) -> None:
        """The one place a running broker changes role: what it refuses, what it registers
        as (brokerId 0 as master, its stable id as a slave), and the client side's tasks."""
        old = self.role
        self.role = role
        self._generation += 1
        broker_id = 0 if role.is_master else self.config.failover_broker_id
        self.config = self.config.evolve(broker_role=role, broker_id=broker_id)
        if self.ha_service is not None:
            self.ha_service.config = self.config
        self.disk.master = role.is_master
        self._put_mode = "sync" if role.is_master else "async"
        if self.client_side is not None:
            self.client_side.role_changed(self, master_addr)
        # The name servers hear the new role at once; a master that is fenced already
        # registers as a slave until it is unfenced.
        self._register_as(broker_id if self._acking() else self.config.failover_broker_id)
        if old is not role:
            commitlog = self.store.commitlog
            log.warning(
                "role %s -> %s (epoch %d, log [%d, %d), registered as brokerId %d)",
                old.value,
                role.value,
                self.epoch_file.history.last_epoch if self.epoch_file is not None else 0,
                commitlog.min_offset,
                commitlog.max_offset,
                self.registered_id,
            )

    def _new_ha_client(self, config: BrokerConfig, master_epoch: int = 0) -> HAClient:
        """A slave's HA client for this store (its master is ``config.ha_master_address``)."""
        security = HASecurity.for_config(config, master=False)
        root = self.store.root
        return HAClient(
            config,
            self.store.commitlog,
            on_appended=self._on_log_grew,
            diverged_file=root / DIVERGED_FILE,
            epoch_file=self.epoch_file,
            truncate=self._truncate_replica,
            connect=security.connector(trio.open_tcp_stream) if security is not None else None,
            become_replica=lambda: forget_master_marks(root),
            master_epoch=master_epoch,
        )

    async def _start_ha_client(self, ha_addr: str, epoch: int) -> None:
        assert self._nursery is not None
        client = self._new_ha_client(self.config.evolve(ha_master_address=ha_addr), epoch)
        scope = trio.CancelScope()
        done = trio.Event()

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            try:
                with scope:
                    await client.run(task_status=task_status)
            finally:
                done.set()

        self.ha_client = client
        self._ha_client_scope, self._ha_client_done = scope, done
        await self._nursery.start(run)

    async def _stop_ha_client(self) -> None:
        """Stop replicating (a failover role change) and wait until the client has stopped."""
        scope, done = self._ha_client_scope, self._ha_client_done
        if scope is None or done is None:
            return
        scope.cancel()
        await done.wait()
        self._ha_client_scope = self._ha_client_done = None
        self.ha_client = None

    async def _truncate_replica(self, offset: int) -> None:
        """Epoch mode: cut the commit log and the consume queues back to *offset* together."""
        from trioha.broker._reput import truncate_replica

        await self._client_side_ready.wait()  # the consume queues are open
        assert self.client_side is not None
        reput = self.client_side.reput
        # In this thread, as the reput service dispatches: it must not run halfway through.
        truncate_replica(self.store.commitlog, reput.queues, reput.checkpoint, offset, reput=reput)

    def statistics(self) -> BrokerStatistics:
        commitlog = self.store.commitlog
        return BrokerStatistics(
            role=self.role,
            min_offset=commitlog.min_offset,
            max_offset=commitlog.max_offset,
            flushed_offset=commitlog.flushed_offset,
            puts=self._puts,
            # A failover slave's HA port is bound but serves nobody: no master figures.
            ha=self.ha_service.statistics() if self.ha_service and self.role.is_master else None,
            client=self.ha_client.statistics() if self.ha_client else None,
            disk=self.disk.statistics(),
            build=build_info().describe(),
            put_results=dict(self._put_results),
            put_latency={self._put_mode: self._put_latency.snapshot()}
            if self.role.is_master
            else {},
            retention=self.retention.statistics() if self.retention is not None else None,
            failover=self.replica_manager.statistics() if self.replica_manager else None,
        )


class _RecoveryProgress:
    """Recovery's ``(scanned, total)`` segments as a :class:`Progress`, made at the first call
    (a store of one segment or none reports nothing)."""

    def __init__(self) -> None:
        self.progress: Progress | None = None

    def __call__(self, scanned: int, total: int) -> None:
        if total <= 1:
            return
        if self.progress is None:
            self.progress = Progress("store recovery", total=total, unit="segments")
        self.progress.set(scanned, total=total)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()


@asynccontextmanager
async def open_broker(
    config: BrokerConfig, *, config_file: Path | None = None
) -> AsyncIterator[Broker]:
    """Open the store under ``config.store_path_root_dir`` and run the broker by role.

    *config_file* is the ``broker.conf`` the configuration was read from (``-c``): settings
    changed at run time (``mqadmin updateBrokerConfig``) are written there.

    Recovery reports its progress (segments scanned) through :class:`trioha._progress.Progress`:
    a bar on a terminal, a line every 10 s otherwise (a long scan after a crash).

    Raises:
        StoreLockedError: another process has the store open.
        StoreLayoutError: the directory is not laid out as RocketMQ lays out a store.
        DamagedLogError: as master, recovery cut bytes that had been flushed (damage, not a
            lost tail) and ``ha_accept_damaged_log`` is off.
        ConfigError: a port cannot be bound, or a setting cannot be honoured (an ACL or TLS
            file that cannot be read, epoch mode without its epoch file, ...); the message
            names the address or key and the setting that chose it.
        StorageError: any other reason the store cannot be opened or closed.
    """
    recovery = _RecoveryProgress()
    store = await trio.to_thread.run_sync(
        lambda: open_store(
            config.store_root,
            segment_size=config.mapped_file_size_commit_log,
            flush_disk_type=config.flush_disk_type,
            flush_interval_ms=config.flush_interval_commit_log,
            check_crc=config.check_crc_on_recover,
            store_host=HostAddress(config.broker_ip1, config.listen_port),
            max_message_size=config.max_message_size,
            commitlog_dir=config.commitlog_dir,
            recovery_progress=recovery,
        )
    )
    recovery.close()
    clean = False
    try:
        sent = None
        if config.broker_role.is_master and not config.failover:
            sent = await trio.to_thread.run_sync(
                lambda: open_master_history(
                    store,
                    accept_damaged=config.ha_accept_damaged_log,
                    accept_lost_acknowledged=config.ha_accept_lost_acknowledged,
                    epoch_mode=config.enable_controller_mode,
                )
            )
        elif not config.enable_controller_mode:
            await trio.to_thread.run_sync(_check_former_master, store, config)
        broker = Broker(config, store, sent=sent, config_file=config_file)
        async with trio.open_nursery() as nursery:
            await broker._start(nursery)
            log.info(
                "%s started: store %s, log [%d, %d), %s",
                "failover replica" if config.failover else config.broker_role.value,
                config.store_root,
                store.commitlog.min_offset,
                store.commitlog.max_offset,
                build_info().describe(),
            )
            try:
                yield broker
            finally:
                broker._closed = True
                nursery.cancel_scope.cancel()
        clean = True
    finally:
        # Shielded: a broker stopped by an outer cancellation must still release its store
        # (lock, abort marker), or a restart in the same process finds it locked.
        with trio.CancelScope(shield=True):
            if sent is not None:
                await trio.to_thread.run_sync(_close_marks, store, sent)
            await _close_store(store, config, raise_errors=clean)


def _close_marks(store: Store, sent: SentOffsets) -> None:
    """A clean stop: exact marks, and the flushed mark at the log's end (flushed here, as the
    store's close would), so the next start's damage check sees all of it (blocking)."""
    try:
        flushed: int | None = store.commitlog.flush()
    except StorageError:
        flushed = None  # the store's close says so; the flushed mark stays as it was
    sent.close(flushed=flushed)


def _check_former_master(store: Store, config: BrokerConfig) -> None:
    """A classic slave whose store last ran as a trioha master and holds bytes it never
    sent: no master can hold them, so it starts diverged (blocking; see
    :func:`~trioha.net._divergence.former_master_divergence`)."""
    marker = store.root / DIVERGED_FILE
    if marker.exists():
        return  # diverged already: the recorded offset is the one to cut back to
    master = config.ha_master_address or "?"
    divergence = former_master_divergence(store.commitlog, SentOffsets.open(store.root), master)
    if divergence is not None:
        divergence.write(marker)


async def _close_store(store: Store, config: BrokerConfig, *, raise_errors: bool) -> None:
    """Close *store*; when the broker is already failing, a failure to close is logged and
    not raised, so that the error that stopped the broker is the one the operator sees."""
    try:
        await trio.to_thread.run_sync(store.close)
    except StorageError as exc:
        if raise_errors:
            raise
        log.error(
            "%s stopped; the store could not be closed cleanly (%s): the next start "
            "recovers it fully",
            config.broker_role.value,
            exc,
        )
        return
    log.info("%s stopped; store closed cleanly", config.broker_role.value)


def unsafe_twins(names: str) -> Unsafe:
    """``failoverUnsafe`` (test only): the known-bad twins named, ``,`` between them."""
    known = {field.name for field in attrs.fields(Unsafe)}
    chosen = {name.strip() for name in names.split(",") if name.strip()}
    if unknown := chosen - known:
        raise ConfigError(
            f"failoverUnsafe: unknown twin(s) {sorted(unknown)}; known: {sorted(known)}"
        )
    return Unsafe(**dict.fromkeys(chosen, True))
