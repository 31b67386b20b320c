"""What a commit log promises, and the values that cross that promise.

``CommitLog`` is the one interface the replication layer, the broker and the pipeline code
against. Two implementations pass the same contract tests: the file log (``_commitlog``) and an
in-memory log (``_memory``) for fast protocol tests; both build on :class:`~._logcore.LogCore`.
A message to append is a :class:`NewMessage`; an append answers with an :class:`AppendResult`.

Threading: every method belongs to one owner thread (the Trio thread) except ``flush``, which
may run in a worker thread (``trio.to_thread.run_sync``) while the owner appends.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final, Protocol, TypeAlias

import attrs

from trioha.store._message import (
    HostAddress,
    PropertiesForm,
    ReadableBuffer,
    StoredMessage,
    make_msg_id,
)

DEFAULT_MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024
"""``maxMessageSize``: the largest body accepted (4 MiB)."""
DEFAULT_STORE_HOST: Final = HostAddress("127.0.0.1", 10911)


class FlushDiskType(enum.Enum):
    """``org.apache.rocketmq.store.config.FlushDiskType``: when an append is on disk.

    It lives with the store, as RocketMQ keeps it beside ``MessageStoreConfig``; the broker's
    configuration (``trioha._config``) reads it from here.
    """

    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


def system_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# --- values ----------------------------------------------------------------------------

#: A message's properties as a producer gives them: a mapping (joined in one C call when the
#: record is encoded) or ``(key, value)`` pairs in the order they are to be stored.
MessageProperties: TypeAlias = Mapping[str, str] | Sequence[tuple[str, str]]


# Compared, never hashed (properties may be a dict). Without slots: a frozen attrs class with a
# __dict__ is made in a third fewer instructions than a slotted one (its fields are written
# straight into the dict, not each through object.__setattr__), and a send makes one per
# message (docs/performance.md, "One send path").
@attrs.frozen(slots=False, unsafe_hash=False)
class NewMessage:
    """A message to append (``MessageExtBrokerInner`` before the store fills in offsets): the
    one value every way into a commit log takes (``append``, ``append_batch``, a broker's
    ``put``, a send's records).

    ``None`` means "the log decides": the born and store timestamps default to now, the
    born host to the store host, the store host and properties form to the log's own.

    The fields are kept as given, without converters: a send builds one per message, and the
    log's :meth:`~trioha.store._logcore.LogCore.prepare` is the one place that checks and
    encodes them (a host tuple that is no address, a number outside Java's range, a body
    above the size limit are refused there, as the put's status says).
    """

    topic: str
    #: Copied into the record as it is written (a send's body is the request's bytes).
    body: bytes | bytearray | memoryview
    queue_id: int = 0
    flag: int = 0
    properties: MessageProperties = ()
    sysflag: int = 0
    born_timestamp: int | None = None
    born_host: HostAddress | tuple[str, int] | None = None
    store_host: HostAddress | tuple[str, int] | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    store_timestamp: int | None = None
    properties_form: PropertiesForm | None = None

    def get_property(self, name: str) -> str | None:
        """The property *name* (the last one given, as Java's map keeps it), None without."""
        properties = self.properties
        if type(properties) is dict or isinstance(properties, Mapping):
            return properties.get(name)
        found = None
        for key, value in properties:
            if key == name:
                found = value
        return found


def to_host(value: HostAddress | tuple[str, int]) -> HostAddress:
    """A host as :class:`NewMessage` may hold it, as a record stores it (ValueError: no
    address)."""
    if isinstance(value, HostAddress):
        return value
    host, port = value
    return HostAddress(host, port)


@attrs.frozen(slots=False)  # made per message appended: see NewMessage
class AppendResult:
    """Where an appended message went (``AppendMessageResult``)."""

    physical_offset: int
    size: int
    queue_offset: int
    store_timestamp: int
    store_host: HostAddress
    topic: str
    queue_id: int

    @property
    def end_offset(self) -> int:
        return self.physical_offset + self.size

    @property
    def msg_id(self) -> str:
        return make_msg_id(self.store_host, self.physical_offset)


@attrs.frozen
class FlushPolicy:
    """When the Trio layer should call ``flush()`` (``FlushRealTimeService``/``GroupCommit``).

    The store starts no threads or tasks; a broker task asks :meth:`due` on its timer.
    ASYNC_FLUSH flushes every ``interval_ms`` once ``least_pages`` 4 KiB pages are dirty, and
    at least every ``thorough_interval_ms`` whatever is dirty. SYNC_FLUSH is driven by puts
    (the caller groups waiters and calls ``flush()`` once per group).
    """

    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    interval_ms: int = 500  # flushIntervalCommitLog
    least_pages: int = 4  # flushCommitLogLeastPages
    thorough_interval_ms: int = 10_000  # flushCommitLogThoroughInterval

    def due(self, *, now_ms: int, last_flush_ms: int, unflushed_bytes: int) -> bool:
        if unflushed_bytes <= 0:
            return False
        if self.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            return True
        if now_ms - last_flush_ms >= self.thorough_interval_ms:
            return True
        return unflushed_bytes >= self.least_pages * 4096


class CommitLog(Protocol):
    """What the rest of trioha needs from a commit log (file or memory)."""

    @property
    def segment_size(self) -> int:
        """Bytes per segment file (``mappedFileSizeCommitLog``)."""

    @property
    def min_offset(self) -> int:
        """First readable offset: the first segment's start (0 for a log never written)."""

    @property
    def max_offset(self) -> int:
        """End of written data (a segment closed by a blank record counts as full)."""

    @property
    def flushed_offset(self) -> int:
        """Everything below this offset is durable."""

    def append(self, message: NewMessage) -> AppendResult:
        """Append one message at the end of the log."""

    def append_batch(self, messages: Iterable[NewMessage]) -> list[AppendResult]:
        """Append consecutive records with one write, all in one segment."""

    def append_raw(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Append replicated bytes exactly at the end of the log; returns the new end."""

    def read(self, offset: int, max_bytes: int) -> memoryview | bytes:
        """Up to ``max_bytes`` written bytes from ``offset``, within one segment."""

    def iter_messages(self, start: int | None = None) -> Iterator[StoredMessage]:
        """Messages from ``start`` (default: the first), blank records skipped."""

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next message for this queue will get."""

    def flush(self) -> int:
        """Make everything written durable; returns the new flushed offset."""

    def truncate(self, offset: int) -> None:
        """Drop everything at and after ``offset`` (kept aside, never discarded)."""

    def boundaries_around(self, offset: int) -> tuple[int, int | None]:
        """The message boundaries nearest ``offset`` (both ``offset`` when it is one)."""

    def truncate_to_boundary(self, offset: int) -> list[SetAside]:
        """:meth:`truncate` at a message boundary only; returns what was kept aside."""

    def last_record(self) -> tuple[int, int] | None:
        """``(offset, store timestamp)`` of the last complete message, found from the end
        without walking the log; None if there is none."""

    def skip_past(self, offset: int) -> int:
        """Close segments with END_OF_FILE records so new data starts beyond ``offset``."""

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole oldest segments that end at or before ``offset``; returns how many."""

    def release_segments_before(self, offset: int) -> Released:
        """Take whole oldest segments ending at or before ``offset`` out of the log (never the
        last); their files go with :meth:`Released.destroy`."""

    def segment_times(self) -> list[int]:
        """Each segment's last-modified time (ms since the epoch), oldest first."""

    def floor_queue_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Raise the next queue offsets to at least these (consume queues' ends)."""

    def forget_queue(self, topic: str, queue_id: int) -> None:
        """Count the queue's offsets from 0 again (its consume queue was destroyed)."""

    def close(self) -> None:
        """Flush and release the log; idempotent."""


# --- the shared core -------------------------------------------------------------------


class SegmentLike(Protocol):
    start: int
    size: int
    wrote: int
    flushed: int
    data_start: int
    backed: int

    @property
    def modified_ms(self) -> int:
        """When the segment was last written (ms since the epoch)."""

    def buffer(self) -> ReadableBuffer: ...
    def write(self, pos: int, data: bytes | bytearray | memoryview) -> None: ...
    def view(self, pos: int, end: int) -> memoryview | bytes: ...
    def zero(self, pos: int, end: int) -> None: ...
    def drop_pages(self, pos: int = 0, end: int | None = None) -> None: ...
    def close(self) -> None: ...


@attrs.define
class Released:
    """Segments retention took out of a log (``CommitLog.release_segments_before``), whose
    files are not deleted yet: :meth:`destroy` deletes them, once."""

    #: Where each released segment started, oldest first (empty: nothing was released).
    starts: tuple[int, ...]
    #: The log's first offset without them.
    min_offset: int
    _destroy: Callable[[], None] | None = attrs.field(default=None, repr=False)

    def destroy(self) -> None:
        """Close and delete the files (blocking IO, so any thread may run it; raises
        ``StorageError`` naming the file that could not be deleted)."""
        destroy, self._destroy = self._destroy, None
        if destroy is not None:
            destroy()


@attrs.frozen
class SetAside:
    """Bytes a commit log refused to keep in place, and where they went."""

    offset: int
    size: int
    reason: str
    where: str  # a path for the file log, a label for the memory log
