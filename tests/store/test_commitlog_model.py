"""The file log, the in-memory log and a plain model, driven by the same random operations.

The model places records by RocketMQ's rule on its own (a record goes where it fits, else a blank
closes the file: docs/rocketmq-protocol.md §4.3) and counts queue offsets per (topic, queue), so
both logs are checked against something that shares none of their code.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from trioha.store import FileCommitLog, MemoryCommitLog, NewMessage, message_length

from .conftest import FakeClock

SIZE = 1024


@attrs.frozen
class Rec:
    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int


def record_size(msg: NewMessage) -> int:
    pairs = dict(msg.properties).items()
    props = sum(len(k) + len(v) + 2 for k, v in pairs) - (1 if pairs else 0)
    return message_length(0, len(msg.body), len(msg.topic), props)


messages = st.builds(
    NewMessage,
    topic=st.sampled_from(["A", "B"]),
    body=st.binary(max_size=300),
    queue_id=st.integers(0, 1),
    properties=st.sampled_from([(), (("TAGS", "x"),)]),
)


class Logs(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp())
        self.clock_f, self.clock_m = FakeClock(), FakeClock()
        self.file = FileCommitLog.open(
            self.tmp / "commitlog", segment_size=SIZE, clock_ms=self.clock_f
        )
        self.mem = MemoryCommitLog(segment_size=SIZE, clock_ms=self.clock_m)
        self.records: list[Rec] = []
        self.next_q: dict[tuple[str, int], int] = {}
        self.end = 0  # model max offset
        self.min = 0
        self.deleted = False

    def teardown(self) -> None:
        if hasattr(self, "file"):
            self.file.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _place(self, batch: list[NewMessage]) -> list[Rec]:
        total = sum(record_size(m) for m in batch)
        pos = self.end % SIZE if self.end % SIZE or not self.records else SIZE
        offset = self.end
        if self.end and total + 8 > SIZE - pos:
            offset = self.end + (SIZE - pos)  # blank to the end of the segment
        placed = []
        for m in batch:
            key = (m.topic, m.queue_id)
            qo = self.next_q.get(key, 0)
            self.next_q[key] = qo + 1
            placed.append(Rec(offset, record_size(m), m.topic, m.queue_id, qo))
            offset += record_size(m)
        self.end = offset
        return placed

    @rule(batch=st.lists(messages, min_size=1, max_size=4))
    def append(self, batch: list[NewMessage]) -> None:
        if sum(record_size(m) for m in batch) + 8 > SIZE:
            return
        expected = self._place(batch)
        self.records += expected
        for log in (self.file, self.mem):
            got = log.append_batch(batch)
            assert [(r.physical_offset, r.size, r.queue_offset) for r in got] == [
                (e.offset, e.size, e.queue_offset) for e in expected
            ]

    @precondition(lambda self: self.records)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.records) - 1))
        cut = self.records[i]
        for r in self.records[i:]:
            key = (r.topic, r.queue_id)
            self.next_q[key] = min(self.next_q[key], r.queue_offset)
        del self.records[i:]
        self.end = cut.offset
        self.file.truncate(cut.offset)
        self.mem.truncate(cut.offset)

    @precondition(lambda self: self.records)
    @rule(data=st.data())
    def delete_old_segments(self, data: st.DataObject) -> None:
        upto = data.draw(st.integers(self.min, self.end))
        last_segment = self.end - self.end % SIZE  # the segment holding the end of the log
        boundary = min(upto - upto % SIZE, last_segment)
        expected = max(0, (boundary - (self.min - self.min % SIZE)) // SIZE)
        assert self.file.delete_segments_before(upto) == expected
        assert self.mem.delete_segments_before(upto) == expected
        if expected:
            self.min = boundary
            self.records = [r for r in self.records if r.offset >= boundary]
            self.deleted = True

    @rule()
    def flush(self) -> None:
        assert self.file.flush() == self.file.max_offset
        assert self.mem.flush() == self.mem.max_offset

    @precondition(lambda self: not self.deleted)
    @rule()
    def reopen(self) -> None:
        self.file.close()
        self.file = FileCommitLog.open(
            self.tmp / "commitlog", segment_size=SIZE, clock_ms=self.clock_f
        )
        assert self.file.recovery.kept_aside == ()

    @invariant()
    def offsets_agree(self) -> None:
        if not hasattr(self, "file"):
            return
        for log in (self.file, self.mem):
            assert (log.min_offset, log.max_offset) == (self.min, self.end)
            for key, value in self.next_q.items():
                assert log.next_queue_offset(*key) == value

    @invariant()
    def contents_agree(self) -> None:
        if not hasattr(self, "file"):
            return
        offset = self.min
        while offset < self.end:
            a, b = self.file.read(offset, 700), self.mem.read(offset, 700)
            assert bytes(a) == bytes(b)
            offset += len(a)
        got = [(m.physical_offset, m.queue_offset) for m in self.file.iter_messages()]
        assert got == [(r.offset, r.queue_offset) for r in self.records]
        assert list(self.file.iter_messages()) == list(self.mem.iter_messages())


Logs.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestLogs = Logs.TestCase
