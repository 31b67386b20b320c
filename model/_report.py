"""Running a named configuration and printing what it found, traces included.

Two worlds share the engine and this report: the replication world (:class:`Config`) and the
failover world (:class:`FailoverConfig`); each function takes either.
"""

from __future__ import annotations

from typing import Any, overload

import attrs

from model._configs import get
from model._engine import Result, Trace, Violation
from model._engine import check as _check
from model._failover_properties import PROBES as FAILOVER_PROBES
from model._failover_properties import STATE_INVARIANTS as FAILOVER_INVARIANTS
from model._failover_properties import TRANSITION_INVARIANTS as FAILOVER_TRANSITIONS
from model._failover_properties import FailoverSpec
from model._failover_steps import FailoverModel, FStep
from model._failover_values import FailoverConfig, FailoverWorld
from model._properties import PROBES, STATE_INVARIANTS, TRANSITION_INVARIANTS, HASpec
from model._steps import HAModel
from model._values import Config, Step, World

Outcome = Result[World, Step]
FailoverOutcome = Result[FailoverWorld, FStep]
AnyConfig = Config | FailoverConfig


@overload
def check(
    config: Config,
    *,
    strategy: str = ...,
    max_states: int | None = ...,
    stop_at_first: bool = ...,
    symmetry: bool | None = ...,
) -> Outcome: ...


@overload
def check(
    config: FailoverConfig,
    *,
    strategy: str = ...,
    max_states: int | None = ...,
    stop_at_first: bool = ...,
    symmetry: bool | None = ...,
) -> FailoverOutcome: ...


@overload
def check(
    config: str,
    *,
    strategy: str = ...,
    max_states: int | None = ...,
    stop_at_first: bool = ...,
    symmetry: bool | None = ...,
) -> Result[Any, Any]: ...


def check(
    config: AnyConfig | str,
    *,
    strategy: str = "bfs",
    max_states: int | None = None,
    stop_at_first: bool = True,
    symmetry: bool | None = None,
) -> Result[Any, Any]:
    """Explore *config* (a configuration or the name of one) and judge every property."""
    cfg = get(config) if isinstance(config, str) else config
    if isinstance(cfg, FailoverConfig):
        return _check(
            FailoverSpec(cfg),
            strategy=strategy,
            max_states=max_states,
            stop_at_first=stop_at_first,
            symmetry=False,
        )
    if symmetry is not None:
        cfg = attrs.evolve(cfg, symmetry=symmetry)
    spec = HASpec(cfg)
    return _check(spec, strategy=strategy, max_states=max_states, stop_at_first=stop_at_first)


def verdict(config: AnyConfig, result: Result[Any, Any]) -> tuple[bool, str]:
    """Did the run go as it should, and a one-line summary.

    A good configuration must pass everything; a known-bad one must fail on exactly the
    property it names (other properties failing too is fine: it is broken on purpose).
    """
    if config.expect is None:
        if result.ok:
            return True, "ok"
        if not result.complete and not result.violations:
            return False, "inconclusive: stopped at max_states"
        return False, "FAILED"
    if result.violation(config.expect) is not None:
        return True, f"fails on {config.expect}, as expected"
    return False, f"expected {config.expect} to fail, but it did not"


def render_trace(config: AnyConfig, trace: Trace[Any, Any]) -> str:
    """A numbered list of steps, each with what the cores did (re-applied with explanations)."""
    model: HAModel | FailoverModel = (
        FailoverModel(config) if isinstance(config, FailoverConfig) else HAModel(config)
    )
    world = model.initial()
    lines = []
    width = max((len(str(step)) for step in trace.actions), default=0)
    for n, step in enumerate(trace.actions, 1):
        out = model.apply(world, step, explain=True)  # type: ignore[arg-type]
        if out is None:
            lines.append(f"{n:3}. {step!s}  (not enabled: the trace does not fit this model)")
            break
        notes = list(out.notes) or ["(no protocol event)"]
        lines.append(f"{n:3}. {step!s:<{width}}  {notes[0]}")
        lines.extend(f"     {'':<{width}}  {note}" for note in notes[1:])
        lines.extend(f"     {'':<{width}}  !! {name}: {msg}" for name, msg in out.violations)
        world = out.world
    return "\n".join(lines)


def render_violation(config: AnyConfig, violation: Violation[Any, Any]) -> str:
    head = f"{violation.name} violated: {violation.message}"
    what = "shortest trace" if violation.stuck_states == 0 else "shortest trace into it"
    steps = render_trace(config, violation.trace)
    return f"{head}\n{what} ({len(violation.trace)} steps):\n{steps}"


def _docs(config: AnyConfig) -> tuple[dict[str, str], dict[str, str]]:
    """Property docs and probe docs for *config*'s world."""
    if isinstance(config, FailoverConfig):
        docs = dict(
            [(inv.name, inv.doc) for inv in FAILOVER_INVARIANTS] + list(FAILOVER_TRANSITIONS)
        )
        return docs, {p.name: p.doc for p in FAILOVER_PROBES}
    docs = dict([(inv.name, inv.doc) for inv in STATE_INVARIANTS] + list(TRANSITION_INVARIANTS))
    return docs, {p.name: p.doc for p in PROBES}


def render_result(config: AnyConfig, result: Result[Any, Any]) -> str:
    """The full report ``python -m model`` prints."""
    _ok, summary = verdict(config, result)
    docs, probe_docs = _docs(config)
    lines = [
        f"configuration {config.name}: {config.doc}",
        f"  states {result.states:,}  transitions {result.transitions:,}  depth {result.depth}  "
        f"time {result.seconds:.1f} s  ({result.strategy}, symmetry "
        f"{'on' if config.symmetry else 'off'}{'' if result.complete else ', stopped early'})",
        "invariants:",
    ]
    failed = {v.name for v in result.violations}
    # "-": not judged, because the search stopped early (first violation or max_states).
    unchecked = "ok" if result.complete else "-"
    for name in dict.fromkeys(result.invariants):
        mark = "FAIL" if name in failed else unchecked
        lines.append(f"  {mark:<5} {name:<30} {docs.get(name, '')}")
    lines.append("liveness (recovery needs no further fault):")
    for goal in result.goals:
        state = result.liveness.get(goal, "not judged")
        mark = "FAIL" if goal in failed else ("ok" if state == "ok" else "-")
        note = "" if mark != "-" else f" ({state})"
        if goal in result.distances:
            note += f" (at most {result.distances[goal]} fault-free steps away)"
        lines.append(f"  {mark:<5} {goal}{note}")
    lines.append("probes (each must be reached at least once):")
    for probe in result.probes:
        hit = result.probe_hits.get(probe)
        missed = "MISSED" if result.complete else "-"
        mark = f"ok ({len(hit)} steps)" if hit is not None else missed
        lines.append(f"  {mark:<14} {probe:<34} {probe_docs.get(probe, '')}")
    for violation in sorted(result.violations, key=lambda v: len(v.trace)):
        lines.append("")
        lines.append(render_violation(config, violation))
    lines.append("")
    lines.append(f"result: {summary}")
    return "\n".join(lines)
