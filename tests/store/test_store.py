"""The store directory (docs/rocketmq-protocol.md §4.5; DefaultMessageStore.load/start/shutdown,
StoreCheckpoint, MappedFileQueue.load): lock, abort marker, checkpoint, and layout errors that
change nothing.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trioha import StorageError, StoreLayoutError, StoreLockedError
from trioha.store import (
    CHECKPOINT_SIZE,
    Checkpoint,
    FlushDiskType,
    FlushPolicy,
    NewMessage,
    open_store,
    read_checkpoint,
    segment_name,
    write_checkpoint,
)
from trioha.store._contract import system_clock_ms

from .conftest import FakeClock


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with a digest of its content."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


def test_a_new_store_has_rocketmqs_layout(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with open_store(root, segment_size=4096, clock_ms=FakeClock()) as store:
        assert store.root == root
        assert (root / "commitlog").is_dir()
        assert (root / "config").is_dir()
        assert (root / "abort").exists()  # while running
        assert (root / "lock").exists()
        assert store.recovery.clean_shutdown
        store.commitlog.append(NewMessage(topic="FooBar", body=b"x"))
        assert os.listdir(root / "commitlog") == [segment_name(0)]
        assert store.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert not (root / "abort").exists()  # a clean stop
    assert (root / "checkpoint").stat().st_size == CHECKPOINT_SIZE


def test_the_checkpoint_records_the_last_flushed_message_time(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000_000)
    with open_store(tmp_path, segment_size=4096, clock_ms=clock) as store:
        store.commitlog.append(NewMessage(topic="t", body=b"1"))
        store.commitlog.append(NewMessage(topic="t", body=b"2", store_timestamp=1_700_000_000_500))
        assert store.flush() == store.commitlog.max_offset
        raw = (tmp_path / "checkpoint").read_bytes()
        assert struct.unpack_from(">q", raw, 0) == (1_700_000_000_500,)
        assert read_checkpoint(tmp_path / "checkpoint") == Checkpoint(1_700_000_000_500)
        assert store.checkpoint.physic_msg_timestamp == 1_700_000_000_500


def test_checkpoint_fields_we_do_not_own_are_kept(tmp_path: Path) -> None:
    raw = struct.pack(">qqqqq", 5, 6, 7, 8, 9) + b"\x11" * 100
    (tmp_path / "checkpoint").write_bytes(raw)
    with open_store(tmp_path, segment_size=4096, clock_ms=FakeClock(10_000)) as store:
        store.commitlog.append(NewMessage(topic="t", body=b"1"))
    cp = read_checkpoint(tmp_path / "checkpoint")
    assert cp == Checkpoint(10_001, 6, 7, 8, 9)
    assert (tmp_path / "checkpoint").read_bytes()[40:140] == b"\x11" * 100
    assert cp.min_timestamp == 0  # min(physic, logics) - 3000, not below 0


def test_a_crash_leaves_the_abort_file_and_recovery_says_so(tmp_path: Path) -> None:
    """The process dies without closing: ``abort`` stays, and the next open recovers with
    every CRC checked (recoverAbnormally)."""
    script = textwrap.dedent(
        f"""
        import os
        from trioha.store import NewMessage, open_store
        store = open_store({str(tmp_path)!r}, segment_size=4096)
        for i in range(30):
            store.commitlog.append(NewMessage(topic="FooBar", body=b"m" * 100))
        store.commitlog.append_raw(store.commitlog.max_offset, b"\\x00\\x00\\x01\\x00half")
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert (tmp_path / "abort").exists()
    with open_store(tmp_path) as store:
        report = store.recovery
        assert not report.clean_shutdown
        assert report.crc_checked_from == 0
        assert report.messages == 30
        assert report.reason == "bad-magic"
        assert [p.name for p in report.kept_aside] == [f"{report.valid_end:020d}-bad-magic.bin"]
    with open_store(tmp_path) as store:
        assert store.recovery.clean_shutdown
        assert store.recovery.kept_aside == ()


def test_a_second_opener_in_this_process_is_refused(tmp_path: Path) -> None:
    with open_store(tmp_path, segment_size=4096) as store:
        with pytest.raises(StoreLockedError, match=f"{tmp_path / 'lock'} is locked"):
            open_store(tmp_path, segment_size=4096)
        store.commitlog.append(NewMessage(topic="t", body=b"still mine"))
    with open_store(tmp_path) as again:
        assert again.commitlog.recovery.messages == 1


def test_a_lock_held_by_another_process_is_refused(tmp_path: Path) -> None:
    (tmp_path / "lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('locked', flush=True); sys.stdin.read()",
            str(tmp_path / "lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        before = snapshot(tmp_path)
        with pytest.raises(StoreLockedError, match="locked by another process"):
            open_store(tmp_path, segment_size=4096)
        assert snapshot(tmp_path) == before
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    open_store(tmp_path, segment_size=4096).close()


def test_the_posix_lock_rocketmq_takes_is_also_respected(tmp_path: Path) -> None:
    """Java's FileChannel.tryLock is an fcntl record lock, which flock does not see."""
    (tmp_path / "lock").touch()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX, 1); "
            "print('locked', flush=True); sys.stdin.read()",
            str(tmp_path / "lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreLockedError):
            open_store(tmp_path, segment_size=4096)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


# --- layout errors: a clear error naming the file, and nothing changed ------------------


def _store_with_data(root: Path) -> None:
    with open_store(root, segment_size=1024, clock_ms=FakeClock()) as store:
        for _ in range(12):
            store.commitlog.append(NewMessage(topic="FooBar", body=b"b" * 100))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda d: (d / segment_name(1024)).write_bytes(b"\0" * 1000),
            r"00000000000000001024 is 1000 bytes; every commit log file must be exactly 1024",
        ),
        (
            lambda d: (d / segment_name(1024)).unlink(),
            "gap in the commit log: .*00000000000000002048",
        ),
        (lambda d: (d / "notes.txt").write_text("hi"), r"unexpected file .*notes.txt"),
        (lambda d: (d / "1024").write_bytes(bytes(1024)), r"unexpected file .*/1024 in the commit"),
        (lambda d: (d / "sub").mkdir(), r"unexpected non-regular entry .*sub"),
        (
            lambda d: (d / f"{segment_name(3072)}.creating").write_bytes(b"x" + bytes(1023)),
            "unfinished segment file holding data",
        ),
        (
            lambda d: (d / segment_name(3000)).write_bytes(bytes(1024)),
            "00000000000000003000 starts at 3000, not a multiple of the segment size 1024",
        ),
    ],
)
def test_layout_errors_change_nothing(tmp_path: Path, damage: object, message: str) -> None:
    _store_with_data(tmp_path)
    damage(tmp_path / "commitlog")  # type: ignore[operator]
    before = snapshot(tmp_path)
    with pytest.raises(StoreLayoutError, match=message):
        open_store(tmp_path)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "abort").exists()
    # The lock was released: fixing the layout is enough to open again.


def test_a_wrong_segment_size_is_refused(tmp_path: Path) -> None:
    _store_with_data(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(StoreLayoutError, match="every commit log file must be exactly 4096"):
        open_store(tmp_path, segment_size=4096)
    assert snapshot(tmp_path) == before
    with open_store(tmp_path) as store:  # detected from the files
        assert store.commitlog.segment_size == 1024


def test_an_empty_leftover_of_segment_creation_is_removed(tmp_path: Path) -> None:
    _store_with_data(tmp_path)
    leftover = tmp_path / "commitlog" / f"{segment_name(3072)}.creating"
    leftover.write_bytes(bytes(1024))
    with open_store(tmp_path) as store:
        assert not leftover.exists()
        assert store.recovery.messages == 12


def test_commitlog_that_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "commitlog").write_text("oops")
    with pytest.raises(StoreLayoutError, match="commitlog is not a directory"):
        open_store(tmp_path)
    open_store(tmp_path / "other").close()  # and the lock of the first attempt is gone


def test_root_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreLayoutError, match=r"store root .*missing does not exist"):
        open_store(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreLayoutError, match="is not a directory"):
        open_store(tmp_path / "file")


def test_flush_policy() -> None:
    policy = FlushPolicy()
    assert not policy.due(now_ms=10, last_flush_ms=0, unflushed_bytes=0)
    assert not policy.due(now_ms=10, last_flush_ms=0, unflushed_bytes=100)
    assert policy.due(now_ms=10, last_flush_ms=0, unflushed_bytes=4 * 4096)
    assert policy.due(now_ms=10_000, last_flush_ms=0, unflushed_bytes=1)
    # The thorough interval counts from the last flush, not from the clock's zero.
    assert not policy.due(now_ms=20_000, last_flush_ms=15_000, unflushed_bytes=1)
    assert policy.due(now_ms=25_000, last_flush_ms=15_000, unflushed_bytes=1)
    sync = FlushPolicy(FlushDiskType.SYNC_FLUSH)
    assert sync.due(now_ms=0, last_flush_ms=0, unflushed_bytes=1)
    # Nothing dirty: no flush is due, whatever the policy and however long ago the last one.
    assert not sync.due(now_ms=0, last_flush_ms=0, unflushed_bytes=0)
    assert not policy.due(now_ms=60_000, last_flush_ms=0, unflushed_bytes=0)


def test_the_store_clock_is_wall_clock_milliseconds() -> None:
    # storeTimestamp / bornTimestamp are System.currentTimeMillis().
    before = time.time_ns() // 1_000_000
    now = system_clock_ms()
    assert before <= now <= time.time_ns() // 1_000_000


def test_a_checkpoint_that_cannot_be_read_or_written_is_a_named_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(StorageError, match=r"cannot read checkpoint .*checkpoint"):
        read_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(StorageError, match=r"cannot write checkpoint .*checkpoint"):
        write_checkpoint(tmp_path / "checkpoint", Checkpoint())
    with pytest.raises(StorageError, match="cannot write checkpoint"):
        write_checkpoint(tmp_path / "missing" / "checkpoint", Checkpoint())


def test_a_store_whose_checkpoint_cannot_be_read_does_not_open_and_unlocks(
    tmp_path: Path,
) -> None:
    open_store(tmp_path, segment_size=4096).close()
    (tmp_path / "checkpoint").unlink()
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(StorageError, match="cannot read checkpoint"):
        open_store(tmp_path, segment_size=4096)
    (tmp_path / "checkpoint").rmdir()
    with open_store(tmp_path, segment_size=4096) as store:  # the failed attempt left no lock
        assert store.config_dir == tmp_path / "config" and store.config_dir.is_dir()
        assert repr(store).startswith(f"<Store {tmp_path} ")


def test_a_store_that_cannot_be_prepared_names_the_reason(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("a file where a directory belongs")
    with pytest.raises(StorageError, match=rf"cannot prepare store {tmp_path}: .*config"):
        open_store(tmp_path, segment_size=4096)
    assert not (tmp_path / "abort").exists()


def test_a_lock_file_that_cannot_be_opened_is_a_layout_error(tmp_path: Path) -> None:
    (tmp_path / "lock").mkdir()
    with pytest.raises(StoreLayoutError, match=r"cannot open lock file .*lock"):
        open_store(tmp_path, segment_size=4096)


def test_closing_twice_is_harmless(tmp_path: Path) -> None:
    store = open_store(tmp_path, segment_size=4096)
    store.close()
    store.close()
    store._lock.release()  # already released: nothing to do
    assert store.commitlog.flush() == 0  # a closed log answers with what it flushed


# --- what open_store passes on, and what an operator sees -----------------------------


def test_an_unclean_stop_is_logged_once_with_the_abort_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    open_store(tmp_path, segment_size=4096).close()
    with caplog.at_level("WARNING", logger="trioha.store"):
        open_store(tmp_path, segment_size=4096).close()  # clean: nothing to say
    assert [r.getMessage() for r in caplog.records if r.name == "trioha.store"] == []
    (tmp_path / "abort").touch()  # what a crash leaves behind
    with (
        caplog.at_level("WARNING", logger="trioha.store"),
        open_store(tmp_path, segment_size=4096) as store,
    ):
        assert not store.recovery.clean_shutdown
    assert [r.getMessage() for r in caplog.records if r.name == "trioha.store"] == [
        f"{tmp_path / 'abort'} exists: the store was not shut down cleanly; full recovery"
    ]


def test_a_commitlog_elsewhere_keeps_the_stores_markers_in_the_root(tmp_path: Path) -> None:
    """``storePathCommitLog`` on a disk of its own: the segments go there, while lost+found
    and commitlog.start stay in the store root."""
    root, disk = tmp_path / "store", tmp_path / "disk" / "commitlog"
    disk.parent.mkdir()
    with open_store(root, segment_size=1024, commitlog_dir=disk) as store:
        for _ in range(3):
            store.commitlog.append(NewMessage(topic="FooBar", body=b"b" * 100))
        store.commitlog.append_raw(store.commitlog.max_offset, b"\x00\x00\x01\x00half")
        end = store.commitlog.max_offset
    assert os.listdir(disk) == [segment_name(0)]
    assert not (root / "commitlog").exists()
    (root / "abort").touch()
    with open_store(root, commitlog_dir=disk) as store:
        assert store.recovery.messages == 3
        assert store.recovery.reason == "bad-magic"
        assert [p.parent for p in store.recovery.kept_aside] == [root / "lost+found"]
        assert store.commitlog.max_offset < end
    assert not (disk.parent / "lost+found").exists()
    (root / "commitlog.start").write_text("not a number\n")
    with pytest.raises(
        StoreLayoutError,
        match=f"{root / 'commitlog.start'} should hold the log's start offset, found 'not a",
    ):
        open_store(root, commitlog_dir=disk)


def test_open_options_reach_the_commit_log(tmp_path: Path) -> None:
    from trioha.store._message import HostAddress, PropertiesForm

    calls: list[tuple[int, int]] = []
    host = HostAddress("10.1.2.3", 10911)
    _store_with_data(tmp_path)
    with open_store(
        tmp_path,
        store_host=host,
        max_message_size=512,
        properties_form=PropertiesForm.V5,
        recovery_progress=lambda done, total: calls.append((done, total)),
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        flush_interval_ms=200,
    ) as store:
        assert store.commitlog.store_host == host
        assert store.commitlog.max_message_size == 512
        assert store.commitlog.properties_form is PropertiesForm.V5
        assert store.flush_policy == FlushPolicy(FlushDiskType.SYNC_FLUSH, 200)
        assert calls and calls[-1][0] == calls[-1][1] == len(os.listdir(tmp_path / "commitlog"))
        with pytest.raises(
            StorageError, match="message body is 513 bytes, more than maxMessageSize 512"
        ):
            store.commitlog.append(NewMessage(topic="t", body=b"x" * 513))
    with open_store(tmp_path) as store:
        assert store.flush_policy == FlushPolicy(FlushDiskType.ASYNC_FLUSH, 500)


def test_create_false_does_not_create_a_missing_commitlog(tmp_path: Path) -> None:
    with pytest.raises(StoreLayoutError, match=f"{tmp_path / 'commitlog'}"):
        open_store(tmp_path, segment_size=4096, create=False)
    assert os.listdir(tmp_path) == ["lock"]  # no commitlog, no abort, no checkpoint


def test_the_checkpoint_file_is_made_when_the_store_opens(tmp_path: Path) -> None:
    """StoreCheckpoint takes its 4 KiB at start, so a clean stop can record itself even on
    a disk that filled up meanwhile."""
    with open_store(tmp_path, segment_size=4096, clock_ms=FakeClock()):
        assert (tmp_path / "checkpoint").read_bytes() == bytes(CHECKPOINT_SIZE)
        assert sorted(os.listdir(tmp_path)) == [
            "abort",
            "checkpoint",
            "commitlog",
            "config",
            "lock",
        ]


# --- the lock and close, as a second opener and an operator see them ----------------------


def test_a_second_opener_here_is_refused_before_it_touches_the_lock(tmp_path: Path) -> None:
    """Opening the lock file again would drop this process's POSIX lock when closed, so the
    refusal comes from the table of held locks, and the first store keeps its lock."""
    with open_store(tmp_path, segment_size=4096) as store:
        for _ in range(2):
            with pytest.raises(StoreLockedError) as info:
                open_store(tmp_path, segment_size=4096)
            assert str(info.value) == (
                f"{tmp_path / 'lock'} is locked: the store is already open here"
            )
        store.commitlog.append(NewMessage(topic="t", body=b"still mine"))
    open_store(tmp_path, segment_size=4096).close()


def test_the_lock_file_is_made_readable_by_all(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        open_store(tmp_path, segment_size=4096).close()
    finally:
        os.umask(old)
    assert (tmp_path / "lock").stat().st_mode & 0o777 == 0o644


def test_a_lock_on_descriptor_zero_is_released(tmp_path: Path) -> None:
    """A daemon runs with stdin closed: the lock file then gets descriptor 0, and closing the
    store must still release it."""
    saved = os.dup(0)
    os.close(0)
    try:
        store = open_store(tmp_path, segment_size=4096)
        assert store._lock._fd == 0
        store.close()
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(0)  # closed again: the lock is gone with it
        open_store(tmp_path, segment_size=4096).close()
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_closing_again_leaves_other_descriptors_and_a_later_opener_alone(tmp_path: Path) -> None:
    first = open_store(tmp_path, segment_size=4096, clock_ms=FakeClock(1_000))
    first.commitlog.append(NewMessage(topic="t", body=b"1"))
    first.close()
    with open_store(tmp_path, segment_size=4096, clock_ms=FakeClock(5_000)) as second:
        second.commitlog.append(NewMessage(topic="t", body=b"2"))
        checkpoint = (tmp_path / "checkpoint").read_bytes()
        first.close()  # a stale handle: must not end the running store's session
        first._lock.release()
        os.fstat(1)
        os.fstat(2)
        assert (tmp_path / "abort").exists()
        assert (tmp_path / "checkpoint").read_bytes() == checkpoint
        with pytest.raises(StoreLockedError, match="already open here"):
            open_store(tmp_path, segment_size=4096)
    assert read_checkpoint(tmp_path / "checkpoint").physic_msg_timestamp == 5_001


def test_an_abort_file_removed_by_hand_does_not_stop_close(tmp_path: Path) -> None:
    store = open_store(tmp_path, segment_size=4096, clock_ms=FakeClock(7_000))
    store.commitlog.append(NewMessage(topic="t", body=b"1"))
    (tmp_path / "abort").unlink()
    store.close()
    assert read_checkpoint(tmp_path / "checkpoint").physic_msg_timestamp == 7_001
    with open_store(tmp_path) as again:  # the lock was released
        assert again.recovery.clean_shutdown
        assert again.recovery.messages == 1


def test_check_crc_false_trusts_the_bodies_even_after_a_crash(tmp_path: Path) -> None:
    with open_store(tmp_path, segment_size=4096, clock_ms=FakeClock()) as store:
        for body in (b"first", b"second", b"third-body"):
            store.commitlog.append(NewMessage(topic="t", body=body))
    segment = tmp_path / "commitlog" / segment_name(0)
    raw = segment.read_bytes()
    segment.write_bytes(raw.replace(b"third-body", b"THIRD-body"))
    (tmp_path / "abort").touch()
    with open_store(tmp_path, check_crc=False) as store:
        assert not store.recovery.clean_shutdown
        assert store.recovery.messages == 3
        assert store.recovery.kept_aside == ()
    (tmp_path / "abort").touch()
    with open_store(tmp_path) as store:  # checked: the damaged message is cut
        assert store.recovery.messages == 2
        assert store.recovery.reason == "crc-mismatch"
        assert store.recovery.valid_end == 195


def test_a_short_checkpoint_is_extended_to_4_kib_when_the_store_opens(tmp_path: Path) -> None:
    """StoreCheckpoint maps 4 KiB at start whatever the file held; the fields are kept."""
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qqqqq", 5, 6, 7, 8, 9))
    with open_store(tmp_path, segment_size=4096, clock_ms=FakeClock()):
        raw = (tmp_path / "checkpoint").read_bytes()
        assert raw == struct.pack(">qqqqq", 5, 6, 7, 8, 9).ljust(CHECKPOINT_SIZE, b"\0")
