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
    "smoke": 21_222,
    "hostile": 21_803,
    "ci": 178_398,
    "fixed-ack-flushed-restart": 554,
    "fixed-sync-flush-crash": 105,
    "fixed-oldest-copy": 129,
}
#: Too big for the default run; ``pytest -m slow`` checks them (docs/model.md has timings).
PINNED_SLOW = {
    "multi-segment": 121_152,
    "nightly": 3_701_689,
}
#: Known-bad configurations: the length of the shortest counterexample.
PINNED_TRACE = {
    "ack-written-restart": 9,
    "async-flush-crash": 8,
    "segment-deletion": 9,
    "last-segment-copy": 2,
}


def test_every_configuration_is_pinned() -> None:
    known = {*PINNED_STATES, *PINNED_SLOW, *PINNED_TRACE, *OPEN_FINDINGS}
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


#: Configurations that must pass but fail until a production fix (docs/model.md, open
#: findings): the property that fails first and the length of its shortest trace.
OPEN_FINDINGS = {
    "empty-slave-gap": ("SyncAckedOnSlave", 13),
    "rogue-at-end": ("AckNotAhead", 3),
}


@pytest.mark.xfail(
    strict=True,
    reason="production bugs (docs/model.md, open findings): an empty slave served from the last "
    "segment, or a rogue client reporting the master's end, acks puts it does not hold",
)
@pytest.mark.parametrize("name", sorted(OPEN_FINDINGS))
def test_open_finding_passes(name: str) -> None:
    _passes(name)


@pytest.mark.parametrize("name", sorted(OPEN_FINDINGS))
def test_open_finding_trace(name: str) -> None:
    """The open findings, pinned so that a fix shows up here too."""
    result = model.check(name)
    first = result.first_violation
    assert first is not None
    assert (first.name, len(first.trace)) == OPEN_FINDINGS[name]


def test_open_findings_lose_sync_puts() -> None:
    """Both findings end in a PUT_OK that no slave holds."""
    gap = model.check("empty-slave-gap").violation("SyncAckedOnSlave")
    assert gap is not None
    assert gap.message == (
        "message 2 at [2, 4) was answered PUT_OK but the slave's log is [4, 6) and does not "
        "hold it"
    )
    rogue = model.check("rogue-at-end", stop_at_first=False).violation("SyncAckedOnSlave")
    assert rogue is not None
    assert len(rogue.trace) == 5
    assert rogue.trace.actions[-2].kind is model.Kind.BOGUS_REPORT


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
    assert (plain.states, reduced.states) == (8_831, 6_928)


def test_depth_first_finds_the_same_violation() -> None:
    result = model.check("ack-written-restart", strategy="dfs")
    first = result.first_violation
    assert first is not None
    assert first.name == "SyncAckedOnSlave"
