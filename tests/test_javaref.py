"""One variable says where the Java RocketMQ reference is, for every Java test and benchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.javaref import JAVA_ROCKETMQ, MISSING, java_rocketmq, rocketmq_sh


def test_the_reference_is_the_directory_holding_rocketmq_sh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(JAVA_ROCKETMQ, raising=False)
    assert (java_rocketmq(), rocketmq_sh()) == (None, None)
    monkeypatch.setenv(JAVA_ROCKETMQ, str(tmp_path))
    assert (java_rocketmq(), rocketmq_sh()) == (None, None)  # no rocketmq.sh there
    (tmp_path / "rocketmq.sh").write_text("#!/bin/sh\n")
    assert (java_rocketmq(), rocketmq_sh()) == (tmp_path, tmp_path / "rocketmq.sh")
    assert JAVA_ROCKETMQ in MISSING


def test_no_other_name_for_it_is_read_anywhere() -> None:
    root = Path(__file__).resolve().parent.parent
    old = ("TRIOHA_ROCKETMQ_SH", "TRIOHA_ROCKETMQ_REFERENCE", '"ROCKETMQ_SH"')
    for directory in ("tests", "bench", "trioha", "docs"):
        for path in (root / directory).rglob("*.*"):
            if path.suffix in {".py", ".md"} and path.name != "test_javaref.py":
                text = path.read_text(encoding="utf-8")
                assert not [name for name in old if name in text], path
