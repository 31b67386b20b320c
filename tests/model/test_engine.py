"""The generic checker on small toy specs whose answers are known by hand."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from model._engine import Edge, Goal, Invariant, Probe, check

# A number line 0..9: "inc" adds one, "double" doubles, the fault "reset" goes back to 0.


class Numbers:
    def __init__(
        self,
        *,
        bad: int | None = None,
        trap: int | None = None,
        goal: int | None = None,
        probe: int | None = None,
        flaky: int | None = None,
        within: int | None = None,
    ) -> None:
        self.bad, self.trap, self.goal, self.probe, self.flaky = bad, trap, goal, probe, flaky
        self.within = within

    def initial_states(self) -> Sequence[int]:
        return (0,)

    def successors(self, state: int) -> Iterable[Edge[int, str]]:
        if state == self.trap:
            yield Edge("stay", state)
        else:
            if state < 9:
                marks = frozenset({"passed"}) if state + 1 == self.probe else frozenset()
                flake = state == self.flaky
                violations = (("NoFlake", f"{state} -> {state + 1}"),) if flake else ()
                yield Edge("inc", state + 1, violations=violations, marks=marks)
            if 0 < state <= 4:
                yield Edge("double", state * 2)
        if state:
            yield Edge("reset", 0, fault=True)

    def invariants(self) -> Sequence[Invariant[int]]:
        bad = self.bad
        return (Invariant("NotBad", lambda s: f"reached {s}" if s == bad else None),)

    def transition_invariants(self) -> Sequence[str]:
        return ("NoFlake",)

    def probes(self) -> Sequence[Probe[int]]:
        out: list[Probe[int]] = [Probe("passed")] if self.probe is not None else []
        return out

    def goals(self) -> Sequence[Goal[int]]:
        goal = self.goal
        if goal is None:
            return ()
        return (Goal("ReachGoal", lambda s: s == goal, within=self.within),)


def test_every_state_is_found_once() -> None:
    result = check(Numbers())
    assert result.states == 10
    assert result.complete
    assert result.ok
    assert result.invariants == ("NotBad", "NoFlake")


def test_breadth_first_gives_the_shortest_trace() -> None:
    result = check(Numbers(bad=7))
    violation = result.violation("NotBad")
    assert violation is not None
    assert violation.message == "reached 7"
    # 0 -inc-> 1 -inc-> 2 -inc-> 3 -double-> 6 -inc-> 7 is one of the shortest paths.
    assert len(violation.trace) == 5
    assert violation.trace.final == 7
    assert violation.trace.initial == 0
    states = [violation.trace.initial, *(s for _, s in violation.trace.steps)]
    for (action, after), before in zip(violation.trace.steps, states, strict=False):
        assert after == (before + 1 if action == "inc" else before * 2)


def test_depth_first_also_finds_it() -> None:
    result = check(Numbers(bad=7), strategy="dfs")
    violation = result.violation("NotBad")
    assert violation is not None
    assert violation.trace.final == 7
    assert result.strategy == "dfs"


def test_a_violating_state_is_not_explored_further() -> None:
    # 8 and 9 are only reachable through 7 or from 4 (4*2 = 8): 9 only via 8.
    result = check(Numbers(bad=4))
    assert result.states < 10
    assert not result.ok


def test_stop_at_first_ends_the_search() -> None:
    full = check(Numbers(bad=3))
    early = check(Numbers(bad=3), stop_at_first=True)
    assert early.states < full.states
    assert not early.complete
    assert early.violation("NotBad") is not None


def test_max_states_guards_the_search_and_says_so() -> None:
    result = check(Numbers(goal=0), max_states=3)
    assert result.states == 3
    assert not result.complete
    assert not result.ok
    assert result.liveness["ReachGoal"].startswith("skipped")


def test_transition_violations_carry_the_edge() -> None:
    result = check(Numbers(flaky=5))
    violation = result.violation("NoFlake")
    assert violation is not None
    assert violation.trace.final == 6
    assert violation.trace.actions[-1] == "inc"


def test_probes_must_be_reached() -> None:
    assert check(Numbers(probe=3)).probe_hits["passed"].final == 3
    missed = check(Numbers(probe=3, trap=1))
    assert missed.missed_probes == ("passed",)
    assert not missed.ok


def test_liveness_holds_when_every_state_can_reach_the_goal() -> None:
    assert check(Numbers(goal=9)).liveness == {"ReachGoal": "ok"}


def test_bounded_liveness_reports_the_farthest_state_and_holds_it_to_the_bound() -> None:
    # 0 is the farthest from 9: inc, double, double, double, inc.
    assert check(Numbers(goal=9)).distances == {"ReachGoal": 5}
    assert check(Numbers(goal=9, within=5)).liveness == {"ReachGoal": "ok"}
    result = check(Numbers(goal=9, within=4))
    violation = result.violation("ReachGoal")
    assert violation is not None
    assert "needs 5 fault-free steps" in violation.message
    assert violation.trace.final == 0
    assert result.liveness["ReachGoal"] == "ReachGoal"


def test_liveness_ignores_fault_edges() -> None:
    # From the trap only the "reset" fault leads anywhere: recovery would need a fault.
    result = check(Numbers(goal=9, trap=3))
    violation = result.violation("ReachGoal")
    assert violation is not None
    assert violation.trace.final == 3
    assert violation.stuck_states == 1
    assert result.liveness["ReachGoal"] == "ReachGoal"


def test_liveness_is_skipped_when_safety_fails() -> None:
    result = check(Numbers(goal=9, bad=5))
    assert result.liveness["ReachGoal"].startswith("skipped")


class Pairs:
    """Two interchangeable counters (0..2 each): symmetric under swapping them."""

    def initial_states(self) -> Sequence[tuple[int, int]]:
        return ((0, 0),)

    def successors(self, state: tuple[int, int]) -> Iterable[Edge[tuple[int, int], str]]:
        a, b = state
        if a < 2:
            yield Edge("a", (a + 1, b))
        if b < 2:
            yield Edge("b", (a, b + 1))

    def canonical(self, state: tuple[int, int]) -> tuple[int, int]:
        a, b = state
        return (a, b) if a <= b else (b, a)

    def invariants(self) -> Sequence[Invariant[tuple[int, int]]]:
        return ()

    def transition_invariants(self) -> Sequence[str]:
        return ()

    def probes(self) -> Sequence[Probe[tuple[int, int]]]:
        return ()

    def goals(self) -> Sequence[Goal[tuple[int, int]]]:
        return ()


def test_symmetry_keeps_one_state_per_class() -> None:
    assert check(Pairs(), symmetry=False).states == 9
    assert check(Pairs()).states == 6
