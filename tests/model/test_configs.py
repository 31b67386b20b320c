"""Every named configuration does what it claims, and its exploration size is pinned.

A pinned distinct-state count changes whenever the protocol's semantics change (a new state
field, a rule that now allows or forbids a step), even if every property still holds: update
the number only together with docs/model.md and an explanation in the commit.
"""

from __future__ import annotations

import attrs
import pytest

import model
from model import CONFIGS, _steps
from model._properties import no_silent_reattach
from trioha.proto import LogView

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
    # Epoch mode: the slave holding a lost tail cuts back before it streams.
    "epoch-flush-crash": 510,
    "epoch-lost-records": 3_366,
    "epoch-smoke": 35_884,
    # Second round: odd frames, reports wrong anywhere, the fallbehind_max edge.
    "odd-frames": 19_921,
    "hostile-anywhere": 8_980,
    "fallbehind-edge": 24_570,
}
#: Too big for the default run; ``pytest -m slow`` checks them (docs/model.md has timings).
PINNED_SLOW = {
    "multi-segment": 130_204,
    "nightly": 3_758_861,
    "epoch-ci": 331_812,
}
#: The classic-mode divergence check (trioha.net._divergence), kept apart from the above.
PINNED_STATES.update({"classic-refusal": 470})
PINNED_SLOW.update({"classic-lost-sent": 29_412})
#: Known-bad configurations: the length of the shortest counterexample.
PINNED_TRACE = {
    "ack-written-restart": 9,
    "async-flush-crash": 8,
    "segment-deletion": 9,
    "last-segment-copy": 2,
    "classic-lost-records": 8,
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


# --- classic-mode divergence check ------------------------------------------------------------


def test_without_the_classic_refusal_a_slave_is_silently_reattached() -> None:
    """async-flush-crash's shortest trace, continued: the slave reconnects and is served.

    The engine stops at the divergence (NoDivergence); two more steps give the trace the
    classic refusal exists to rule out, which classic-refusal proves unreachable.
    """
    config = CONFIGS["async-flush-crash"]
    first = model.check(config).first_violation
    assert first is not None
    ha = model.HAModel(config)
    world = first.trace.final
    for step in (model.Step(model.Kind.CONNECTED), model.Step(model.Kind.REPORT_RECEIVED, 0, 1)):
        outcome = ha.apply(world, step)
        assert outcome is not None, step
        world = outcome.world
    message = no_silent_reattach(world)
    assert message is not None
    assert "silently re-attached" in message


def test_with_the_classic_refusal_no_slave_is_reattached_and_every_property_holds() -> None:
    result = model.check("classic-refusal", stop_at_first=False)
    assert result.violation("NoSilentReattach") is None
    assert result.violation("NoMessageDivergence") is None
    assert result.ok


def test_the_classic_refusal_is_what_keeps_the_slave_out() -> None:
    """Bug injection: a master that forgets its lost ranges re-attaches the slave."""
    config = CONFIGS["classic-refusal"]

    original = _steps._Tx.log

    def forgetful(self: _steps._Tx) -> LogView:
        view = original(self)
        return LogView(view.min_offset, view.max_offset, view.segment_size)

    _steps._Tx.log = forgetful  # type: ignore[method-assign]
    try:
        result = model.check(config, stop_at_first=False)
    finally:
        _steps._Tx.log = original  # type: ignore[method-assign]
    assert result.violation("NoSilentReattach") is not None


def test_epoch_mode_cuts_where_classic_splices() -> None:
    """The same lost tail: classic HA re-attaches the slave on a spliced log, epoch mode never
    lets it stream before it has cut back to the consistent point."""
    classic = model.check("classic-lost-records", stop_at_first=False)
    assert classic.violation("NoDivergence") is not None
    assert classic.violation("SlaveIsPrefixOfMaster") is not None
    epoch = model.check("epoch-lost-records", stop_at_first=False)
    assert epoch.ok
    assert "slave_truncated" not in epoch.missed_probes
