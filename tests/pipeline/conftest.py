"""One local Spark for the whole test run, and the commit logs the tests read.

Spark tests are marked ``spark``. They are skipped, with the reason, only when pyspark is
not installed at all; any other failure to start Spark (no Java, ...) is an error.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import pytest

from tests.pipeline._logs import varied_messages, write_log
from trioha.store import StoredMessage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MISSING = [n for n in ("pyspark", "pyarrow", "numpy") if importlib.util.find_spec(n) is None]
SKIP_REASON = f"{', '.join(MISSING)} not installed (pip install 'trioha[spark]')"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Without the extra, every ``spark`` test skips with the reason (none fails on import)."""
    if not MISSING:
        return
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """``local[2]`` Spark, UI off, quiet, started once for every test that asks for it."""
    if MISSING:
        pytest.skip(SKIP_REASON)
    from trioha.pipeline import spark_session

    session = spark_session("local[2]", app_name="trioha-tests", ui=False)
    yield session
    session.stop()


@attrs.frozen
class Log:
    """A store written by the tests, and what the store reads back from it."""

    root: Path
    messages: list[StoredMessage]

    @property
    def end(self) -> int:
        return self.messages[-1].end_offset


@pytest.fixture(scope="session")
def varied_log(tmp_path_factory: pytest.TempPathFactory) -> Log:
    """300 varied messages over four 64 KiB segments (read-only: copy before changing)."""
    root = tmp_path_factory.mktemp("varied") / "store"
    return Log(root, write_log(root, varied_messages(300)))
