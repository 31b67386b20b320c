"""The message index files, byte for byte as RocketMQ's ``IndexFile`` writes them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from trioha.store._consumequeue import java_string_hash
from trioha.store._index import (
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
