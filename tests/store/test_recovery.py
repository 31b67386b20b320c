"""Recovery on open (docs/rocketmq-protocol.md §4.6; CommitLog.recoverNormally/recoverAbnormally,
checkMessageAndReturnSize, MappedFileQueue.truncateDirtyFiles).

The crash-point tests compute the expected end of the log from the list of records written
(their offsets and the field layout of docs/rocketmq-protocol.md §4.1), not from the decoder.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trioha import StorageError, StoreLayoutError
from trioha.store import (
    AppendResult,
    FileCommitLog,
    HostAddress,
    NewMessage,
    StoredMessage,
    open_store,
)

from ._rocketmq import JavaMessage, write_java_commitlog
from .conftest import FakeClock

V6 = HostAddress("2001:db8::1", 9876)


@attrs.frozen
class Written:
    """A log written for a crash test: its records, blank markers and original bytes."""

    segment_size: int
    results: tuple[AppendResult, ...]
    messages: tuple[StoredMessage, ...]
    blanks: tuple[int, ...]
    files: dict[int, bytes]
    max_offset: int

    def items_in(self, segment: int) -> list[tuple[int, int]]:
        """(start, end) of every record and blank marker in one segment."""
        lo, hi = segment * self.segment_size, (segment + 1) * self.segment_size
        items = [(r.physical_offset, r.end_offset) for r in self.results]
        items += [(b, b + 8) for b in self.blanks]
        return sorted(i for i in items if lo <= i[0] < hi)

    def checked(self, start: int) -> list[int]:
        """Positions inside the item at ``start`` that checkMessageAndReturnSize depends on
        (docs/rocketmq-protocol.md §4.1): sizes, magic, the body and its CRC, and every length
        field."""
        msg = next((m for m in self.messages if m.physical_offset == start), None)
        if msg is None:  # a blank record: only its magic is looked at
            return [4, 5, 6, 7]
        return sorted(checked_positions(msg))


def checked_positions(msg: StoredMessage) -> set[int]:
    head = 88 + (12 if msg.born_host.is_ipv6 else 0) + (12 if msg.store_host.is_ipv6 else 0)
    body_end = head + len(msg.body)
    topic_len_size = 2 if len(msg.topic.encode()) > 127 else 1
    topic_end = body_end + topic_len_size + len(msg.topic.encode())
    positions = set(range(8)) | set(range(head - 4, body_end + topic_len_size))
    positions |= {topic_end, topic_end + 1}
    if msg.body:
        positions |= set(range(8, 12))
    return positions


def write_log(directory: Path, segment_size: int, messages: list[NewMessage]) -> Written:
    log = FileCommitLog.open(directory, segment_size=segment_size, clock_ms=FakeClock())
    results = [log.append_batch([m])[0] for m in messages]
    stored = tuple(log.iter_messages())
    end = log.max_offset
    log.close()
    blanks = [
        a.end_offset
        for a, b in itertools.pairwise(results)
        if a.physical_offset // segment_size != b.physical_offset // segment_size
    ]
    files = {int(p.name): p.read_bytes() for p in directory.iterdir()}
    return Written(segment_size, tuple(results), stored, tuple(blanks), files, end)


new_messages = st.builds(
    NewMessage,
    topic=st.sampled_from(["FooBar", "t", "x" * 130]),
    body=st.binary(max_size=200),
    queue_id=st.integers(0, 2),
    properties=st.sampled_from([(), (("TAGS", "a"),), (("KEYS", "k1 k2"), ("UNIQ_KEY", "u"))]),
    born_host=st.sampled_from([None, V6]),
)
logs = st.tuples(
    st.sampled_from([512, 1024, 2048]), st.lists(new_messages, min_size=1, max_size=25)
)


def segment_path(directory: Path, start: int) -> Path:
    return directory / f"{start:020d}"


def kept_files(root: Path) -> list[Path]:
    aside = root / "lost+found"
    return sorted(aside.iterdir()) if aside.exists() else []


# --- crash points ---------------------------------------------------------------------


@settings(max_examples=60)
@given(logs, st.data())
def test_a_torn_tail_is_cut_at_the_last_complete_record(
    log_spec: tuple[int, list[NewMessage]], data: st.DataObject
) -> None:
    """Everything after a random byte of one segment is lost (zeros, the file keeps its
    size): recovery keeps exactly the records before the first damaged one."""
    size, messages = log_spec
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = root / "commitlog"
        w = write_log(directory, size, messages)
        cut_at = data.draw(st.integers(0, w.max_offset - 1), label="cut_at")
        k = cut_at // size
        original = w.files[k * size]
        pos = cut_at - k * size
        segment_path(directory, k * size).write_bytes(original[:pos] + bytes(size - pos))

        # The first item whose checked bytes the zeros change ends the log (an item after
        # the cut is all zeros: a bad magic). Zeros over a topic, say, go unnoticed, as in
        # RocketMQ.
        damaged = [
            start
            for start, end in w.items_in(k)
            if end > cut_at
            and any(original[start - k * size + i] for i in w.checked(start) if start + i >= cut_at)
        ]
        expected_end = min(damaged) if damaged else w.max_offset
        log = FileCommitLog.open(directory, clean_shutdown=False, clock_ms=FakeClock())
        try:
            report = log.recovery
            assert report.valid_end == log.max_offset == expected_end
            survivors = list(log.iter_messages())
            assert [m.physical_offset for m in survivors] == [
                m.physical_offset for m in w.messages if m.physical_offset < expected_end
            ]
            intact = [m for m in w.messages if m.end_offset <= cut_at]
            assert survivors[: len(intact)] == intact
            kept = kept_files(root)
            later = [s for s in w.files if s > k * size] if damaged else []
            lost_bytes = original[expected_end - k * size : pos]
            expect_bin = damaged and lost_bytes.strip(b"\0") != b""
            assert len(kept) == len(later) + (1 if expect_bin else 0)
            cut = 0
            for path in kept:
                if path.suffix == ".bin":
                    assert path.name.startswith(f"{expected_end:020d}-")
                    content = path.read_bytes()
                    assert content + bytes(len(lost_bytes) - len(content)) == lost_bytes
                    cut += len(content)
                else:
                    start = int(path.name[:20])
                    assert path.read_bytes() == w.files[start]
                    cut += len(w.files[start].rstrip(b"\0"))
            assert report.cut_bytes == cut
            assert sorted(report.kept_aside) == kept
            # The log goes on from there, and a second recovery finds nothing to do.
            r = log.append(NewMessage(topic="after", body=b"z"))
            assert r.physical_offset >= expected_end
        finally:
            log.close()
        again = FileCommitLog.open(directory)
        assert again.recovery.kept_aside == ()
        assert again.max_offset == r.end_offset
        again.close()


def _field_kind(msg: StoredMessage, rel: int, flip: int) -> str:
    """Whether RocketMQ's checks must ("certain"), cannot ("never") or may ("maybe") catch
    a flipped byte at ``rel`` inside this record (layout of docs/rocketmq-protocol.md §4.1)."""
    head = 88 + (12 if msg.born_host.is_ipv6 else 0) + (12 if msg.store_host.is_ipv6 else 0)
    body_end = head + len(msg.body)
    topic_len_size = 2 if len(msg.topic.encode()) > 127 else 1
    topic_end = body_end + topic_len_size + len(msg.topic.encode())
    if rel < 8:  # TOTALSIZE, MAGICCODE
        return "certain"
    if rel < 12:  # BODYCRC, checked only when there is a body
        return "certain" if msg.body else "never"
    if rel == 39 and flip & 0x30:  # the host-family bits change the layout
        return "maybe"
    if rel < head - 4:
        return "never"
    if rel < head:  # body length
        return "maybe"
    if rel < body_end:  # body: the CRC catches it
        return "certain"
    if rel < body_end + topic_len_size:
        return "maybe"
    if rel < topic_end:
        return "never"
    if rel < topic_end + 2:  # properties length
        return "maybe"
    return "never"


@settings(max_examples=80)
@given(logs, st.data())
def test_a_flipped_byte_cuts_the_log_only_where_rocketmq_would_notice(
    log_spec: tuple[int, list[NewMessage]], data: st.DataObject
) -> None:
    size, messages = log_spec
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = root / "commitlog"
        w = write_log(directory, size, messages)
        last_start = max(w.files)
        where = data.draw(st.integers(0, last_start + size - 1), label="where")
        flip = data.draw(st.integers(1, 255), label="flip")
        k = where // size
        content = bytearray(w.files[k * size])
        content[where - k * size] ^= flip
        segment_path(directory, k * size).write_bytes(bytes(content))

        item = next(((s, e) for s, e in w.items_in(k) if s <= where < e), None)
        record = next((m for m in w.messages if m.physical_offset == (item or (-1,))[0]), None)
        if item is None:
            kind = "never"  # padding after a blank, or the zeros after the end
        elif record is None:
            kind = "certain" if where - item[0] >= 4 else "never"  # blank magic / length
        else:
            kind = _field_kind(record, where - item[0], flip)

        with FileCommitLog.open(directory, clean_shutdown=False) as log:
            end = log.max_offset
            after = list(log.iter_messages())
            kept = kept_files(root)
        if kind == "certain" or (kind == "maybe" and end != w.max_offset):
            assert item is not None
            assert end == item[0]
            assert after == [m for m in w.messages if m.physical_offset < item[0]]
            assert kept  # the damaged bytes and anything after them
            first = kept[0]
            assert first.name.startswith(f"{item[0]:020d}-")
            assert first.read_bytes() == bytes(content[item[0] - k * size :]).rstrip(b"\0")
        else:
            assert end == w.max_offset
            assert len(after) == len(w.messages)
            differ = [(a, b) for a, b in zip(after, w.messages, strict=True) if a != b]
            assert len(differ) <= 1
            if where >= w.max_offset:  # a stray byte after the end is kept, then cleared
                assert [p.name for p in kept] == [f"{w.max_offset:020d}-bad-magic.bin"]
            else:
                assert kept == []


def test_a_slaves_half_received_message_is_cut_and_kept(tmp_path: Path) -> None:
    master = FileCommitLog.open(
        tmp_path / "m" / "commitlog", segment_size=4096, clock_ms=FakeClock()
    )
    offsets = [
        master.append(NewMessage(topic="FooBar", body=b"q" * 50)).physical_offset for _ in range(3)
    ]
    directory = tmp_path / "s" / "commitlog"
    slave = FileCommitLog.open(directory, segment_size=4096)
    half = offsets[2] + 60
    slave.append_raw(0, master.read(0, half))
    partial = bytes(master.read(offsets[2], 60))
    slave.close()
    again = FileCommitLog.open(directory)
    assert again.recovery.valid_end == again.max_offset == offsets[2]
    assert again.recovery.reason == "size-mismatch"
    (kept,) = again.recovery.kept_aside
    assert kept == tmp_path / "s" / "lost+found" / f"{offsets[2]:020d}-size-mismatch.bin"
    assert kept.read_bytes() == partial
    # The slave reports offsets[2] and receives the message again.
    again.append_raw(offsets[2], master.read(offsets[2], 4096))
    assert [m.physical_offset for m in again.iter_messages()] == offsets
    again.close()
    master.close()


def test_later_segments_are_moved_aside_and_empty_ones_deleted(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    log = FileCommitLog.open(directory, segment_size=1024)
    offsets = [
        log.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(12)
    ]
    log.close()
    (directory / f"{3072:020d}").write_bytes(bytes(1024))  # pre-created, empty
    seg1 = segment_path(directory, 1024)
    data = bytearray(seg1.read_bytes())
    data[offsets[6] - 1024 + 100] ^= 0xFF  # inside record 6's body
    seg1.write_bytes(bytes(data))
    seg2_bytes = segment_path(directory, 2048).read_bytes()
    log = FileCommitLog.open(directory, clean_shutdown=False)
    report = log.recovery
    assert report.valid_end == offsets[6]
    assert report.reason == "crc-mismatch"
    assert report.deleted_empty == (directory / f"{3072:020d}",)
    aside = tmp_path / "lost+found"
    assert sorted(p.name for p in aside.iterdir()) == [
        f"{offsets[6]:020d}-crc-mismatch.bin",
        f"{2048:020d}-after-{offsets[6]}.segment",
    ]
    assert (aside / f"{2048:020d}-after-{offsets[6]}.segment").read_bytes() == seg2_bytes
    assert sorted(p.name for p in directory.iterdir()) == [f"{0:020d}", f"{1024:020d}"]
    assert seg1.stat().st_size == 1024
    assert seg1.read_bytes()[offsets[6] - 1024 :] == bytes(1024 - (offsets[6] - 1024))
    log.close()


def test_repeated_cuts_at_one_offset_do_not_overwrite_each_other(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    for _ in range(2):
        log = FileCommitLog.open(directory, segment_size=1024)
        end = log.max_offset
        log.append_raw(end, b"\x00\x00\x00\x10garbage")
        log.close()
        FileCommitLog.open(directory).close()
    assert sorted(p.name for p in (tmp_path / "lost+found").iterdir()) == [
        f"{0:020d}-bad-magic.bin",
        f"{0:020d}-bad-magic.bin.1",
    ]


# --- what gets checked ----------------------------------------------------------------


def _corrupt_first_body(directory: Path) -> None:
    first = segment_path(directory, 0)
    data = bytearray(first.read_bytes())
    data[100] ^= 0x01  # a body byte of the first record
    first.write_bytes(bytes(data))


def _five_segments(directory: Path) -> int:
    log = FileCommitLog.open(directory, segment_size=1024)
    for _ in range(23):
        log.append(NewMessage(topic="FooBar", body=b"b" * 100))
    end = log.max_offset
    log.close()
    return end


def test_after_a_clean_shutdown_only_the_last_three_segments_are_crc_checked(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "commitlog"
    end = _five_segments(directory)
    _corrupt_first_body(directory)
    log = FileCommitLog.open(directory, clean_shutdown=True)
    assert log.recovery.crc_checked_from == 2048
    assert log.max_offset == end
    log.close()


def test_after_a_crash_every_crc_is_checked(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    _five_segments(directory)
    _corrupt_first_body(directory)
    log = FileCommitLog.open(directory, clean_shutdown=False)
    assert log.recovery.crc_checked_from == 0
    assert log.max_offset == 0
    assert log.recovery.reason == "crc-mismatch"
    assert len(log.recovery.kept_aside) == 5
    log.close()


def test_check_crc_off(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    end = _five_segments(directory)
    _corrupt_first_body(directory)
    with FileCommitLog.open(directory, clean_shutdown=False, check_crc=False) as log:
        assert log.max_offset == end


# --- state that must survive a restart ------------------------------------------------


def test_queue_offsets_continue_after_restart(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    log = FileCommitLog.open(directory, segment_size=1024)
    for i in range(13):
        log.append(NewMessage(topic=f"T{i % 3}", body=b"b" * 90, queue_id=i % 2))
    log.close()
    log = FileCommitLog.open(directory)
    assert log.recovery.messages == 13
    assert log.next_queue_offset("T0", 0) == 3  # i = 0, 6, 12
    assert log.next_queue_offset("T0", 1) == 2  # i = 3, 9
    assert log.append(NewMessage(topic="T1", body=b"", queue_id=1)).queue_offset == 2  # i = 1, 7
    log.close()


def test_a_last_segment_closed_by_a_blank_stays_full(tmp_path: Path) -> None:
    directory = tmp_path / "commitlog"
    master = FileCommitLog.open(tmp_path / "m" / "commitlog", segment_size=1024)
    for _ in range(6):
        master.append(NewMessage(topic="FooBar", body=b"b" * 100))
    slave = FileCommitLog.open(directory, segment_size=1024)
    blank_at = 5 * 197
    slave.append_raw(0, master.read(0, blank_at + 8))  # the blank, not all its padding
    slave.close()
    log = FileCommitLog.open(directory)
    assert log.max_offset == 1024
    assert log.recovery.kept_aside == ()
    log.append_raw(1024, master.read(1024, 4096))
    assert len(list(log.iter_messages())) == 6
    log.close()
    master.close()


def test_a_log_started_inside_a_segment_keeps_its_start(tmp_path: Path) -> None:
    master = FileCommitLog.open(tmp_path / "m" / "commitlog", segment_size=1024)
    offsets = [
        master.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(9)
    ]
    directory = tmp_path / "s" / "commitlog"
    slave = FileCommitLog.open(directory, segment_size=1024)
    slave.append_raw(offsets[6], master.read(offsets[6], 4096))
    slave.close()
    marker = tmp_path / "s" / "commitlog.start"
    assert marker.read_text() == f"{offsets[6]}\n"
    slave = FileCommitLog.open(directory)
    assert (slave.min_offset, slave.max_offset) == (offsets[6], master.max_offset)
    assert slave.recovery.kept_aside == ()
    assert [m.physical_offset for m in slave.iter_messages()] == offsets[6:]
    slave.close()
    master.close()


def test_a_bad_start_marker_is_a_layout_error(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog.start").write_text("soon")
    with pytest.raises(StoreLayoutError, match=r"commitlog\.start should hold the log's start"):
        FileCommitLog.open(tmp_path / "commitlog")


# --- a directory RocketMQ wrote -------------------------------------------------------


def test_a_commitlog_written_by_rocketmq_opens_and_iterates(tmp_path: Path) -> None:
    """4.9 properties form, blank record at each file end, zero tail, 8 KiB files
    (ConsumeQueueTest's COMMIT_LOG_FILE_SIZE), one IPv6 born host."""
    root = tmp_path / "store"
    java = [
        JavaMessage(
            topic="FooBar" if i % 4 else "TopicTest",
            body=b"Once, there was a chance for me!" * (1 + i % 5),
            queue_id=i % 3,
            properties=(("KEYS", str(1_700_000_000_000 + i)), ("TAGS", "TAG1")),
            born=("::1", 5000 + i) if i == 7 else ("127.0.0.1", 0),
        )
        for i in range(80)
    ]
    placed, blanks = write_java_commitlog(root / "commitlog", java, 8192)
    before = {p.name: p.read_bytes() for p in (root / "commitlog").iterdir()}
    assert len(before) > 2
    assert blanks
    with open_store(root) as store:
        log = store.commitlog
        assert log.segment_size == 8192
        assert store.recovery.kept_aside == ()
        assert log.max_offset == placed[-1].offset + len(placed[-1].record)
        msgs = list(log.iter_messages())
        assert [(m.physical_offset, m.queue_offset) for m in msgs] == [
            (p.offset, p.queue_offset) for p in placed
        ]
        assert [m.encode() for m in msgs] == [p.record for p in placed]
        assert msgs[7].born_host == HostAddress("::1", 5007)
        assert msgs[1].properties_dict() == {"KEYS": "1700000000001", "TAGS": "TAG1"}
        for b in blanks:
            assert bytes(log.read(b, 8))[4:] == b"\xcb\xd4\x31\x94"
        r = log.append(NewMessage(topic="FooBar", body=b"next", queue_id=1))
        assert r.queue_offset == sum(1 for m in java if m.topic == "FooBar" and m.queue_id == 1)
    # Opening changed nothing that RocketMQ wrote; the new record went after it.
    after = {p.name: p.read_bytes() for p in (root / "commitlog").iterdir()}
    end = placed[-1].offset + len(placed[-1].record)
    for name, data in before.items():
        keep = max(0, min(8192, end - int(name)))
        assert after[name][:keep] == data[:keep]
    assert r.physical_offset >= end


def test_segment_size_is_taken_from_the_files(tmp_path: Path) -> None:
    write_java_commitlog(tmp_path / "commitlog", [JavaMessage("t", b"x")] * 3, 4096)
    with FileCommitLog.open(tmp_path / "commitlog") as log:
        assert log.segment_size == 4096
        assert log.recovery.messages == 3
    with pytest.raises(StoreLayoutError, match="is 4096 bytes; every commit log file must be"):
        FileCommitLog.open(tmp_path / "commitlog", segment_size=8192)


def test_open_does_not_touch_files_on_a_layout_error(tmp_path: Path) -> None:
    write_java_commitlog(tmp_path / "commitlog", [JavaMessage("t", b"x" * 900)] * 12, 4096)
    (tmp_path / "commitlog" / f"{4096:020d}").unlink()  # a gap
    before = {p: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()}
    with pytest.raises(StoreLayoutError, match="gap in the commit log"):
        FileCommitLog.open(tmp_path / "commitlog")
    assert {p: p.read_bytes() for p in (tmp_path / "commitlog").iterdir()} == before
    assert not (tmp_path / "lost+found").exists()
    assert os.listdir(tmp_path) == ["commitlog"]


def test_a_start_marker_outside_the_first_segment_is_ignored_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "commitlog"
    log = FileCommitLog.open(directory, segment_size=1024)
    log.append(NewMessage(topic="FooBar", body=b"b" * 100))
    log.close()
    marker = tmp_path / "commitlog.start"
    marker.write_text("5000\n")  # not inside segment [0, 1024)
    with caplog.at_level("INFO"):
        log = FileCommitLog.open(directory)
    assert "ignoring" in caplog.text and "5000" in caplog.text
    assert log.min_offset == 0 and len(list(log.iter_messages())) == 1
    assert not marker.exists()
    log.close()


def test_a_start_marker_with_no_segments_is_removed(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    marker = tmp_path / "commitlog.start"
    marker.write_text("2048\n")
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024)
    assert (log.min_offset, log.max_offset) == (0, 0)
    assert not marker.exists()
    log.close()


def test_an_unreadable_start_marker_is_a_layout_error(tmp_path: Path) -> None:
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog.start").mkdir()
    with pytest.raises(StoreLayoutError, match=r"cannot read .*commitlog\.start"):
        FileCommitLog.open(tmp_path / "commitlog", segment_size=1024)


def test_an_aside_directory_that_cannot_be_made_stops_the_cut_before_it_starts(
    tmp_path: Path,
) -> None:
    log = FileCommitLog.open(
        tmp_path / "commitlog", segment_size=1024, aside_dir=tmp_path / "file" / "lost+found"
    )
    first = log.append(NewMessage(topic="FooBar", body=b"b" * 100))
    log.append(NewMessage(topic="FooBar", body=b"c" * 100))
    end = log.max_offset
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageError, match=r"cannot create .*lost\+found"):
        log.truncate_to_boundary(first.physical_offset + first.size)
    assert log.max_offset == end and len(list(log.iter_messages())) == 2  # nothing lost
    log.close()


# --- disk failures while cutting, flushing and moving the start -------------------------------


def _eio(*args: object) -> None:
    raise OSError(5, "Input/output error")


def _two_segments(tmp_path: Path) -> tuple[FileCommitLog, int, bytes]:
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024)
    first = log.append(NewMessage(topic="FooBar", body=b"a" * 100))
    while log.max_offset < 1500:
        log.append(NewMessage(topic="FooBar", body=b"b" * 100))
    log.flush()
    cut = first.physical_offset + first.size
    return log, cut, bytes(log.read(0, 1024)) + bytes(log.read(1024, 1024))


def test_a_cut_whose_copy_cannot_be_made_durable_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, cut, before = _two_segments(tmp_path)
    end = log.max_offset
    monkeypatch.setattr(os, "fsync", _eio)
    with pytest.raises(StorageError, match=rf"cannot keep bytes \[{cut}, 1024\) aside .*Errno 5"):
        log.truncate_to_boundary(cut)
    monkeypatch.undo()
    assert log.max_offset == end
    assert bytes(log.read(0, 1024)) + bytes(log.read(1024, 1024)) == before
    log.close()


def test_a_segment_that_cannot_be_moved_aside_is_moved_by_the_next_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, cut, before = _two_segments(tmp_path)
    monkeypatch.setattr(os, "rename", _eio)
    with pytest.raises(StorageError, match=r"cannot move .*00000000000000001024 aside"):
        log.truncate_to_boundary(cut)
    monkeypatch.undo()
    assert log.max_offset == cut  # the log already ends at the cut
    log.close()
    again = FileCommitLog.open(tmp_path / "commitlog")
    assert again.max_offset == cut
    assert [m.physical_offset for m in again.iter_messages()] == [0]
    bin_file, segment = sorted((tmp_path / "lost+found").iterdir())
    assert bin_file.name.endswith("-truncated.bin")
    assert bin_file.read_bytes() == before[cut:1024]  # kept before the cut began
    assert segment.name.startswith("00000000000000001024")
    assert segment.read_bytes()[: len(before) - 1024] == before[1024:]
    assert again.recovery.kept_aside == (segment,)
    again.close()


def test_a_failed_fsync_is_an_error_and_leaks_no_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FileCommitLog.open(tmp_path / "commitlog", segment_size=1024)
    log.append(NewMessage(topic="FooBar", body=b"a" * 100))
    open_fds = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fdatasync", _eio)
    with pytest.raises(StorageError, match=r"fsync of the commit log .*commitlog failed"):
        log.flush()
    monkeypatch.undo()
    assert len(os.listdir("/proc/self/fd")) == open_fds
    assert log.flush() == log.max_offset  # a later flush covers the same bytes
    log.close()


def test_a_start_marker_that_cannot_be_written_stops_the_first_append(tmp_path: Path) -> None:
    master = FileCommitLog.open(tmp_path / "m" / "commitlog", segment_size=1024)
    offsets = [
        master.append(NewMessage(topic="FooBar", body=b"b" * 100)).physical_offset for _ in range(9)
    ]
    slave = FileCommitLog.open(tmp_path / "s" / "commitlog", segment_size=1024)
    (tmp_path / "s" / "commitlog.start.tmp").mkdir()
    with pytest.raises(StorageError, match=r"cannot update .*commitlog\.start"):
        slave.append_raw(offsets[6], master.read(offsets[6], 4096))
    slave.close()
    master.close()


def test_the_report_names_what_earlier_cuts_kept_aside_past_the_end(tmp_path: Path) -> None:
    """Bytes a start or a cut took out of the log stay in ``lost+found``, named by offset; a
    later recovery lists those from its end on (and only those): where the tail went when
    there is nothing left to cut."""
    with open_store(tmp_path, segment_size=4096) as store:
        offsets = [
            store.commitlog.append(NewMessage(topic="T", body=b"x" * 100)).physical_offset
            for _ in range(60)
        ]
        store.commitlog.truncate(offsets[50])  # kept aside: <offsets[50]>-truncated.bin
        store.commitlog.truncate(offsets[10])
    aside = tmp_path / "lost+found"
    (aside / "notes.txt").write_text("not ours")
    (aside / f"{offsets[40]:020d}-truncated.bin.1").write_bytes(b"x")
    with open_store(tmp_path) as store:
        report = store.recovery
    assert report.valid_end == offsets[10]
    kept = {
        offsets[10]: aside / f"{offsets[10]:020d}-truncated.bin",
        4096: aside / f"{4096:020d}-truncated.segment",  # whole later segments
        8192: aside / f"{8192:020d}-truncated.segment",
        offsets[40]: aside / f"{offsets[40]:020d}-truncated.bin.1",
        offsets[50]: aside / f"{offsets[50]:020d}-truncated.bin",
    }
    assert offsets[50] > 8192
    assert report.earlier_aside == tuple(kept[o] for o in sorted(kept))
    assert all(path.exists() for path in kept.values())
    with open_store(tmp_path) as store:
        assert store.commitlog.skip_past(8191) == 8192  # the log now ends past three of them
    with open_store(tmp_path) as store:
        assert store.recovery.earlier_aside == (kept[8192], kept[offsets[50]])
