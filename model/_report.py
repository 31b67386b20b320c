"""Running a named configuration and printing what it found, traces included."""

from __future__ import annotations

import attrs

from model._configs import get
from model._engine import Result, Trace, Violation
from model._engine import check as _check
from model._properties import PROBES, STATE_INVARIANTS, TRANSITION_INVARIANTS, HASpec
from model._steps import HAModel
from model._values import Config, Step, World

Outcome = Result[World, Step]


def check(
    config: Config | str,
    *,
    strategy: str = "bfs",
    max_states: int | None = None,
    stop_at_first: bool = True,
    symmetry: bool | None = None,
) -> Outcome:
    """Explore *config* (a :class:`Config` or the name of one) and judge every property."""
    cfg = get(config) if isinstance(config, str) else config
    if symmetry is not None:
        cfg = attrs.evolve(cfg, symmetry=symmetry)
    spec = HASpec(cfg)
    return _check(spec, strategy=strategy, max_states=max_states, stop_at_first=stop_at_first)


def verdict(config: Config, result: Outcome) -> tuple[bool, str]:
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


def render_trace(config: Config, trace: Trace[World, Step]) -> str:
    """A numbered list of steps, each with what the cores did (re-applied with explanations)."""
    model = HAModel(config)
    world = model.initial()
    lines = []
    width = max((len(str(step)) for step in trace.actions), default=0)
    for n, step in enumerate(trace.actions, 1):
        out = model.apply(world, step, explain=True)
        if out is None:
            lines.append(f"{n:3}. {step!s}  (not enabled: the trace does not fit this model)")
            break
        notes = list(out.notes) or ["(no protocol event)"]
        lines.append(f"{n:3}. {step!s:<{width}}  {notes[0]}")
        lines.extend(f"     {'':<{width}}  {note}" for note in notes[1:])
        lines.extend(f"     {'':<{width}}  !! {name}: {msg}" for name, msg in out.violations)
        world = out.world
    return "\n".join(lines)


def render_violation(config: Config, violation: Violation[World, Step]) -> str:
    head = f"{violation.name} violated: {violation.message}"
    what = "shortest trace" if violation.stuck_states == 0 else "shortest trace into it"
    steps = render_trace(config, violation.trace)
    return f"{head}\n{what} ({len(violation.trace)} steps):\n{steps}"


def render_result(config: Config, result: Outcome) -> str:
    """The full report ``python -m model`` prints."""
    ok, summary = verdict(config, result)
    docs = dict([(inv.name, inv.doc) for inv in STATE_INVARIANTS] + list(TRANSITION_INVARIANTS))
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
    for name in result.invariants:
        mark = "FAIL" if name in failed else unchecked
        lines.append(f"  {mark:<5} {name:<30} {docs.get(name, '')}")
    lines.append("liveness (recovery needs no further fault):")
    for goal in result.goals:
        state = result.liveness.get(goal, "not judged")
        mark = "FAIL" if goal in failed else ("ok" if state == "ok" else "-")
        note = "" if mark != "-" else f" ({state})"
        lines.append(f"  {mark:<5} {goal}{note}")
    lines.append("probes (each must be reached at least once):")
    probe_docs = {p.name: p.doc for p in PROBES}
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
    del ok
    return "\n".join(lines)
