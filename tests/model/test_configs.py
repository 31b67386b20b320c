"""Every named configuration does what it claims, and its exploration size is pinned.

A pinned distinct-state count changes whenever the protocol's semantics change (a new state
field, a rule that now allows or forbids a step), even if every property still holds: update
the number only together with docs/model.md and an explanation in the commit.
"""

from __future__ import annotations

import attrs
import pytest

import model
from model import CONFIGS

#: Distinct states of each passing configuration (complete breadth-first search).
PINNED_STATES = {
    "smoke": 22_210,
    "hostile": 22_644,
    "ci": 166_633,
    "fixed-ack-flushed-restart": 573,
    "fixed-sync-flush-crash": 105,
    "fixed-oldest-copy": 129,
    # Once open findings; they pass since a connection vouches only for what it carried.
    "empty-slave-gap": 1_826,
    "rogue-at-end": 976,
    # Second round: odd frames, reports wrong anywhere, the fallbehind_max edge.
    "odd-frames": 19_921,
    "hostile-anywhere": 8_980,
    "fallbehind-edge": 24_570,
}
#: Too big for the default run; ``pytest -m slow`` checks them (docs/model.md has timings).
PINNED_SLOW = {
    "multi-segment": 130_204,
    "nightly": 3_758_861,
}
#: Known-bad configurations: the length of the shortest counterexample.
PINNED_TRACE = {
    "ack-written-restart": 9,
    "async-flush-crash": 8,
    "segment-deletion": 9,
    "last-segment-copy": 2,
}


def test_every_configuration_is_pinned() -> None:
    known = {*PINNED_STATES, *PINNED_SLOW, *PINNED_TRACE}
    assert known == set(CONFIGS)
    assert {n for n, c in CONFIGS.items() if c.expect} == set(PINNED_TRACE)


def _passes(name: str) -> model.Result[model.World, model.Step]:
    config = CONFIGS[name]
    result = model.check(config)
    report = model.render_result(config, result)
    assert result.complete, report
    assert not result.violations, report
    assert not result.missed_probes, report
    assert all(v == "ok" for v in result.liveness.values()), report
    assert model.verdict(config, result) == (True, "ok")
    return result


@pytest.mark.parametrize("name", sorted(PINNED_STATES))
def test_configuration_passes_with_its_pinned_state_count(name: str) -> None:
    assert _passes(name).states == PINNED_STATES[name]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # nightly takes minutes on a loaded machine
@pytest.mark.parametrize("name", sorted(PINNED_SLOW))
def test_big_configuration_passes_with_its_pinned_state_count(name: str) -> None:
    assert _passes(name).states == PINNED_SLOW[name]


def test_ci_is_big_enough() -> None:
    assert PINNED_STATES["ci"] >= 100_000
    assert PINNED_SLOW["nightly"] >= 1_000_000


@pytest.mark.parametrize("name", sorted(PINNED_TRACE))
def test_known_bad_configuration_fails_on_the_named_property(name: str) -> None:
    config = CONFIGS[name]
    result = model.check(config)
    first = result.first_violation
    assert first is not None
    assert first.name == config.expect
    assert len(first.trace) == PINNED_TRACE[name]
    assert model.verdict(config, result)[0]


def test_the_former_findings_no_longer_lose_sync_puts() -> None:
    """Both once ended in a PUT_OK that no slave held; the fix is ``trioha.proto.vouch``."""
    for name in ("empty-slave-gap", "rogue-at-end"):
        result = model.check(name, stop_at_first=False)
        assert result.violation("SyncAckedOnSlave") is None
        assert result.violation("AckNotAhead") is None


def test_symmetry_reduction_is_sound_and_smaller() -> None:
    """Sorting connections merges worlds that differ only in which one was opened first."""
    # A rogue connection may open before or after the slave's, and a stale one may linger.
    config = attrs.evolve(
        CONFIGS["fixed-ack-flushed-restart"], faults=model.Faults(bogus=1, drops=1, stale=1)
    )
    plain = model.check(config, symmetry=False)
    reduced = model.check(config)
    assert plain.ok
    assert reduced.ok
    assert (plain.states, reduced.states) == (8_956, 7_068)


def test_depth_first_finds_the_same_violation() -> None:
    result = model.check("ack-written-restart", strategy="dfs")
    first = result.first_violation
    assert first is not None
    assert first.name == "SyncAckedOnSlave"
