"""The second-round configurations replayed at byte level, frames delivered in pieces."""

from __future__ import annotations

import random

import pytest

from model import CONFIGS, HAModel, random_walk, replay


@pytest.mark.parametrize("name", ["odd-frames", "hostile-anywhere", "fallbehind-edge"])
def test_random_walks_with_split_deliveries_agree(name: str) -> None:
    config = CONFIGS[name]
    m = HAModel(config)
    rng = random.Random(name)
    for _ in range(15):
        steps, world = random_walk(m, rng, 60)
        result = replay(config, steps, split=True)
        assert result.final == world
        assert not result.violations


@pytest.mark.parametrize(
    "name",
    [
        "smoke",
        "multi-segment",
        "segment-deletion",
        "odd-frames",
        "hostile-anywhere",
        "fallbehind-edge",
    ],
)
def test_random_walks_over_the_real_store_agree(name: str) -> None:
    """Both logs real ``MemoryCommitLog`` objects: frames read from the store, appends through
    ``append_raw``, crashes and restarts through ``truncate``; the stores match the model."""
    config = CONFIGS[name]
    m = HAModel(config)
    rng = random.Random(f"store-{name}")
    for n in range(12):
        steps, world = random_walk(m, rng, 60)
        result = replay(config, steps, split=n % 2 == 1, store=True)
        assert result.final == world
        assert not result.violations


def _store_walks(name: str, walks: int) -> None:
    config = CONFIGS[name]
    m = HAModel(config)
    rng = random.Random(1)  # its 49th walk restarts a slave that has unflushed bytes
    for _ in range(walks):
        steps, _world = random_walk(m, rng, 60)
        replay(config, steps, store=True)


def test_the_real_store_is_in_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose truncate does nothing (a slave restart that keeps its unflushed bytes) is
    noticed: the replay compares both stores with the model after every step."""
    from model._replay import ReplayMismatch, _ModelLog

    monkeypatch.setattr(_ModelLog, "truncate", lambda self, offset: None)
    with pytest.raises(ReplayMismatch, match="slave store"):
        _store_walks("odd-frames", 100)
