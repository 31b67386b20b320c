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
