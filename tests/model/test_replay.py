"""Counterexamples replay against the byte-level production objects, and the two agree.

``model.replay`` drives :class:`trioha.proto.MasterConnection` and
:class:`trioha.proto.SlaveConnection` with real frames and reports through a trace, projects them
back into a world after every step and requires it to equal the model's world. So each known-bad
trace is a deterministic test against production code, and random walks check that the pure core
the checker explores and the wrappers production runs do not drift apart.
"""

from __future__ import annotations

import random

import attrs
import pytest

import model
from model import CONFIGS, Faults, HAModel, Kind, Step, random_walk, replay
from model._properties import STATE_INVARIANTS
from model._replay import ReplayMismatch


def _first_trace(name: str) -> model.Trace[model.World, Step]:
    result = model.check(name)
    first = result.first_violation
    assert first is not None
    return first.trace


@pytest.mark.parametrize(
    ("name", "prop"),
    [
        ("ack-written-restart", "SyncAckedOnSlave"),
        ("async-flush-crash", "NoDivergence"),
    ],
)
def test_safety_counterexample_breaks_the_same_property_at_byte_level(name: str, prop: str) -> None:
    config = CONFIGS[name]
    trace = _first_trace(name)
    result = replay(config, trace)
    assert result.broke(prop), result.violations
    assert result.final == trace.final


def test_deleted_segment_stays_stuck_at_byte_level() -> None:
    """RocketMQ #3388: after the trace, no fault-free schedule brings the slave back."""
    config = CONFIGS["segment-deletion"]
    result = replay(config, _first_trace("segment-deletion"), then=60)
    # Told its next bytes are gone, the slave stops for good: the tail ends when nothing but
    # a re-seed (not modelled) could move it.
    assert 1 + 9 < len(result.worlds) <= 1 + 9 + 60
    assert result.worlds[-1].sbehind > result.worlds[-1].send
    assert not result.caught_up_in_tail(config)
    assert any("RocketMQ #3388" in reason for reason in result.closes[-3:])
    assert not result.violations


def test_last_segment_rule_never_copies_the_history_at_byte_level() -> None:
    """RocketMQ #3661: the slave catches up with the tail but never holds the first segment."""
    config = CONFIGS["last-segment-copy"]
    result = replay(config, _first_trace("last-segment-copy"), then=40)
    assert result.caught_up_in_tail(config)
    assert all(not w.slog or w.sbase >= config.segment_size for w in result.worlds)


def test_replay_reports_a_step_the_model_does_not_allow() -> None:
    with pytest.raises(ReplayMismatch, match="not enabled"):
        replay(CONFIGS["smoke"], [Step(Kind.SYNC_TIMEOUT)])


def _model_violations(config: model.Config, steps: list[Step]) -> set[str]:
    """What the model itself says the walk broke (edges, then states)."""
    m = HAModel(config)
    world = m.initial()
    names: set[str] = set()
    for step in steps:
        out = m.apply(world, step)
        assert out is not None
        names.update(name for name, _ in out.violations)
        world = out.world
        names.update(inv.name for inv in STATE_INVARIANTS if inv.check(world) is not None)
    return names


WALK_WORLD = attrs.evolve(
    CONFIGS["nightly"],
    name="walk",
    messages=3,
    async_puts=True,
    faults=Faults(drops=2, housekeeping=2, stale=2, restarts=2, crashes=1, deletions=1, bogus=2),
)


@pytest.mark.parametrize("seed", range(8))
def test_random_walks_agree_step_by_step(seed: int) -> None:
    """Seeded random walks through every fault: byte level == model, and same verdicts."""
    rng = random.Random(seed)
    config = WALK_WORLD if seed % 2 == 0 else attrs.evolve(WALK_WORLD, rogue_reports_end=True)
    m = HAModel(config)
    for _ in range(25):
        steps, world = random_walk(m, rng, 80)
        # Seeds 1 and 5 also deliver every frame to the slave in pieces of 1, 2, 3, ... bytes.
        result = replay(config, steps, split=seed % 4 == 1)  # raises ReplayMismatch on drift
        assert result.final == world
        assert {name for name, _ in result.violations} == _model_violations(config, steps)


def test_a_drifting_wrapper_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a wrapper does not do what the core says (here: ignores a report), replay notices."""
    from trioha.proto import MasterConnection

    def deaf(self: MasterConnection, data: bytes, *, now: float, log: object) -> tuple[()]:
        return ()

    monkeypatch.setattr(MasterConnection, "receive_data", deaf)
    steps = [Step(Kind.CONNECTED), Step(Kind.REPORT_RECEIVED, 0, 1)]
    with pytest.raises(ReplayMismatch, match="after step 2"):
        replay(CONFIGS["smoke"], steps)
