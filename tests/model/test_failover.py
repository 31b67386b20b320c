"""The failover world: every configuration does what it claims, its size pinned.

As in ``test_configs.py``, a pinned count changes whenever the semantics of the control core,
the etcd double or the failover world change, even if every property still holds: update
it only together with docs/model.md ("Failover") and a commit message that says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

import model
from model import FAILOVER_CONFIGS, FailoverConfig, FailoverModel
from model._cli import main
from model._failover_properties import PROBES
from trioha.failover import Unsafe

#: Distinct states of each passing configuration (complete breadth-first search).
PINNED_STATES = {
    "failover-smoke": 1_944,
    "failover-ci": 173_443,
    "failover-bootstrap": 10_372,
    "failover-handover": 8_108,
    "failover-network": 3_196,
}
#: Too big for the default run; ``pytest -m slow`` checks them.
PINNED_SLOW = {
    "failover-late-keepalive": 1_033_907,
    "failover-min-in-sync": 315_663,
}
#: Known-bad twins: the length of the shortest counterexample.
PINNED_TRACE = {
    "failover-twin-ack-any": 5,
    "failover-twin-unclean": 5,
    "failover-twin-no-token": 11,
    "failover-twin-no-fence": 6,
    "failover-twin-high-watermark": 10,
    "failover-twin-expand-no-union": 3,
    "failover-twin-min-in-sync-early": 5,
    "failover-twin-ack-unflushed": 11,
}
#: The twins the design names (issue text, docs/failover.md), each one switch away from a
#: passing world: the switch, and the passing configuration it is turned off in.
TWIN_SWITCHES: dict[str, dict[str, Any]] = {
    "failover-twin-ack-any": {"all_ack_in_sync_state_set": True},
    "failover-twin-unclean": {"enable_elect_unclean_master": False},
    "failover-twin-no-token": {"unsafe": Unsafe()},
    "failover-twin-no-fence": {"unsafe": Unsafe()},
    "failover-twin-high-watermark": {"truncate_to_high_watermark": False},
    "failover-twin-expand-no-union": {"unsafe": Unsafe()},
    "failover-twin-min-in-sync-early": {"min_in_sync_before_append_only": False},
    "failover-twin-ack-unflushed": {"ack_flushed": True},
}


def test_every_failover_configuration_is_pinned_and_named_so() -> None:
    known = {*PINNED_STATES, *PINNED_SLOW, *PINNED_TRACE}
    assert known == set(FAILOVER_CONFIGS)
    assert {n for n, c in FAILOVER_CONFIGS.items() if c.expect} == set(PINNED_TRACE)
    assert all("failover" in name for name in FAILOVER_CONFIGS)
    assert not set(FAILOVER_CONFIGS) & set(model.CONFIGS)


def test_ci_is_big_enough() -> None:
    assert PINNED_STATES["failover-ci"] >= 100_000


def _passes(config: FailoverConfig) -> model.Result[model.FailoverWorld, model.FStep]:
    result = model.check(config)
    report = model.render_result(config, result)
    assert result.complete, report
    assert not result.violations, report
    assert not result.missed_probes, report
    assert result.liveness == {"MasterCanAck": "ok"}, report
    assert model.verdict(config, result) == (True, "ok")
    return result


@pytest.mark.timeout(900)  # failover-ci: about a minute of CPU, more on a loaded machine
@pytest.mark.parametrize("name", sorted(PINNED_STATES))
def test_configuration_passes_with_its_pinned_state_count(name: str) -> None:
    config = FAILOVER_CONFIGS[name]
    result = _passes(config)
    assert result.states == PINNED_STATES[name]
    # Bounded liveness: the farthest world is exactly as far as the configuration allows.
    assert config.liveness_bound is not None
    assert result.distances == {"MasterCanAck": config.liveness_bound}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("name", sorted(PINNED_SLOW))
def test_big_configuration_passes_with_its_pinned_state_count(name: str) -> None:
    config = FAILOVER_CONFIGS[name]
    result = _passes(config)
    assert result.states == PINNED_SLOW[name]
    assert result.distances == {"MasterCanAck": config.liveness_bound}


def test_a_tighter_liveness_bound_fails_with_a_trace_into_the_farthest_world() -> None:
    config = FAILOVER_CONFIGS["failover-smoke"]
    assert config.liveness_bound is not None
    tight = attrs.evolve(config, liveness_bound=config.liveness_bound - 1)
    result = model.check(tight)
    violation = result.violation("MasterCanAck")
    assert violation is not None
    assert f"needs {config.liveness_bound} fault-free steps" in violation.message


@pytest.mark.parametrize("name", sorted(PINNED_TRACE))
def test_known_bad_twin_fails_on_its_property_with_a_short_trace(name: str) -> None:
    config = FAILOVER_CONFIGS[name]
    result = model.check(config)
    first = result.first_violation
    assert first is not None
    assert first.name == config.expect
    assert len(first.trace) == PINNED_TRACE[name]
    assert model.verdict(config, result)[0]
    # The trace replays step by step through the model, and ends in the violation.
    rendered = model.render_trace(config, first.trace)
    assert "not enabled" not in rendered
    assert rendered.count("\n") + 1 >= len(first.trace)


@pytest.mark.parametrize("name", sorted(TWIN_SWITCHES))
def test_each_twin_is_one_switch_away_from_a_world_that_passes(name: str) -> None:
    """The twin fails because of its switch, not because its world is hostile: the same
    world with the switch off passes every property."""
    config = attrs.evolve(FAILOVER_CONFIGS[name], expect=None, **TWIN_SWITCHES[name])
    result = model.check(config)
    assert result.complete
    assert not result.violations, model.render_result(config, result)


def test_the_twins_are_the_ones_the_design_names() -> None:
    assert set(TWIN_SWITCHES) == set(PINNED_TRACE)
    expected = {FAILOVER_CONFIGS[n].expect for n in PINNED_TRACE}
    assert expected == {
        "NoAckedWriteLost",
        "SSSSuperset",
        "OneAckingMasterPerEpoch",
        "PutOkHasMinCopies",
    }


def test_every_probe_is_required_by_some_configuration() -> None:
    from model._failover_properties import required_probes

    needed = {p.name for n in PINNED_STATES for p in required_probes(FAILOVER_CONFIGS[n])} | {
        p.name for n in PINNED_SLOW for p in required_probes(FAILOVER_CONFIGS[n])
    }
    assert needed == {p.name for p in PROBES}


def test_the_initial_world_is_a_settled_group() -> None:
    for name in ("failover-ci", "failover-smoke"):
        world = FailoverModel(FAILOVER_CONFIGS[name]).initial()
        assert world.master_key() is not None
        assert world.master_key()[:2] == (1, 1)  # type: ignore[index]
        assert world.coordinator_sss() == frozenset({1, 2})
        assert not world.net
        assert world.budget == FAILOVER_CONFIGS[name].faults


def test_list_shows_the_failover_configurations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in FAILOVER_CONFIGS:
        assert name in out
    assert "must fail on OneAckingMasterPerEpoch" in out


def test_a_twin_prints_its_trace_and_says_it_was_expected(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--config", "failover-twin-no-fence"]) == 1
    out = capsys.readouterr().out
    assert "OneAckingMasterPerEpoch violated" in out
    assert "shortest trace (6 steps):" in out
    assert "Cut(b1)" in out
    assert "result: fails on OneAckingMasterPerEpoch, as expected" in out


def test_docs_show_every_twin_with_its_property_and_trace_length() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "failover.md").read_text()
    table = text.split("<!-- twins:begin -->")[1].split("<!-- twins:end -->")[0]
    rows = {line.split("`")[1]: line for line in table.splitlines() if line.startswith("| `")}
    assert set(rows) == set(PINNED_TRACE)
    for name, steps in PINNED_TRACE.items():
        assert f"| `{FAILOVER_CONFIGS[name].expect}` | {steps} steps" in rows[name], name
