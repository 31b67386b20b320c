"""Fixtures for the store tests: commit logs of both kinds, a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trioha.store import FileCommitLog, MemoryCommitLog
from trioha.store._logcore import LogCore


class FakeClock:
    """Milliseconds that advance by one on every reading: deterministic store timestamps."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


LogFactory = Callable[..., LogCore[Any]]


@pytest.fixture(params=["file", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    """Build commit logs of the parametrized kind: ``make_log(segment_size=4096, ...)``."""
    made: list[LogCore[Any]] = []
    counter = iter(range(1_000_000))

    def make(*, segment_size: int = 4096, **kw: Any) -> LogCore[Any]:
        kw.setdefault("clock_ms", FakeClock())
        log: LogCore[Any]
        if request.param == "file":
            directory = tmp_path / f"store{next(counter)}" / "commitlog"
            log = FileCommitLog.open(directory, segment_size=segment_size, **kw)
        else:
            log = MemoryCommitLog(segment_size=segment_size, **kw)
        made.append(log)
        return log

    yield make
    for log in made:
        log.close()
