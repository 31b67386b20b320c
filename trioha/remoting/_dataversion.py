"""RocketMQ's ``DataVersion``: how a broker's topic table says it changed.

A broker sends its topic table's version with every registration, and a name server (or a slave
syncing its master's metadata) compares versions instead of whole tables
(``org.apache.rocketmq.common.DataVersion``).
"""

from __future__ import annotations

import time
from typing import Any

import attrs


def _now_ms() -> int:
    return int(time.time() * 1000)


@attrs.frozen
class DataVersion:
    """``DataVersion``: a table's version, bumped on every change."""

    timestamp: int
    counter: int = 0

    @classmethod
    def new(cls) -> DataVersion:
        return cls(timestamp=_now_ms(), counter=0)

    def next(self) -> DataVersion:
        """``nextVersion``: counter + 1 and a fresh timestamp."""
        return DataVersion(timestamp=_now_ms(), counter=self.counter + 1)

    def to_json(self) -> dict[str, int]:
        return {"counter": self.counter, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, value: Any) -> DataVersion:
        if not isinstance(value, dict):
            return cls.new()
        return cls(timestamp=int(value.get("timestamp", 0)), counter=int(value.get("counter", 0)))
