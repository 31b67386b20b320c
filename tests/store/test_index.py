"""The message index files, byte for byte as RocketMQ's ``IndexFile`` writes them."""

from __future__ import annotations

import logging
import os
import random
import stat
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from tests.broker._diskfaults import RefusingFallocate
from trioha.store._consumequeue import java_string_hash
from trioha.store._index import (
    _ENTRY,
    ENTRY_SIZE,
    HEADER_SIZE,
    SLOT_SIZE,
    IndexedMessage,
    IndexFile,
    IndexService,
    QueryOffsetResult,
    file_name_for,
    index_key_hash,
)


def test_hash_and_slot_vectors() -> None:
    assert java_string_hash("TopicA#OrderID-1001") == -1555851595
    assert index_key_hash("TopicA#OrderID-1001") == 1555851595
    assert index_key_hash("TopicA#OrderID-1001") % 5_000_000 == 851595
    assert java_string_hash("TopicTest#7F0000010BB818B4AAC2583E68D10000") == 594819206
    assert index_key_hash("TopicTest#7F0000010BB818B4AAC2583E68D10000") % 5_000_000 == 4819206
    # abs(Integer.MIN_VALUE) is negative in Java: RocketMQ indexes it as 0.
    assert index_key_hash("polygenelubricants") == 0


def test_whole_file_vector(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    for key, offset, stamp in (
        ("TopicA#k1", 1000, 1700000000000),
        ("TopicA#k2", 1200, 1700000001500),
        ("TopicA#k1", 1400, 1700000003999),
    ):
        assert index_file.put_key(key, offset, stamp)
    index_file.flush()
    data = (tmp_path / "f").read_bytes()
    assert len(data) == 268
    expected = bytes.fromhex(
        "0000018bcfe56800 0000018bcfe5779f 00000000000003e8 0000000000000578 00000002 00000004"
        "00000000 00000002 00000003 00000000 00000000 00000000 00000000"
        "00000000 0000000000000000 00000000 00000000"  # entry 0 is never used
        "717125c9 00000000000003e8 00000000 00000000"
        "717125c8 00000000000004b0 00000001 00000000"
        "717125c9 0000000000000578 00000003 00000001".replace(" ", "")
    )
    assert data[: len(expected)] == expected
    assert data[len(expected) :] == bytes(len(data) - len(expected))
    found: list[int] = []
    index_file.select_phy_offsets("TopicA#k1", 64, 0, 2**62, found)
    assert found == [1400, 1000]
    # A time range that starts after the first entry stops the walk there.
    later: list[int] = []
    index_file.select_phy_offsets("TopicA#k1", 64, 1700000003000, 2**62, later)
    assert later == [1400]
    index_file.close()
    # Reloaded from disk, the header is the same.
    again = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert (again.index_count, again.hash_slot_count, again.end_phy_offset) == (4, 2, 1400)


def test_default_file_is_rocketmqs_size_and_sparse(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "f", slots=5_000_000, max_index=20_000_000)
    assert index_file.put_key("TopicA#OrderID-1001", 77, 1700000000000)
    index_file.flush()
    stat = (tmp_path / "f").stat()
    assert stat.st_size == 420_000_040
    assert stat.st_blocks * 512 < 1 << 20  # only the touched pages exist
    with open(tmp_path / "f", "rb") as handle:
        handle.seek(3_406_420)
        assert int.from_bytes(handle.read(4), "big") == 1
        handle.seek(20_000_060)
        assert handle.read(20)[4:12] == (77).to_bytes(8, "big")
    index_file.close()


def _message(offset: int, stamp: int, *, keys: str | None, uniq: str | None = None) -> Any:
    return IndexedMessage("T", offset, stamp, uniq, keys)


def test_service_rolls_over_queries_newest_first_and_recovers(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=4)  # 3 entries per file
    base = 1_700_000_000_000
    for n in range(7):
        service.build(_message(100 * n, base + 1000 * n, keys=f"k{n % 2} other"), base)
    # 14 keys, 3 per file: 5 files; each new file starts where the previous one ended.
    assert len(service.files) == 5
    first, second = service.files[0], service.files[1]
    assert (second.begin_phy_offset, second.begin_timestamp) != (0, 0)
    assert first.end_phy_offset == 100
    result = service.query_offsets("T", "k0", 64, 0, 2**62)
    assert sorted(result.phy_offsets) == [0, 200, 400, 600]
    assert result.index_last_update_phy_offset == 600
    assert service.query_offsets("T", "k1", 2, 0, 2**62).phy_offsets == [500, 300]
    assert service.query_offsets("U", "k1", 64, 0, 2**62).phy_offsets == []
    # Indexing the same records again (a restart's re-dispatch) adds nothing.
    for n in range(7):
        service.build(_message(100 * n, base + 1000 * n, keys=f"k{n % 2} other"), base)
    assert len(service.files) == 5
    assert sorted(service.query_offsets("T", "other", 64, 0, 2**62).phy_offsets) == [
        0,
        100,
        200,
        300,
        400,
        500,
        600,
    ]
    service.flush()
    service.close()
    reloaded = IndexService(tmp_path, slots=11, max_index=4)
    reloaded.load(flushed_up_to=700)
    assert sorted(reloaded.query_offsets("T", "k0", 64, 0, 2**62).phy_offsets) == [
        0,
        200,
        400,
        600,
    ]
    # Files whose end is past the last flush may be torn: dropped at load.
    reloaded.close()
    torn = IndexService(tmp_path, slots=11, max_index=4)
    torn.load(flushed_up_to=450)
    assert torn.end_phy_offset == 400
    assert torn.delete_expired(250) == 2  # wholly below the commit log's start
    assert torn.files[0].end_phy_offset >= 250
    torn.close()


def test_unique_key_first_then_keys(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=100)
    service.build(_message(0, 1_700_000_000_000, keys=" a  b ", uniq="U1"), 0)
    (only,) = service.files
    assert only.index_count == 4  # the unique key, then "a" and "b"; empty tokens skipped
    assert service.query_offsets("T", "U1", 32, 0, 2**62).phy_offsets == [0]
    assert file_name_for(0).isdigit() and len(file_name_for(0)) == 17
    service.close()


def test_key_hash_from_raw_bytes_matches_the_string_hash(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=10)
    rng = random.Random(7)
    alphabet = "abcXYZ09#-_ é✓"
    for _ in range(2000):
        topic = "".join(rng.choice("TopicAB_%") for _ in range(rng.randint(1, 12)))
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert service._key_hash(topic, key.encode()) == index_key_hash(f"{topic}#{key}")
    assert service._key_hash("TopicA", b"OrderID-1001") == 1555851595


def test_index_sizes_must_be_positive(tmp_path: Path) -> None:
    for slots, entries in ((0, 10), (7, 1), (-1, 10)):
        with pytest.raises(ValueError, match=f"{slots} slots, {entries} entries"):
            IndexFile(tmp_path / "f", slots=slots, max_index=entries)


def test_a_full_index_file_refuses_a_key_and_changes_nothing(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=3)  # entry 0 is never used
    assert index_file.put_key("T#a", 100, 1_700_000_000_000)
    assert index_file.put_key("T#b", 200, 1_700_000_001_000)
    assert index_file.is_full
    before = (tmp_path / "f").read_bytes()
    assert not index_file.put_key("T#c", 300, 1_700_000_002_000)
    index_file.flush()
    assert (tmp_path / "f").read_bytes() == before
    index_file.close()
    index_file.close()  # a second close is harmless


def _corrupt_entry(index_file: IndexFile, entry: int, **fields: int) -> None:
    at = HEADER_SIZE + SLOT_SIZE * index_file.slots + ENTRY_SIZE * entry
    key_hash, offset, time_diff, previous = _ENTRY.unpack_from(index_file._map, at)
    values = {"key_hash": key_hash, "offset": offset, "time_diff": time_diff, "previous": previous}
    values.update(fields)
    _ENTRY.pack_into(index_file._map, at, *values.values())


def _chain(tmp_path: Path) -> IndexFile:
    """Three entries for one key: the chain is 3 -> 2 -> 1."""
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    for n in range(3):
        assert index_file.put_key("T#k", 100 * (n + 1), 1_700_000_000_000 + 1000 * n)
    return index_file


def test_a_chain_is_walked_newest_first_up_to_max_num(tmp_path: Path) -> None:
    index_file = _chain(tmp_path)
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 2, 0, 2**62, found)
    assert found == [300, 200]
    index_file.close()


@pytest.mark.parametrize(
    ("entry", "damage", "expected"),
    [
        (2, {"time_diff": -1}, [300]),  # a negative time difference ends the walk
        (2, {"previous": 2}, [300, 200]),  # a link to itself ends it
        (2, {"previous": 99}, [300, 200]),  # a link past the entries ends it
        (2, {"previous": 3}, [300, 200, 300, 200]),  # a cycle: at most index_count (4) links
    ],
)
def test_a_damaged_chain_never_loops_or_reads_outside_the_file(
    tmp_path: Path, entry: int, damage: dict[str, int], expected: list[int]
) -> None:
    index_file = _chain(tmp_path)
    _corrupt_entry(index_file, entry, **damage)
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 64, 0, 2**62, found)
    assert found == expected
    index_file.close()


def test_the_service_ignores_files_that_are_not_index_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "notes.txt").write_text("hello")
    service = IndexService(tmp_path, slots=11, max_index=4)
    service.load(flushed_up_to=None)
    assert service.files == []
    assert "notes.txt: not an index file name" in caplog.text
    service.close()


def test_keys_that_are_not_ascii_are_indexed_by_their_java_string_hash(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=10)
    base = 1_700_000_000_000
    service.build_all(
        [_message(0, base, keys="订单-1"), _message(100, base + 1, keys="plain")], base
    )
    (only,) = service.files
    found: list[int] = []
    only.select_phy_offsets("T#订单-1", 8, 0, 2**62, found)
    assert found == [0]
    assert service.query_offsets("T", "订单-1", 8, 0, 2**62).phy_offsets == [0]
    assert service.query_offsets("T", "plain", 8, 0, 2**62).phy_offsets == [100]
    # A time range no file covers finds nothing.
    assert service.query_offsets("T", "plain", 8, 0, base - 10).phy_offsets == []
    service.close()


def test_a_chain_walk_stops_at_the_first_entry_older_than_the_range(tmp_path: Path) -> None:
    index_file = _chain(tmp_path)  # stamps t0, t0 + 1 s, t0 + 2 s for offsets 100, 200, 300
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 64, 1_700_000_002_000, 2**62, found)
    assert found == [300]
    found.clear()
    index_file.select_phy_offsets("T#k", 64, 1_700_000_001_000, 1_700_000_001_000, found)
    assert found == [200]
    index_file.close()


def test_a_batch_writes_the_bytes_of_one_build_raw_per_message(tmp_path: Path) -> None:
    rng = random.Random(11)
    messages: list[tuple[str, int, int, bytes | None, bytes | None]] = []
    offset, stamp = 0, 1_700_000_000_000
    for _ in range(300):
        topic = rng.choice(("TopicA", "B", "主题"))
        uniq = rng.choice((None, b"", b"7F0000010BB818B4AAC2583E68D1%04X" % offset))
        keys = rng.choice((None, b"", b"k1", b"k1 k2", b"  a  b ", "é✓".encode()))
        messages.append((topic, offset, stamp, uniq, keys))
        offset += rng.randint(100, 2000)
        # Earlier than the file's first entry, or further than 2**31 s after it: clamped.
        stamp += rng.choice((rng.randint(-3000, 3000), -(10**6), 2**32 * 1000))
    built = IndexService(tmp_path / "a", slots=13, max_index=40)
    expected = IndexService(tmp_path / "b", slots=13, max_index=40)
    for service in (built, expected):
        service.load(flushed_up_to=None)
    for start in range(0, len(messages), 37):
        built.build_batch(messages[start : start + 37], now_ms=0)
    built.build_batch(messages[:50], now_ms=0)  # indexed before: skipped, as build_raw skips
    for message in messages + messages[:50]:
        expected.build_raw(*message, now_ms=0)
    assert len(built.files) == len(expected.files) > 5  # files filled up mid-batch
    for ours, theirs in zip(built.files, expected.files, strict=True):
        assert ours.path.read_bytes() == theirs.path.read_bytes()
    built.close()
    expected.close()


def test_put_hashes_clamps_the_time_difference_as_put_hash_does(tmp_path: Path) -> None:
    begin = 1_700_000_000_000
    stamps = [begin, begin - 1, begin - 999, begin - 1000, begin - 1001, begin + 999, begin + 1000]
    stamps += [begin + (2**31 - 1) * 1000, begin + 2**31 * 1000, begin + 2**40]
    entries = [(7 * i % 5, 100 * i, stamp) for i, stamp in enumerate(stamps)]
    one_by_one = IndexFile(tmp_path / "a", slots=5, max_index=len(entries) + 1)
    for entry in entries:
        assert one_by_one.put_hash(*entry)
    batched = IndexFile(tmp_path / "b", slots=5, max_index=len(entries) + 1)
    assert batched.put_hashes(entries, 0) == len(entries)
    assert batched.put_hashes(entries, 0) == 0  # full
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    one_by_one.close()
    batched.close()


# --- time ranges, chains and the header's bounds (IndexFile.isTimeMatched, selectPhyOffset) --

T0 = 1_700_000_000_000


def test_a_time_range_matches_a_file_as_rocketmqs_is_time_matched(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#a", 100, T0)
    assert index_file.put_key("T#a", 200, T0 + 10_000)
    begin, end = T0, T0 + 10_000
    cases = {
        (begin - 2000, begin - 1000): False,  # wholly before
        (end + 1, end + 1000): False,  # wholly after
        (begin - 1000, end + 1000): True,  # around the file
        (begin, end + 1000): True,  # starting at its first entry
        (end, end + 1000): True,  # starting at its last entry
        (begin - 1000, begin): True,  # ending at its first entry
        (begin - 1000, end): True,  # ending at its last entry
        (begin + 1, end - 1): True,  # inside
    }
    for (lo, hi), matched in cases.items():
        assert index_file.is_time_matched(lo, hi) is matched, (lo, hi)
    index_file.close()


def test_a_query_starting_or_ending_at_a_files_edges_finds_its_entries(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=10)
    service.build_all([_message(100, T0, keys="a"), _message(200, T0 + 10_000, keys="a")], T0)
    assert service.query_offsets("T", "a", 8, T0, T0 + 20_000).phy_offsets == [200, 100]
    assert service.query_offsets("T", "a", 8, T0 + 10_000, T0 + 20_000).phy_offsets == [200]
    assert service.query_offsets("T", "a", 8, T0 - 1000, T0).phy_offsets == [100]
    assert service.query_offsets("T", "a", 8, T0 - 1000, T0 + 10_000).phy_offsets == [200, 100]
    service.close()


def test_a_file_with_one_entry_answers_a_lookup(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#k", 4242, T0)
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 8, 0, 2**62, found)
    assert found == [4242]
    index_file.close()


def _rewind_header(path: Path, count: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(36)
        handle.write(count.to_bytes(4, "big"))


def test_a_header_counting_no_entries_answers_no_lookup_whatever_the_slots_say(
    tmp_path: Path,
) -> None:
    # IndexHeader.load reads an indexCount <= 0 as 1 (no entries); selectPhyOffset then
    # returns nothing, even though the slot and the entry were written before a crash.
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#k", 4242, T0)
    index_file.flush()
    index_file.close()
    _rewind_header(tmp_path / "f", 0)  # indexCount
    again = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert again.index_count == 1
    found: list[int] = []
    again.select_phy_offsets("T#k", 8, 0, 2**62, found)
    assert found == []
    again.close()


def test_an_entry_written_before_its_header_is_still_found(tmp_path: Path) -> None:
    # putKey writes the entry, then the slot, then the header. After a crash between the last
    # two, the slot points at the entry numbered indexCount: RocketMQ's bound (> indexCount)
    # still follows it.
    index_file = _chain(tmp_path)  # entries 1..3, indexCount 4
    assert index_file.put_key("T#k", 400, T0 + 3000)
    index_file.flush()
    index_file.close()
    _rewind_header(tmp_path / "f", 4)  # the header of before the last put
    again = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert again.index_count == 4
    found: list[int] = []
    again.select_phy_offsets("T#k", 64, 0, 2**62, found)
    assert found == [400, 300, 200, 100]
    again.close()


def test_a_link_to_the_entry_numbered_index_count_is_followed(tmp_path: Path) -> None:
    index_file = _chain(tmp_path)  # entries 1..3 for T#k, indexCount 4
    _corrupt_entry(index_file, 4, key_hash=index_key_hash("T#k"), offset=999)
    _corrupt_entry(index_file, 2, previous=4)
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 64, 0, 2**62, found)
    assert found == [300, 200, 999]
    index_file.close()


def test_a_key_hashing_to_zero_never_reads_the_unused_entry_0(tmp_path: Path) -> None:
    # Entry 0 is all zeros: key hash 0, offset 0. A key whose hash is 0 must neither find
    # it through an empty slot nor through the end of its own chain.
    assert index_key_hash("polygenelubricants") == 0
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#a", 100, T0)  # slot 6: slot 0 stays empty
    found: list[int] = []
    index_file.select_phy_offsets("polygenelubricants", 8, 0, 2**62, found)
    assert found == []
    assert index_file.put_key("polygenelubricants", 500, T0 + 1000)
    index_file.select_phy_offsets("polygenelubricants", 8, 0, 2**62, found)
    assert found == [500]
    index_file.close()


def test_entries_stored_in_the_first_second_of_a_range_are_all_found(tmp_path: Path) -> None:
    # Times are stored in whole seconds after the file's first entry: both entries read back
    # as T0, and a range starting at T0 includes both.
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#k", 100, T0)
    assert index_file.put_key("T#k", 200, T0 + 500)
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 8, T0, 2**62, found)
    assert found == [200, 100]
    index_file.close()


# --- the service: expiry, flushing, re-dispatch, queries ------------------------------------


def _single_keyed(service: IndexService, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        service.build(_message(100 * n, T0 + 1000 * n, keys=f"k{n}"), T0 + n)


def test_expired_files_go_but_never_the_last_nor_one_holding_the_oldest_message(
    tmp_path: Path,
) -> None:
    service = IndexService(tmp_path, slots=11, max_index=3)  # 2 entries per file
    _single_keyed(service, 6)  # files end at 100, 300, 500
    assert [f.end_phy_offset for f in service.files] == [100, 300, 500]
    # A file whose last entry is the commit log's first message still serves it.
    assert service.delete_expired(100) == 0
    assert service.delete_expired(101) == 1
    assert service.delete_expired(10_000) == 1  # never the newest file
    assert [f.end_phy_offset for f in service.files] == [500]
    assert service.query_offsets("T", "k5", 8, 0, 2**62).phy_offsets == [500]
    service.close()


def test_expiring_a_file_already_removed_from_disk_is_harmless(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=3)
    _single_keyed(service, 4)
    first = service.files[0].path
    first.unlink()  # an operator cleaned up by hand
    assert service.delete_expired(250) == 1
    assert len(service.files) == 1
    service.close()


def test_flush_syncs_only_the_two_newest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Older files were synced when the next one was created; the newest two may hold entries
    # written since (the one that just filled up, the one being written).
    service = IndexService(tmp_path, slots=11, max_index=3)
    _single_keyed(service, 2)
    synced: list[str] = []
    monkeypatch.setattr(IndexFile, "flush", lambda self: synced.append(self.path.name))
    service.flush()
    assert synced == [service.files[0].path.name]
    _single_keyed(service, 4, start=2)
    synced.clear()
    service.flush()
    assert synced == [f.path.name for f in service.files[-2:]]
    assert len(service.files) == 3
    service.close()


Raw = tuple[str, int, int, bytes | None, bytes | None]


def _index(service: IndexService, messages: list[Raw], *, batched: bool) -> None:
    """The dispatcher's way (one batch) or one ``build_raw`` per message: the same result."""
    if batched:
        service.build_batch(messages, now_ms=T0)
    else:
        for message in messages:
            service.build_raw(*message, now_ms=T0)


@pytest.mark.parametrize("batched", [True, False])
def test_a_redispatch_after_a_restart_indexes_only_what_the_index_lacks(
    tmp_path: Path, batched: bool
) -> None:
    # The reput service restarts from its checkpoint, at or before the index's end: build_batch
    # skips what the newest file already holds (the message at its end included) and indexes
    # what follows, whichever file it lands in.
    messages: list[Raw] = [("T", 100 * n, T0 + 1000 * n, None, b"k%d" % n) for n in range(8)]
    expected = IndexService(tmp_path / "once", slots=11, max_index=4)  # 3 entries per file
    _index(expected, messages, batched=batched)
    assert [f.index_count for f in expected.files] == [4, 4, 3]
    service = IndexService(tmp_path / "again", slots=11, max_index=4)
    _index(service, messages[:7], batched=batched)  # the newest file holds one entry
    assert [f.index_count for f in service.files] == [4, 4, 2]
    service.close()
    restarted = IndexService(tmp_path / "again", slots=11, max_index=4)
    restarted.load(flushed_up_to=None)
    _index(restarted, messages[6:7], batched=batched)  # only the message at the end: nothing
    assert [f.index_count for f in restarted.files] == [4, 4, 2]
    _index(restarted, messages, batched=batched)  # everything again, and one new message
    assert [f.path.read_bytes() for f in restarted.files] == [
        f.path.read_bytes() for f in expected.files
    ]
    restarted.close()
    expected.close()


@pytest.mark.parametrize("batched", [True, False])
def test_an_empty_first_file_left_by_a_crash_takes_the_message_at_offset_0(
    tmp_path: Path, batched: bool
) -> None:
    # The newest file is created before its first entry is put; a crash in between leaves it
    # empty, ending at 0. The message at offset 0 is not in it and must be indexed.
    (tmp_path / "index").mkdir()
    IndexFile(tmp_path / "index" / file_name_for(T0), slots=11, max_index=10).close()
    service = IndexService(tmp_path, slots=11, max_index=10)
    service.load(flushed_up_to=None)
    _index(service, [("T", 0, T0, None, b"first")], batched=batched)
    assert service.query_offsets("T", "first", 8, 0, 2**62).phy_offsets == [0]
    service.close()


@pytest.mark.parametrize("batched", [True, False])
def test_keys_are_split_on_single_spaces_only(tmp_path: Path, batched: bool) -> None:
    # buildIndex splits KEYS with String.split(" "): a tab or a newline is part of a key.
    service = IndexService(tmp_path, slots=11, max_index=10)
    _index(service, [("T", 0, T0, None, b"a\tb c\nd")], batched=batched)
    assert service.files[0].index_count == 3
    for key, found in (("a\tb", [0]), ("c\nd", [0]), ("a", []), ("b", []), ("d", [])):
        assert service.query_offsets("T", key, 8, 0, 2**62).phy_offsets == found, key
    service.close()


def test_a_key_longer_than_the_hash_cache_is_indexed(tmp_path: Path) -> None:
    key = "x" * 2000  # the weights of keys over 1024 bytes are computed on each use
    service = IndexService(tmp_path, slots=11, max_index=10)
    service.build_batch([("T", 0, T0, None, key.encode())], now_ms=T0)
    assert service.query_offsets("T", key, 8, 0, 2**62).phy_offsets == [0]
    service.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_key_whose_hash_is_integer_min_value_is_indexed_as_hash_0(
    tmp_path: Path, batched: bool
) -> None:
    # abs(Integer.MIN_VALUE) is negative in Java; indexKeyHashMethod stores it as 0.
    topic, key = "TopicA", "key-uwj-8))4"
    assert java_string_hash(f"{topic}#{key}") == -(2**31)
    service = IndexService(tmp_path, slots=11, max_index=10)
    _index(service, [(topic, 300, T0, None, key.encode())], batched=batched)
    index_file = service.files[0]
    assert _ENTRY.unpack_from(index_file._map, HEADER_SIZE + SLOT_SIZE * 11 + ENTRY_SIZE) == (
        0,
        300,
        0,
        0,
    )
    assert service.query_offsets(topic, key, 8, 0, 2**62).phy_offsets == [300]
    service.close()


def test_a_message_with_a_unique_key_and_no_keys_is_indexed_once(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=10)
    service.build(_message(700, T0, keys=None, uniq="U7"), T0)
    assert service.files[0].index_count == 2
    assert service.query_offsets("T", "U7", 8, 0, 2**62).phy_offsets == [700]
    service.close()


def test_a_query_reports_where_the_newest_file_ends(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=3)
    assert service.query_offsets("T", "k0", 8, 0, 2**62) == QueryOffsetResult([], 0, 0)
    _single_keyed(service, 3)
    assert service.query_offsets("T", "k0", 8, 0, 2**62) == QueryOffsetResult([0], T0 + 2000, 200)
    service.close()


def test_a_message_stored_in_the_same_millisecond_as_the_next_file_begins_is_found(
    tmp_path: Path,
) -> None:
    # The walk over files stops at one that begins before the range; a file beginning
    # exactly at the range's start may have an older neighbour holding the same millisecond.
    service = IndexService(tmp_path, slots=11, max_index=3)
    service.build_batch(
        [("T", 0, T0 - 5000, None, b"x"), ("T", 100, T0, None, b"k"), ("T", 200, T0, None, b"k")],
        now_ms=0,
    )
    assert [f.begin_timestamp for f in service.files] == [T0 - 5000, T0]
    assert service.query_offsets("T", "k", 8, T0, 2**62).phy_offsets == [200, 100]
    service.close()


def test_the_file_walk_stops_at_a_file_beginning_before_the_range_like_rocketmq(
    tmp_path: Path,
) -> None:
    # IndexService.queryOffset: files are visited newest first and the walk ends at the first
    # one that begins before the range. After the store clock stepped back, an older file can
    # hold later times than a newer one: RocketMQ does not look there, and neither does trioha.
    service = IndexService(tmp_path, slots=11, max_index=3)
    service.build_batch(
        [
            ("T", 0, T0 + 60_000, None, b"k"),
            ("T", 100, T0 + 60_000, None, b"x"),
            ("T", 200, T0, None, b"k"),
        ],
        now_ms=0,
    )
    assert [f.begin_timestamp for f in service.files] == [T0 + 60_000, T0]
    assert service.query_offsets("T", "k", 8, T0 + 30_000, 2**62).phy_offsets == []
    assert service.query_offsets("T", "k", 8, T0, 2**62).phy_offsets == [200, 0]
    service.close()


# --- files: names, modes, headers, mappings ----------------------------------------------


def test_file_names_are_the_local_creation_time_to_the_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert file_name_for(1_700_000_000_123) == "20231114221320123"
        assert file_name_for(1_700_000_000_999) == "20231114221320999"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_files_created_in_the_same_millisecond_take_the_next_free_names(
    tmp_path: Path,
) -> None:
    service = IndexService(tmp_path, slots=11, max_index=2)  # one entry per file
    service.build_batch([("T", 100 * n, T0, None, b"k") for n in range(3)], now_ms=T0)
    assert [f.path.name for f in service.files] == [file_name_for(T0 + n) for n in range(3)]
    service.close()


def test_building_before_load_creates_the_index_directory(tmp_path: Path) -> None:
    service = IndexService(tmp_path / "store" / "new", slots=11, max_index=10)
    service.build_batch([("T", 0, T0, None, b"k")], now_ms=T0)
    assert (tmp_path / "store" / "new" / "index" / file_name_for(T0)).is_file()
    service.close()


def test_index_files_are_created_readable_by_all_writable_by_the_owner(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        IndexFile(tmp_path / "f", slots=7, max_index=10).close()
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o644


@pytest.mark.parametrize(("end_phy", "end_ts"), [(0, 0), (1, 1), (4096, T0)])
def test_a_new_file_continues_where_the_previous_one_ended(
    tmp_path: Path, end_phy: int, end_ts: int
) -> None:
    # IndexFile's constructor: the header of an empty file already holds the previous end.
    index_file = IndexFile(
        tmp_path / "f", slots=7, max_index=10, end_phy_offset=end_phy, end_timestamp=end_ts
    )
    index_file.flush()
    header = (tmp_path / "f").read_bytes()[:HEADER_SIZE]
    assert header == struct.pack(">qqqqii", end_ts, end_ts, end_phy, end_phy, 0, 1)
    index_file.close()
    # An existing file keeps its own header, whatever the caller passes.
    again = IndexFile(tmp_path / "f", slots=7, max_index=10, end_phy_offset=9, end_timestamp=9)
    again.close()
    assert (tmp_path / "f").read_bytes()[:HEADER_SIZE] == header


def test_a_file_without_an_end_starts_with_an_empty_header(tmp_path: Path) -> None:
    IndexFile(tmp_path / "f", slots=7, max_index=10).close()
    assert (tmp_path / "f").read_bytes()[:HEADER_SIZE] == bytes(36) + b"\0\0\0\1"


def test_a_reloaded_file_reads_every_header_field(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#a", 300, T0)
    assert index_file.put_key("T#b", 700, T0 + 4000)
    index_file.close()
    again = IndexFile(tmp_path / "f", slots=7, max_index=10)
    header = (again.begin_timestamp, again.end_timestamp, again.begin_phy_offset)
    assert (*header, again.end_phy_offset, again.hash_slot_count, again.index_count) == (
        T0,
        T0 + 4000,
        300,
        700,
        2,
        3,
    )
    again.close()


@pytest.mark.parametrize(("slots", "entries"), [(1, 10), (7, 2)])
def test_the_smallest_index_files_work(tmp_path: Path, slots: int, entries: int) -> None:
    index_file = IndexFile(tmp_path / "f", slots=slots, max_index=entries)
    assert index_file.put_key("T#k", 100, T0)
    found: list[int] = []
    index_file.select_phy_offsets("T#k", 8, 0, 2**62, found)
    assert found == [100]
    index_file.close()


def test_closing_the_service_unmaps_its_files(tmp_path: Path) -> None:
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps")
    service = IndexService(tmp_path, slots=11, max_index=3)
    _single_keyed(service, 3)
    files = list(service.files)  # a reader may still hold a file: closing unmaps it anyway
    paths = [str(f.path) for f in files]
    assert all(p in maps.read_text() for p in paths)
    service.close()
    assert not any(p in maps.read_text() for p in paths)
    files[0].close()  # a second close is harmless


def test_the_first_entry_of_a_file_is_timed_from_the_previous_files_end(tmp_path: Path) -> None:
    # The next file starts at the previous one's end time (IndexFile's constructor), so its
    # first entry's timeDiff counts from there; the first file's first entry has timeDiff 0.
    service = IndexService(tmp_path, slots=11, max_index=2)  # one entry per file
    service.build_batch(
        [("T", 0, T0 + 999, None, b"a"), ("T", 100, T0 + 5000, None, b"b")], now_ms=0
    )
    first, second = (f.path.read_bytes() for f in service.files)
    entry_1 = HEADER_SIZE + SLOT_SIZE * 11 + ENTRY_SIZE
    assert _ENTRY.unpack_from(first, entry_1)[1:3] == (0, 0)
    assert _ENTRY.unpack_from(second, entry_1)[1:3] == (100, 4)
    service.close()


def test_a_file_begun_at_timestamp_1_times_its_entries_from_it(tmp_path: Path) -> None:
    index_file = IndexFile(tmp_path / "a", slots=7, max_index=10, end_timestamp=1)
    assert index_file.put_hash(5, 100, 2001)
    batched = IndexFile(tmp_path / "b", slots=7, max_index=10, end_timestamp=1)
    assert batched.put_hashes([(5, 100, 2001)], 0) == 1
    entry_1 = HEADER_SIZE + SLOT_SIZE * 7 + ENTRY_SIZE
    for f in (index_file, batched):
        assert _ENTRY.unpack_from(f._map, entry_1) == (5, 100, 2, 0)
        f.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_crash_right_after_creating_the_next_file_leaves_it_continuing_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    service = IndexService(tmp_path, slots=11, max_index=2)  # one entry per file
    _index(service, [("T", 100, T0 + 5000, None, b"a")], batched=batched)

    def crash(*args: object) -> object:
        raise SystemExit("crash")

    monkeypatch.setattr(IndexFile, "put_hashes", crash)
    monkeypatch.setattr(IndexFile, "put_hash", crash)
    with pytest.raises(SystemExit):
        _index(service, [("T", 200, T0 + 9000, None, b"b")], batched=batched)
    monkeypatch.undo()
    _, second = service.files
    assert (second.begin_phy_offset, second.end_phy_offset) == (100, 100)
    assert (second.begin_timestamp, second.end_timestamp) == (T0 + 5000, T0 + 5000)
    service.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_crash_before_the_first_entry_leaves_an_empty_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batched: bool
) -> None:
    def crash(*args: object) -> object:
        raise SystemExit("crash")

    monkeypatch.setattr(IndexFile, "put_hashes", crash)
    monkeypatch.setattr(IndexFile, "put_hash", crash)
    service = IndexService(tmp_path, slots=11, max_index=10)
    with pytest.raises(SystemExit):
        _index(service, [("T", 0, T0, None, b"a")], batched=batched)
    monkeypatch.undo()
    (only,) = service.files
    assert only.path.read_bytes()[:HEADER_SIZE] == bytes(36) + b"\0\0\0\1"
    service.close()


# --- a header older than its slots (a lost write) -----------------------------------------


def _put_after_rewinding_the_header(tmp_path: Path, count: int, *, batched: bool) -> IndexFile:
    """Two entries for T#k, the header's indexCount set back to *count*, then a third put."""
    index_file = IndexFile(tmp_path / "f", slots=7, max_index=10)
    assert index_file.put_key("T#k", 100, T0)
    assert index_file.put_key("T#k", 200, T0)
    index_file.close()
    _rewind_header(tmp_path / "f", count)
    again = IndexFile(tmp_path / "f", slots=7, max_index=10)
    key_hash = index_key_hash("T#k")
    if batched:
        assert again.put_hashes([(key_hash, 300, T0)], 0) == 1
    else:
        assert again.put_hash(key_hash, 300, T0)
    return again


@pytest.mark.parametrize("batched", [True, False])
def test_a_slot_at_the_headers_count_is_linked_as_rocketmq_links_it(
    tmp_path: Path, batched: bool
) -> None:
    # putKey keeps a slot value up to indexCount: after the header lost the last put, the
    # entry that put is overwritten and links to its own number, as RocketMQ writes it.
    again = _put_after_rewinding_the_header(tmp_path, 2, batched=batched)
    entry_2 = HEADER_SIZE + SLOT_SIZE * 7 + 2 * ENTRY_SIZE
    assert _ENTRY.unpack_from(again._map, entry_2) == (index_key_hash("T#k"), 300, 0, 2)
    assert again.hash_slot_count == 1
    again.close()


@pytest.mark.parametrize("batched", [True, False])
def test_a_slot_past_the_headers_count_is_treated_as_empty(tmp_path: Path, batched: bool) -> None:
    again = _put_after_rewinding_the_header(tmp_path, 1, batched=batched)  # the slot says 2
    entry_1 = HEADER_SIZE + SLOT_SIZE * 7 + ENTRY_SIZE
    assert _ENTRY.unpack_from(again._map, entry_1) == (index_key_hash("T#k"), 300, 0, 0)
    assert again.hash_slot_count == 2  # the header's 1 (kept) plus the slot counted again
    found: list[int] = []
    again.select_phy_offsets("T#k", 8, 0, 2**62, found)
    assert found == [300]
    again.close()


# --- hashes ------------------------------------------------------------------------------


def test_a_hash_of_minus_integer_max_value_is_kept() -> None:
    assert java_string_hash("T#key-biyk2<=>") == -(2**31 - 1)
    assert index_key_hash("T#key-biyk2<=>") == 2**31 - 1


@pytest.mark.parametrize("batched", [True, False])
def test_a_key_that_is_not_utf8_is_indexed_as_java_decodes_it(
    tmp_path: Path, batched: bool
) -> None:
    # new String(bytes, UTF_8) replaces malformed input with U+FFFD.
    service = IndexService(tmp_path, slots=11, max_index=10)
    _index(service, [("T", 0, T0, None, b"k\xff\xfe")], batched=batched)
    assert service.query_offsets("T", "k\ufffd\ufffd", 8, 0, 2**62).phy_offsets == [0]
    service.close()


# --- loading ------------------------------------------------------------------------------


def test_load_logs_what_it_ignores_drops_and_keeps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    service = IndexService(tmp_path, slots=11, max_index=3)  # 2 entries per file
    _single_keyed(service, 6)  # files end at 100, 300, 500
    paths = [f.path for f in service.files]
    service.close()
    (tmp_path / "index" / "000.tmp").write_text("not an index file")  # sorts first
    caplog.set_level(logging.INFO, logger="trioha.store.index")
    reloaded = IndexService(tmp_path, slots=11, max_index=3)
    reloaded.load(flushed_up_to=300)  # a file ending exactly at the flush is kept
    assert [f.path for f in reloaded.files] == paths[:2]
    assert [p.exists() for p in paths] == [True, True, False]
    directory = tmp_path / "index"
    assert caplog.messages == [
        f"ignoring {directory / '000.tmp'}: not an index file name",
        f"dropping index file {paths[2]}: it ends at 500, past the last flush (300)",
        f"message index: 2 file(s) in {directory}",
    ]
    reloaded.close()


def test_load_drops_every_file_past_the_flush(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=3)
    _single_keyed(service, 6)  # files end at 100, 300, 500
    paths = [f.path for f in service.files]
    service.close()
    reloaded = IndexService(tmp_path, slots=11, max_index=3)
    reloaded.load(flushed_up_to=150)
    assert [f.path for f in reloaded.files] == paths[:1]
    assert [p.exists() for p in paths] == [True, False, False]
    reloaded.close()


# --- removing entries of messages the commit log no longer holds ---------------------------


def _put(index_file: IndexFile, n: int, *, base: int = 1_700_000_000_000) -> None:
    # Few slots: chains of colliding keys, whose links the cut must give back.
    for i in range(n):
        assert index_file.put_key(f"T#k{i % 5}", 100 * (i + 1), base + 1000 * i)


@pytest.mark.parametrize("keep", [1, 2, 5, 9])
def test_cutting_entries_leaves_the_bytes_of_a_file_that_never_had_them(
    tmp_path: Path, keep: int
) -> None:
    cut = IndexFile(tmp_path / "cut", slots=3, max_index=12)
    _put(cut, 10)
    never = IndexFile(tmp_path / "never", slots=3, max_index=12)
    _put(never, keep)
    assert cut.cut_to(keep + 1) == 10 - keep
    assert cut.cut_to(keep + 1) == 0
    cut.close()
    never.close()
    assert (tmp_path / "cut").read_bytes() == (tmp_path / "never").read_bytes()
    again = IndexFile(tmp_path / "cut", slots=3, max_index=12)
    assert again.index_count == keep + 1
    found: list[int] = []
    again.select_phy_offsets("T#k0", 10, 0, 2**62, found)
    assert found == [100 * (i + 1) for i in range(keep - 1, -1, -1) if i % 5 == 0]
    again.close()


def test_an_index_cut_back_indexes_what_is_stored_at_those_offsets_next(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=4)  # 3 entries per file
    service.load(flushed_up_to=None)
    service.build_all([_message(100 * i, 1000 * i, keys=f"old{i}") for i in range(1, 8)], now_ms=1)
    assert len(service.files) == 3
    assert service.truncate(300) == 5
    assert len(service.files) == 1  # the newer files held only cut entries
    assert service.end_phy_offset == 200
    service.build_all([_message(100 * i, 1000 * i, keys=f"new{i}") for i in range(3, 6)], now_ms=2)
    for i in range(3, 6):
        assert service.query_offsets("T", f"new{i}", 10, 0, 10**9).phy_offsets == [100 * i]
        assert service.query_offsets("T", f"old{i}", 10, 0, 10**9).phy_offsets == []
    assert service.query_offsets("T", "old2", 10, 0, 10**9).phy_offsets == [200]
    service.close()


def test_an_empty_newest_file_continuing_a_cut_end_goes_too(tmp_path: Path) -> None:
    service = IndexService(tmp_path, slots=11, max_index=4)
    service.load(flushed_up_to=None)
    service.build_all([_message(100 * i, 1000 * i, keys=f"k{i}") for i in range(1, 4)], now_ms=1)
    service._writable(now_ms=2)  # a crash right after the next file was created
    assert len(service.files) == 2 and service.end_phy_offset == 300
    assert service.cut_tail(lambda phy: phy >= 250) == 1
    assert [f.index_count for f in service.files] == [3]
    assert service.end_phy_offset == 200


def test_a_refused_reservation_writes_nothing_and_the_keys_go_in_once_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioha.store import _index

    fake = RefusingFallocate()
    monkeypatch.setattr(_index, "os", fake)
    service = IndexService(tmp_path, slots=4096, max_index=50)  # a slot page per key or so
    service.load(flushed_up_to=None)
    batch = [("T", 100 * i, 1000 * i, None, b"k%d" % i) for i in range(1, 30)]
    service.build_batch(batch[:5], now_ms=1)
    before = {p.name: p.read_bytes() for p in service.directory.iterdir()}
    fake.full = True
    with pytest.raises(OSError, match="No space left"):
        service.build_batch(batch[5:], now_ms=1)
    assert fake.refused == 1
    assert {p.name: p.read_bytes() for p in service.directory.iterdir()} == before
    assert service.pending == 24
    with pytest.raises(OSError, match="No space left"):  # the same messages, again
        service.build_batch(batch[5:], now_ms=1)
    assert service.pending == 24
    fake.full = False
    service.build_batch(batch, now_ms=1)  # ... and again once there is space
    assert service.pending == 0
    assert len(service.files) == 1
    assert service.files[0].index_count == 30
    for i in range(1, 30):
        assert service.query_offsets("T", f"k{i}", 10, 0, 10**9).phy_offsets == [100 * i]
    service.close()


def test_a_file_the_disk_refuses_to_create_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioha.store import _index

    fake = RefusingFallocate()
    monkeypatch.setattr(_index, "os", fake)
    service = IndexService(tmp_path, slots=11, max_index=4)
    service.load(flushed_up_to=None)
    fake.full = True
    with pytest.raises(OSError, match="No space left"):
        service.build_batch([("T", 100, 1000, None, b"k")], now_ms=1)
    assert list(service.directory.iterdir()) == []
    assert service.files == []
    fake.full = False
    service.build_batch([], now_ms=2)
    assert service.query_offsets("T", "k", 10, 0, 10**9).phy_offsets == [100]
    service.close()


def test_a_busy_file_has_its_whole_slot_table_reserved_at_once(
    tmp_path: Path,
) -> None:
    slots = 64 * 1024  # 256 KiB of slots: 65 pages with the header
    table = HEADER_SIZE + SLOT_SIZE * slots
    index_file = IndexFile(tmp_path / "f", slots=slots, max_index=100_000)
    same_slot = [(7, i, 1_700_000_000_000) for i in range(slots // 64)]
    index_file.put_hashes(same_slot, 0)  # one slot page (and the entries, a step ahead)
    before = (tmp_path / "f").stat().st_blocks * 512
    index_file.put_hashes([(8, 10**6, 1_700_000_000_000)], 0)  # now slots / 64 entries
    after = (tmp_path / "f").stat().st_blocks * 512
    assert after - before >= table - 3 * 4096  # every page of the table but those it had
    index_file.close()
