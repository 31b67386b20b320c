"""A small explicit-state model checker: breadth-first by default, hashed states, shortest traces.

It knows nothing about replication. A :class:`Spec` hands it initial states, a successor
function and named properties; the engine explores every reachable state once and reports:

* **invariants**: a predicate on every state (``Invariant``) or a check made while taking a
  transition (the spec returns the violation with the edge, e.g. "a frame was not contiguous").
  The first violation of each is kept with the *shortest* trace that reaches it (breadth-first
  order, parent pointers), and the violating state is not explored further;
* **probes** ("sometimes" properties): states or transitions that must be reached at least once,
  so that no invariant passes only because the interesting situations never happen;
* **liveness goals**: from every reachable state, some path made only of non-fault edges must
  reach a goal state. Faults have budgets, so recovery may never *depend* on one. The engine
  keeps every non-fault edge and walks them backwards from the goal states; what is not reached
  is stuck, and the shortest trace into the stuck region is reported.

The shape follows stateright and dslabs: the state is an immutable, hashable value; the search
keeps one dict from state to index, a parent index and the action that led there; a trace is
rebuilt by following parents. ``max_states`` bounds the work; a search it cut short says so and
checks no liveness. A spec may define ``canonical(state)``, mapping each state to one
representative of its symmetry class (e.g. interchangeable connections sorted); the engine then
stores only representatives.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

import attrs

S = TypeVar("S", bound=Hashable)
A = TypeVar("A", bound=Hashable)


class Edge(NamedTuple, Generic[S, A]):
    """One transition: the action taken, the state it leads to and what it showed."""

    action: A
    target: S
    #: A fault edge (a crash, a drop, ...) is ignored when judging whether recovery is possible.
    fault: bool = False
    #: Transition invariants broken while taking this edge: ``(name, message)`` pairs.
    violations: tuple[tuple[str, str], ...] = ()
    #: Names of probes this transition satisfies.
    marks: frozenset[str] = frozenset()


@attrs.frozen
class Invariant(Generic[S]):
    """A property every reachable state must have; ``check`` returns what is wrong, or None."""

    name: str
    check: Callable[[S], str | None]
    doc: str = ""


@attrs.frozen
class Probe(Generic[S]):
    """Something that must happen at least once: a state predicate, or an edge mark (check None)."""

    name: str
    check: Callable[[S], bool] | None = None
    doc: str = ""


@attrs.frozen
class Goal(Generic[S]):
    """A liveness goal: from every reachable state a fault-free path must reach a goal state.

    With *within*, the path must be at most that many steps long from every state (bounded
    liveness); the longest such shortest path is reported either way (``Result.distances``).
    """

    name: str
    check: Callable[[S], bool]
    doc: str = ""
    within: int | None = None


class Spec(Protocol[S, A]):
    """What the engine needs from a model."""

    def initial_states(self) -> Sequence[S]: ...

    def successors(self, state: S) -> Iterable[Edge[S, A]]: ...

    def invariants(self) -> Sequence[Invariant[S]]: ...

    def transition_invariants(self) -> Sequence[str]:
        """Names of the invariants that edges may report (so a report can list them as ok)."""
        ...

    def probes(self) -> Sequence[Probe[S]]: ...

    def goals(self) -> Sequence[Goal[S]]: ...


class Symmetric(Protocol[S]):
    """A spec may also map each state to a representative of its symmetry class."""

    def canonical(self, state: S) -> S: ...


@attrs.frozen
class Trace(Generic[S, A]):
    """The initial state and the (action, state) steps that lead from it to the end state."""

    initial: S
    steps: tuple[tuple[A, S], ...]

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def actions(self) -> tuple[A, ...]:
        return tuple(action for action, _ in self.steps)

    @property
    def final(self) -> S:
        return self.steps[-1][1] if self.steps else self.initial


@attrs.frozen
class Violation(Generic[S, A]):
    """A property that failed, why, and the shortest trace found to it."""

    name: str
    message: str
    trace: Trace[S, A]
    #: For a liveness failure: how many reachable states cannot reach the goal without a fault.
    stuck_states: int = 0


@attrs.frozen
class Result(Generic[S, A]):
    """Everything one search found."""

    states: int
    transitions: int
    depth: int
    seconds: float
    complete: bool
    strategy: str
    invariants: tuple[str, ...]
    probes: tuple[str, ...]
    goals: tuple[str, ...]
    violations: tuple[Violation[S, A], ...]
    #: Probe name -> the shortest trace that satisfied it (missing: never satisfied).
    probe_hits: dict[str, Trace[S, A]]
    #: Goal name -> "ok", "skipped: ..." or the violation's name (also in ``violations``).
    liveness: dict[str, str]
    #: Goal name -> the most fault-free steps any reachable state needs to reach the goal.
    distances: dict[str, int] = attrs.field(factory=dict)

    @property
    def missed_probes(self) -> tuple[str, ...]:
        return tuple(p for p in self.probes if p not in self.probe_hits)

    @property
    def ok(self) -> bool:
        return self.complete and not self.violations and not self.missed_probes

    def violation(self, name: str) -> Violation[S, A] | None:
        for v in self.violations:
            if v.name == name:
                return v
        return None

    @property
    def first_violation(self) -> Violation[S, A] | None:
        """The violation with the shortest trace (ties: the one found first)."""
        if not self.violations:
            return None
        return min(self.violations, key=lambda v: len(v.trace))


class _Search(Generic[S, A]):
    """The bookkeeping of one search: states by index, parents, recorded edges."""

    def __init__(
        self,
        spec: Spec[S, A],
        *,
        strategy: str,
        max_states: int | None,
        stop_at_first: bool,
        symmetry: bool,
    ) -> None:
        if strategy not in ("bfs", "dfs"):
            raise ValueError(f"strategy must be 'bfs' or 'dfs', got {strategy!r}")
        self.spec = spec
        self.strategy = strategy
        self.max_states = max_states
        self.stop_at_first = stop_at_first
        canonical: Callable[[S], S] | None = getattr(spec, "canonical", None)
        self.canonical = canonical if symmetry else None
        self.index: dict[S, int] = {}
        self.states: list[S] = []
        self.parent = array("q")
        self.via: list[A | None] = []
        self.depth = array("l")
        # Non-fault edges per expanded state, for liveness: edges[lo[i]:hi[i]].
        self.edges = array("q")
        self.lo = array("q")
        self.hi = array("q")
        self.invariants = list(spec.invariants())
        self.transition_names = list(spec.transition_invariants())
        self.probes = list(spec.probes())
        self.goals = list(spec.goals())
        self.goal_bits = [bytearray() for _ in self.goals]
        self.violations: dict[str, Violation[S, A]] = {}
        self.probe_hits: dict[str, Trace[S, A]] = {}
        self.transitions = 0
        self.distances: dict[str, int] = {}
        self.complete = True
        self.actions: dict[A, A] = {}  # interned actions: one object per distinct action

    def trace_to(self, idx: int) -> Trace[S, A]:
        steps: list[tuple[A, S]] = []
        while self.parent[idx] >= 0:
            action = self.via[idx]
            assert action is not None
            steps.append((action, self.states[idx]))
            idx = self.parent[idx]
        steps.reverse()
        return Trace(self.states[idx], tuple(steps))

    def extend(self, trace: Trace[S, A], action: A, state: S) -> Trace[S, A]:
        return Trace(trace.initial, (*trace.steps, (action, state)))

    def add(self, state: S, parent: int, action: A | None) -> tuple[int, bool]:
        """Index of *state*, and whether it is new (and may be expanded)."""
        idx = self.index.get(state)
        if idx is not None:
            return idx, False
        idx = len(self.states)
        self.index[state] = idx
        self.states.append(state)
        self.parent.append(parent)
        if action is not None:
            action = self.actions.setdefault(action, action)
        self.via.append(action)
        self.depth.append(self.depth[parent] + 1 if parent >= 0 else 0)
        self.lo.append(-1)
        self.hi.append(-1)
        for bits, goal in zip(self.goal_bits, self.goals, strict=True):
            bits.append(1 if goal.check(state) else 0)
        for probe in self.probes:
            if probe.check is not None and probe.name not in self.probe_hits and probe.check(state):
                self.probe_hits[probe.name] = self.trace_to(idx)
        bad = False
        for inv in self.invariants:
            message = inv.check(state)
            if message is not None:
                bad = True
                if inv.name not in self.violations:
                    self.violations[inv.name] = Violation(inv.name, message, self.trace_to(idx))
        return idx, not bad

    def run(self) -> None:
        frontier: deque[int] = deque()
        canonical = self.canonical
        for init in self.spec.initial_states():
            idx, fresh = self.add(canonical(init) if canonical else init, -1, None)
            if fresh:
                frontier.append(idx)
        pop = frontier.popleft if self.strategy == "bfs" else frontier.pop
        successors = self.spec.successors
        while frontier:
            if self.max_states is not None and len(self.states) >= self.max_states:
                self.complete = False
                break
            if self.stop_at_first and self.violations:
                self.complete = False
                break
            idx = pop()
            state = self.states[idx]
            self.lo[idx] = len(self.edges)
            for edge in successors(state):
                self.transitions += 1
                target = canonical(edge.target) if canonical else edge.target
                target_idx, fresh = self.add(target, idx, edge.action)
                if fresh:
                    frontier.append(target_idx)
                if not edge.fault:
                    self.edges.append(target_idx)
                for name, message in edge.violations:
                    if name not in self.violations:
                        trace = self.extend(self.trace_to(idx), edge.action, target)
                        self.violations[name] = Violation(name, message, trace)
                for mark in edge.marks:
                    if mark not in self.probe_hits:
                        trace = self.extend(self.trace_to(idx), edge.action, target)
                        self.probe_hits[mark] = trace
            self.hi[idx] = len(self.edges)

    def liveness(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if not self.goals:
            return out
        if self.violations:
            return {g.name: "skipped: a safety property failed" for g in self.goals}
        if not self.complete:
            return {g.name: "skipped: the search was cut short by max_states" for g in self.goals}
        n = len(self.states)
        # Reverse the recorded non-fault edges once (CSR layout), then walk back from goals.
        indeg = array("q", bytes(8 * (n + 1)))
        for target in self.edges:
            indeg[target + 1] += 1
        for i in range(n):
            indeg[i + 1] += indeg[i]
        rev = array("q", bytes(8 * len(self.edges)))
        fill = array("q", indeg[:n])
        for src in range(n):
            for k in range(self.lo[src], self.hi[src]):
                target = self.edges[k]
                rev[fill[target]] = src
                fill[target] += 1
        for goal, bits in zip(self.goals, self.goal_bits, strict=True):
            good = bytearray(bits)
            dist = array("l", (0 if b else -1 for b in bits))
            queue = deque(i for i in range(n) if good[i])
            while queue:
                node = queue.popleft()
                for k in range(indeg[node], indeg[node + 1]):
                    src = rev[k]
                    if not good[src]:
                        good[src] = 1
                        dist[src] = dist[node] + 1
                        queue.append(src)
            stuck = [i for i in range(n) if not good[i]]
            if not stuck:
                farthest = max(range(n), key=lambda i: (dist[i], -self.depth[i]), default=0)
                self.distances[goal.name] = dist[farthest] if n else 0
                if goal.within is not None and n and dist[farthest] > goal.within:
                    message = (
                        f"a reachable state needs {dist[farthest]} fault-free steps to reach "
                        f"'{goal.name}', more than {goal.within}; the trace ends in it"
                    )
                    self.violations[goal.name] = Violation(
                        goal.name, message, self.trace_to(farthest), stuck_states=1
                    )
                    out[goal.name] = goal.name
                    continue
                out[goal.name] = "ok"
                continue
            first = min(stuck, key=lambda i: (self.depth[i], i))
            message = (
                f"{len(stuck)} of {n} reachable states cannot reach '{goal.name}' without a "
                "fault; the trace ends in the first of them"
            )
            self.violations[goal.name] = Violation(
                goal.name, message, self.trace_to(first), stuck_states=len(stuck)
            )
            out[goal.name] = goal.name
        return out


def check(
    spec: Spec[S, A],
    *,
    strategy: str = "bfs",
    max_states: int | None = None,
    stop_at_first: bool = False,
    symmetry: bool = True,
) -> Result[S, A]:
    """Explore every state *spec* can reach and judge its properties.

    With *stop_at_first* the search ends after the step that broke the first property (its
    trace is still a shortest one under breadth-first search); otherwise it goes on and keeps
    the first violation of every property. With *symmetry*, states pass through the spec's
    ``canonical`` (if it has one) before they are hashed.
    """
    started = time.perf_counter()
    search = _Search(
        spec,
        strategy=strategy,
        max_states=max_states,
        stop_at_first=stop_at_first,
        symmetry=symmetry,
    )
    search.run()
    liveness = search.liveness()
    return Result(
        states=len(search.states),
        transitions=search.transitions,
        depth=max(search.depth, default=0),
        seconds=time.perf_counter() - started,
        complete=search.complete,
        strategy=strategy,
        invariants=(
            *(inv.name for inv in search.invariants),
            *search.transition_names,
        ),
        probes=tuple(p.name for p in search.probes),
        goals=tuple(g.name for g in search.goals),
        violations=tuple(search.violations.values()),
        probe_hits=search.probe_hits,
        liveness=liveness,
        distances=search.distances,
    )
