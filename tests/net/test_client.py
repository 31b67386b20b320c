"""The slave's HA client: its sticky divergence record and the settings it refuses."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trioha import BrokerConfig, ConfigError, StoreLayoutError
from trioha.net import HAClient
from trioha.net._client import Divergence
from trioha.store import MemoryCommitLog

RECORD = Divergence(4096, 8192, "10.0.0.1:10912", "the master's log ends at 4096\nfor good")


def test_a_divergence_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "diverged"
    assert Divergence.read(path) is None
    RECORD.write(path)
    reason = "the master's log ends at 4096 for good"  # one line in the file
    assert Divergence.read(path) == Divergence(4096, 8192, "10.0.0.1:10912", reason)
    assert not path.with_name("diverged.tmp").exists()


@pytest.mark.parametrize(
    "text",
    ["", "master_offset 10\n", "master_offset ten\nslave_offset 3\n", "garbage"],
)
def test_a_divergence_file_not_written_by_trioha_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "diverged"
    path.write_text(text)
    with pytest.raises(StoreLayoutError, match="does not record a divergence as trioha writes it"):
        Divergence.read(path)


def test_an_unreadable_divergence_file_is_a_named_error(tmp_path: Path) -> None:
    path = tmp_path / "diverged"
    path.mkdir()
    with pytest.raises(StoreLayoutError, match=r"cannot read .*diverged"):
        Divergence.read(path)
    path.rmdir()
    path.write_bytes(b"master_offset \xff\n")
    with pytest.raises(StoreLayoutError, match=r"cannot read .*utf-8"):
        Divergence.read(path)


def test_a_divergence_that_cannot_be_recorded_is_logged_and_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "missing-dir" / "diverged"
    with caplog.at_level(logging.ERROR):
        RECORD.write(path)
    assert f"cannot record the divergence in {path}" in caplog.text
    assert not path.exists()


def test_a_slave_without_a_master_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="a slave needs ha_master_address"):
        HAClient(BrokerConfig(), MemoryCommitLog())


def test_an_epoch_mode_slave_without_an_epoch_file_is_refused() -> None:
    config = BrokerConfig(ha_master_address="127.0.0.1:10912", enable_controller_mode=True)
    with pytest.raises(ConfigError, match=r"epoch mode .* needs the store's epoch file"):
        HAClient(config, MemoryCommitLog())
