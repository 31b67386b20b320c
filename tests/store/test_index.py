"""The message index files, byte for byte as RocketMQ's ``IndexFile`` writes them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from trioha.store._consumequeue import java_string_hash
from trioha.store._index import (
    _ENTRY,
    ENTRY_SIZE,
    HEADER_SIZE,
    SLOT_SIZE,
    IndexedMessage,
    IndexFile,
    IndexService,
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
