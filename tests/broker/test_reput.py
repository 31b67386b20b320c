"""The consume queue builder (ReputMessageService) over a real commit log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.broker._diskfaults import RefusingFallocate
from trioha import NotAMessageBoundaryError
from trioha.broker._delaylevels import SCHEDULE_TOPIC, deliver_timestamp, parse_delay_levels
from trioha.broker._reput import (
    _TAG_CODES,
    _TAG_CODES_MAX,
    ReputService,
    _tags_code,
    truncate_replica,
)
from trioha.remoting import loads_lenient
from trioha.store import (
    MESSAGE_INDEX,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V2,
    ConsumeQueueStore,
    DiskGuard,
    HostAddress,
    IndexService,
    MemoryCommitLog,
    NewMessage,
    _index,  # its os, for a refusing fallocate
    properties_to_string,
    tags_code,
)

SEGMENT = 4096


def fill(
    log: MemoryCommitLog, n: int, *, topics: tuple[str, ...] = ("T",), queues: int = 2
) -> None:
    for i in range(n):
        log.append(
            NewMessage(
                topic=topics[i % len(topics)],
                body=b"m%04d" % i + b"x" * 100,
                queue_id=i % queues,
                properties={"TAGS": "TagA" if i % 2 else "TagB"},
            )
        )


def service(log: MemoryCommitLog, root: Path) -> ReputService:
    reput = ReputService(log, ConsumeQueueStore(root, file_size=200), checkpoint=root / "cp.json")
    reput.recover()
    return reput


def test_builds_every_queue_across_segments(tmp_path: Path) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    fill(log, 120, topics=("T", "U"), queues=3)  # several segments, each closed by a blank record
    assert log.max_offset > 3 * SEGMENT
    reput = service(log, tmp_path)
    while reput.dispatch_available(max_records=7):
        pass
    assert reput.reput_from == log.max_offset
    assert reput.behind == 0
    messages = list(log.iter_messages())
    for topic in ("T", "U"):
        for queue_id in (0, 1, 2):
            queue = reput.queues.get(topic, queue_id)
            assert queue is not None
            expected = [m for m in messages if (m.topic, m.queue_id) == (topic, queue_id)]
            assert queue.max_offset == len(expected)
            for unit_index, message in enumerate(expected):
                unit = queue.get(unit_index)
                assert unit is not None
                assert (unit.commitlog_offset, unit.size, unit.tags_code) == (
                    message.physical_offset,
                    message.total_size,
                    tags_code(message.tags),
                )


def test_half_replicated_message_waits_never_skips(tmp_path: Path) -> None:
    master = MemoryCommitLog(segment_size=SEGMENT)
    fill(master, 3)
    data = bytes(master.read(0, master.max_offset))
    slave = MemoryCommitLog(segment_size=SEGMENT)
    cut = len(data) - 50  # the last message only partly received
    slave.append_raw(0, data[:cut])
    reput = service(slave, tmp_path)
    assert reput.dispatch_available() == 2
    third = list(master.iter_messages())[2]
    assert reput.reput_from == third.physical_offset
    assert reput.dispatch_available() == 0  # still partial: nothing happens
    slave.append_raw(cut, data[cut:])
    assert reput.dispatch_available() == 1
    queue = reput.queues.get("T", 0)
    assert queue is not None
    assert queue.max_offset == 2  # messages 0 and 2 went to queue 0


def test_restart_resumes_and_truncates(tmp_path: Path) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    fill(log, 10)
    reput = service(log, tmp_path)
    reput.dispatch_available()
    reput.queues.close()
    # The commit log lost its last 3 messages (recovery cut them): their units must go.
    cut = list(log.iter_messages())[7].physical_offset
    log.truncate(cut)
    again = service(log, tmp_path)
    q0, q1 = again.queues.get("T", 0), again.queues.get("T", 1)
    assert q0 is not None
    assert q1 is not None
    assert (q0.max_offset, q1.max_offset) == (4, 3)
    assert again.reput_from == cut
    fill(log, 2)
    again.dispatch_available()
    assert (q0.max_offset, q1.max_offset) == (5, 4)


def test_checkpoint_makes_a_restart_redispatch_lost_units(tmp_path: Path) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    fill(log, 6, queues=2)
    reput = service(log, tmp_path)
    reput.dispatch_available()
    (tmp_path / "cp.json").write_text('{"dispatchedOffset": 0}')
    # Queue 1's last unit was lost (an unflushed page): zero it on disk.
    queue1 = reput.queues.get("T", 1)
    assert queue1 is not None
    reput.queues.close()
    path = tmp_path / "consumequeue" / "T" / "1" / f"{0:020d}"
    raw = bytearray(path.read_bytes())
    raw[40:60] = bytes(20)
    path.write_bytes(bytes(raw))
    again = service(log, tmp_path)
    assert again.reput_from == 0  # the checkpoint is older than the furthest unit
    again.dispatch_available()
    restored = again.queues.get("T", 1)
    assert restored is not None
    assert restored.max_offset == 3


def test_invalid_record_stops_with_one_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    fill(log, 2)
    good_end = log.max_offset
    log.append_raw(good_end, b"\x00\x00\x00\x60" + b"\xde\xad\xbe\xef" + bytes(88))
    reput = service(log, tmp_path)
    assert reput.dispatch_available() == 2
    assert reput.dispatch_available() == 0
    assert reput.reput_from == good_end
    assert caplog.text.count("consume queue building stopped") == 1


async def test_long_poll_wakes_on_arrival(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    grew = trio.Event()

    async def wait_log_grew(beyond: int) -> None:
        nonlocal grew
        while log.max_offset <= beyond:
            await grew.wait()
            grew = trio.Event()

    reput = service(log, tmp_path)
    woke_at: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(reput.run, wait_log_grew)

        async def poll() -> None:
            await reput.wait_arrival("T", 1, 0)
            woke_at.append(trio.current_time())

        nursery.start_soon(poll)
        await trio.sleep(5)
        fill(log, 1)  # queue 0: the poller of queue 1 keeps waiting
        grew.set()
        await trio.sleep(5)
        assert woke_at == []
        fill(log, 1, queues=1)
        log.append(NewMessage(topic="T", body=b"q1", queue_id=1))
        grew.set()
        await trio.sleep(1)
        assert len(woke_at) == 1
        await reput.wait_dispatched(log.max_offset)
        nursery.cancel_scope.cancel()
    assert (tmp_path / "cp.json").exists()  # flushed and checkpointed on the way out


@pytest.mark.parametrize("tags", [None, "TagA", "标签", "TagA TagB", "x" * 300])
def test_the_tag_code_comes_from_the_raw_properties(tags: str | None) -> None:
    props: dict[str, str] = {"KEYS": "k1", "UNIQ_KEY": "abc"}
    if tags is not None:
        props["TAGS"] = tags
    raw = properties_to_string(props).encode()
    for _ in range(2):  # computed, then cached
        assert _tags_code(raw, 0, len(raw)) == tags_code(tags)
    # Found in place, within the span only: a TAGS around it in the buffer does not count.
    around = b"TAGS\x01Outside\x02" + raw + b"TAGS\x01After"
    assert _tags_code(around, 13, 13 + len(raw)) == tags_code(tags)


def test_the_tag_code_cache_is_bounded() -> None:
    for i in range(5000):
        raw = properties_to_string({"TAGS": f"t{i}"}).encode()
        assert _tags_code(raw, 0, len(raw)) == tags_code(f"t{i}")
    assert len(_TAG_CODES) <= _TAG_CODES_MAX


# --- truncate_replica: the safe truncation, with the queues following ---------------------


def dispatched(root: Path, n: int) -> tuple[MemoryCommitLog, ReputService]:
    """A log of *n* messages, fully indexed, the checkpoint written."""
    log = MemoryCommitLog(segment_size=SEGMENT)
    fill(log, n)
    reput = service(log, root)
    reput.dispatch_available()
    trio.run(reput.flush)
    return log, reput


def test_truncate_replica_cuts_log_queues_and_checkpoint_together(tmp_path: Path) -> None:
    log, reput = dispatched(tmp_path, 10)
    assert loads_lenient((tmp_path / "cp.json").read_text())["dispatchedOffset"] == log.max_offset
    cut = list(log.iter_messages())[6].physical_offset
    kept = truncate_replica(log, reput.queues, tmp_path / "cp.json", cut, reput=reput)
    assert [k.offset for k in kept] == [cut]
    assert log.max_offset == cut
    q0, q1 = reput.queues.get("T", 0), reput.queues.get("T", 1)
    assert q0 is not None
    assert q1 is not None
    assert (q0.max_offset, q1.max_offset) == (3, 3)
    assert reput.reput_from == cut
    assert loads_lenient((tmp_path / "cp.json").read_text())["dispatchedOffset"] == cut
    # New history at the same offsets is indexed afresh, pointing at the new records.
    fill(log, 2)
    reput.dispatch_available()
    unit = q0.get(3)
    assert unit is not None
    assert unit.commitlog_offset == cut


def test_truncate_replica_refuses_a_cut_inside_a_record_and_changes_nothing(
    tmp_path: Path,
) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    fill(log, 5)
    queues = ConsumeQueueStore(tmp_path, file_size=200)
    reput = ReputService(log, queues, checkpoint=tmp_path / "cp.json")
    reput.recover()
    reput.dispatch_available()
    end = log.max_offset
    with pytest.raises(NotAMessageBoundaryError, match="not a message boundary"):
        truncate_replica(log, queues, tmp_path / "cp.json", end - 3)
    assert log.max_offset == end
    q0 = queues.get("T", 0)
    assert q0 is not None
    assert q0.max_offset == 3


def test_truncate_replica_offline_leaves_queues_a_restart_agrees_with(tmp_path: Path) -> None:
    log, reput = dispatched(tmp_path, 10)
    reput.queues.close()
    queues = ConsumeQueueStore(tmp_path, file_size=200)
    queues.load()
    cut = list(log.iter_messages())[4].physical_offset
    truncate_replica(log, queues, tmp_path / "cp.json", cut)
    queues.close()
    again = service(log, tmp_path)
    assert again.reput_from == cut
    q0 = again.queues.get("T", 0)
    assert q0 is not None
    assert q0.max_offset == 2


# --- the builder's record reading against fully decoded messages ---------------------------


def _varied_log() -> MemoryCommitLog:
    """Every kind of record the builder meets: tags or none, keys, unique keys, delayed
    messages (valid, zero and unreadable levels), transactions, IPv6 hosts, a topic long
    enough for the V2 record, across many segments closed by blank records."""
    log = MemoryCommitLog(segment_size=SEGMENT)
    v6 = HostAddress("::1", 10911)
    for i in range(400):
        props: dict[str, str] = {}
        if i % 3:
            props["TAGS"] = f"Tag{i % 5}" if i % 7 else "标签"
        if i % 4 == 0:
            props["KEYS"] = f"order-{i} user-{i % 9}  trailing "
        if i % 5 != 1:
            props["UNIQ_KEY"] = f"7F00000100002A9F0000{i:012X}"
        topic, queue_id, sysflag = f"T{i % 3}", i % 2, 0
        if i % 11 == 0:
            topic, queue_id = SCHEDULE_TOPIC, 2
            props["DELAY"] = ("3", "0", "abc")[i % 3]
        if i % 13 == 0:
            sysflag = (0x4, 0x8, 0xC)[i % 3]  # prepared, committed, rolled back
        if i % 17 == 0:
            topic = "L" * 200  # V2 magic: a two-byte topic length
        log.append(
            NewMessage(
                topic=topic,
                body=b"b%04d" % i * (1 + i % 30),
                queue_id=queue_id,
                properties=props,
                sysflag=sysflag,
                born_host=v6 if i % 19 == 0 else None,
                store_host=v6 if i % 23 == 0 else None,
            )
        )
    return log


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("batch", [1, 7, 2048])
def test_queues_and_index_match_those_built_from_decoded_messages(
    tmp_path: Path, batch: int
) -> None:
    log = _varied_log()
    assert log.max_offset > 20 * SEGMENT
    delays = parse_delay_levels("1s 5s 10s 30s")
    built, expected = tmp_path / "built", tmp_path / "expected"
    index = IndexService(built, slots=97, max_index=150)  # several index files fill up
    index.load(flushed_up_to=None)
    reput = ReputService(
        log,
        ConsumeQueueStore(built, file_size=400),
        checkpoint=built / "cp.json",
        index=index,
        delay_levels=delays,
    )
    reput.recover()
    while reput.dispatch_available(max_records=batch):
        pass
    assert reput.reput_from == log.max_offset
    for queue in reput.queues:
        queue.write_pending()

    # The same, one fully decoded message at a time (DefaultMessageStore's dispatchers).
    queues = ConsumeQueueStore(expected, file_size=400)
    reference = IndexService(expected, slots=97, max_index=150)
    reference.load(flushed_up_to=None)
    kinds: set[tuple[int, bool, int, bool]] = set()
    for m in log.iter_messages():
        kinds.add((m.sysflag & 0xC, m.topic == SCHEDULE_TOPIC, m.magic, m.born_host.is_ipv6))
        uniq, keys = m.get_property("UNIQ_KEY"), m.keys
        raw_keys = (uniq.encode() if uniq is not None else None, keys.encode() if keys else None)
        if m.sysflag & 0xC in (0x0, 0x8):
            level = m.get_property("DELAY")
            tags = tags_code(m.tags)
            if m.topic == SCHEDULE_TOPIC and level is not None and level.isdigit() and int(level):
                tags = deliver_timestamp(delays, int(level), m.store_timestamp)
            queue = queues.find_or_create(m.topic, m.queue_id)
            queue.put(m.queue_offset, m.physical_offset, m.total_size, tags)
            queue.write_pending()
        if m.sysflag & 0xC != 0xC:
            reference.build_raw(m.topic, m.physical_offset, m.store_timestamp, *raw_keys, now_ms=0)
    assert {k[2] for k in kinds} == {MESSAGE_MAGIC, MESSAGE_MAGIC_V2}
    assert len(kinds) >= 7  # every kind of record above was met, IPv6 hosts too

    assert _files(built / "consumequeue") == _files(expected / "consumequeue")
    assert len(index.files) == len(reference.files) > 2
    for ours, theirs in zip(index.files, reference.files, strict=True):
        assert ours.path.read_bytes() == theirs.path.read_bytes()
    index.close()
    reference.close()


# --- a tail lost in a crash, and a replica cut back: queues and index follow the log --------


def keyed(log: MemoryCommitLog, tag: str, n: int) -> list[int]:
    """``n`` messages keyed ``<tag>-<i>`` over queues 0 and 1; their offsets."""
    return [
        log.append(
            NewMessage(
                topic="T",
                body=b"%s-%d" % (tag.encode(), i) * 9,
                queue_id=i % 2,
                properties={"KEYS": f"{tag}-{i}"},
            )
        ).physical_offset
        for i in range(n)
    ]


def indexed_service(log: MemoryCommitLog, root: Path) -> ReputService:
    index = IndexService(root, slots=31, max_index=40)  # a few files fill up
    reput = ReputService(
        log, ConsumeQueueStore(root, file_size=200), checkpoint=root / "cp.json", index=index
    )
    reput.recover()
    return reput


def drain(reput: ReputService) -> None:
    for _ in range(1000):
        if not reput.dispatch_available():
            return
    raise AssertionError("the builder never caught up")


def close(reput: ReputService) -> None:
    reput.queues.close()
    assert reput.index is not None
    reput.index.close()


def found(reput: ReputService, key: str) -> list[int]:
    assert reput.index is not None
    return reput.index.query_offsets("T", key, 32, 0, 2**62).phy_offsets


def bodies(reput: ReputService, log: MemoryCommitLog, queue_id: int) -> list[bytes]:
    """What a consumer of queue ``queue_id`` would read, unit by unit."""
    queue = reput.queues.get("T", queue_id)
    assert queue is not None
    out = []
    for at in range(queue.min_offset, queue.max_offset):
        unit = queue.get(at)
        assert unit is not None
        message = next(log.iter_messages(unit.commitlog_offset))
        assert (message.physical_offset, message.total_size) == (unit.commitlog_offset, unit.size)
        assert (message.queue_id, message.queue_offset) == (queue_id, at)
        out.append(message.body)
    return out


def test_units_and_entries_of_a_tail_lost_below_end_of_file_padding_are_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The classic master after a power cut (issue: it stopped delivering anything): its
    queues and index, flushed after the log's tail was lost, point into what END_OF_FILE
    records now pad. Recovery removes exactly those units and entries, building resumes at
    the recovered end, steps over the padding and indexes new messages at the queue offsets
    the log gives them."""
    log = MemoryCommitLog(segment_size=SEGMENT)
    kept = keyed(log, "kept", 12)
    cut = log.max_offset
    keyed(log, "lost", 9)
    end = log.max_offset
    reput = indexed_service(log, tmp_path)
    drain(reput)
    trio.run(reput.flush)  # the checkpoint says everything up to `end` was dispatched
    close(reput)
    log.truncate(cut)  # the power cut took the unflushed tail
    assert log.skip_past(end) > end  # ... and the master closes the log past what it sent

    again = indexed_service(log, tmp_path)
    assert again.reput_from <= cut
    for queue_id in (0, 1):
        queue = again.queues.get("T", queue_id)
        assert queue is not None
        assert queue.max_offset == 6
    assert found(again, "lost-0") == []
    assert found(again, "kept-11") == [kept[11]]
    assert "its last 5 units point at commit log bytes that hold no such message" in caplog.text
    assert "message index: its last 9 entries point at commit log bytes" in caplog.text

    new = keyed(log, "new", 7)
    drain(again)
    assert again.reput_from == log.max_offset
    assert bodies(again, log, 0) == [b"kept-%d" % i * 9 for i in range(0, 12, 2)] + [
        b"new-%d" % i * 9 for i in range(0, 7, 2)
    ]
    assert bodies(again, log, 1) == [b"kept-%d" % i * 9 for i in range(1, 12, 2)] + [
        b"new-%d" % i * 9 for i in range(1, 7, 2)
    ]
    assert [found(again, f"new-{i}") for i in range(7)] == [[offset] for offset in new]
    assert "consume queue building stopped" not in caplog.text


def test_a_clean_restart_removes_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    keyed(log, "k", 30)  # across segments closed by blank records
    reput = indexed_service(log, tmp_path)
    drain(reput)
    trio.run(reput.flush)
    units = [q.max_offset for q in reput.queues]
    close(reput)
    again = indexed_service(log, tmp_path)
    assert [q.max_offset for q in again.queues] == units
    assert found(again, "k-29") != []
    assert "point at commit log bytes" not in caplog.text


def test_a_replica_cut_back_takes_its_index_along(tmp_path: Path) -> None:
    """Epoch mode cuts a slave back while it runs: index entries of the cut messages go, and
    the messages stored at those offsets next are indexed (an index skips offsets below its
    end, so left alone it would never index them)."""
    log = MemoryCommitLog(segment_size=SEGMENT)
    old = keyed(log, "old", 20)
    reput = indexed_service(log, tmp_path)
    drain(reput)
    truncate_replica(log, reput.queues, tmp_path / "cp.json", old[12], reput=reput)
    assert found(reput, "old-12") == []
    assert found(reput, "old-11") == [old[11]]
    new = keyed(log, "new", 8)
    drain(reput)
    assert [found(reput, f"new-{i}") for i in range(8)] == [[offset] for offset in new]
    assert bodies(reput, log, 0)[6:] == [b"new-%d" % i * 9 for i in range(0, 8, 2)]


def test_a_replica_cut_back_offline_takes_its_index_along(tmp_path: Path) -> None:
    log = MemoryCommitLog(segment_size=SEGMENT)
    old = keyed(log, "old", 20)
    reput = indexed_service(log, tmp_path)
    drain(reput)
    trio.run(reput.flush)
    close(reput)
    queues = ConsumeQueueStore(tmp_path, file_size=200)
    queues.load()
    index = IndexService(tmp_path, slots=31, max_index=40)
    index.load(flushed_up_to=None)
    truncate_replica(log, queues, tmp_path / "cp.json", old[5], index=index)
    assert index.query_offsets("T", "old-5", 32, 0, 2**62).phy_offsets == []
    queues.close()
    index.close()
    new = keyed(log, "new", 3)
    again = indexed_service(log, tmp_path)
    drain(again)
    assert [found(again, f"new-{i}") for i in range(3)] == [[offset] for offset in new]
    assert found(again, "old-4") == [old[4]]


async def test_an_index_the_disk_refuses_stops_puts_keeps_its_keys_and_resumes(
    autojump_clock: trio.abc.Clock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = RefusingFallocate()
    monkeypatch.setattr(_index, "os", fake)
    log = MemoryCommitLog(segment_size=SEGMENT)
    disk = DiskGuard({})
    index = IndexService(tmp_path, slots=4096, max_index=100_000)  # one slot page per key
    reput = ReputService(
        log,
        ConsumeQueueStore(tmp_path, file_size=200),
        checkpoint=tmp_path / "cp.json",
        index=index,
        disk=disk,
        retry_interval=1.0,
    )
    reput.recover()
    first = keyed(log, "a", 3)
    grew = trio.Event()

    async def wait_log_grew(beyond: int) -> None:
        while log.max_offset <= beyond:
            await grew.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(reput.run, wait_log_grew)
        await reput.wait_dispatched(log.max_offset)
        fake.full = True
        second = keyed(log, "b", 40)
        grew.set()
        grew = trio.Event()
        await trio.sleep(5)  # several retries, all refused
        assert not disk.statistics().writable
        assert disk.failing(MESSAGE_INDEX)
        assert index.pending > 0
        # The queues were built meanwhile; the index lacks the keys it could not write.
        queue = reput.queues.get("T", 1)
        assert queue is not None and queue.max_offset == 21
        fake.full = False
        await trio.sleep(2)
        assert disk.statistics().writable
        assert not disk.failing(MESSAGE_INDEX)
        nursery.cancel_scope.cancel()
    assert index.pending == 0
    assert [found(reput, f"a-{i}") for i in range(3)] == [[o] for o in first]
    assert [found(reput, f"b-{i}") for i in range(40)] == [[o] for o in second]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "message index cannot be written" in errors[0].getMessage()
    assert "No space left on device" in errors[0].getMessage()
    assert "message index written again" in caplog.text
