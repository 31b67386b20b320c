"""Three brokers' control cores against the in-memory etcd, driven by Hypothesis.

The machine walks the failover world of ``model/`` (the production core, the double's pure
etcd, ``InSyncQuorum`` and the AutoSwitch handshake), but where the exhaustive checker must
keep the world small, Hypothesis takes long random runs through a bigger one: three brokers,
more puts, ticks of 500 ms against a 2 s lease (so deadlines fall between ticks), keepalive
replies that travel like any message, and generous fault budgets: power cuts, pauses past the
deadline, cuts from etcd, broken links, lost and duplicated requests, stuck watches.

After every step: every state invariant of the model (one acknowledging master per epoch, no
acknowledged write lost, the set a superset of etcd's, prefixes, no divergence, epochs), every
transition invariant the step reported, and that etcd took no SyncStateSet change from a
broker that was not master (``SSSChangeFenced``). At the end of a run: once every fault is
healed, some master can acknowledge again within a bounded number of fault-free steps.
"""

from __future__ import annotations

from typing import ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from model._failover_properties import STATE_INVARIANTS, master_can_ack
from model._failover_steps import FAULTS, FailoverModel, FKind, FStep
from model._failover_values import FailoverConfig, FailoverFaults, FailoverWorld

CONFIG = FailoverConfig(
    name="hypothesis-three",
    doc="",
    brokers=3,
    messages=4,
    initial_sss=(1, 2, 3),
    tick=500,
    keepalive_replies_travel=True,
    faults=FailoverFaults(
        crashes=3, pauses=3, cuts=3, links=2, losses=3, duplicates=2, stale_watches=2
    ),
)

#: Fault-free steps a healed group may need before a master can acknowledge again.
RECOVERY_STEPS = 400

#: What ``settle`` delivers, in this order of preference.
_SETTLE = {
    FKind.ETCD: 0,
    FKind.REPLY: 0,
    FKind.WATCH: 0,
    FKind.CONNECT: 1,
    FKind.REPLICATE: 1,
    FKind.ACK: 1,
    FKind.FLUSH: 1,
}

#: Recovery steps first, then delivery, then time: a schedule that converges.
_RECOVERY_ORDER = {
    FKind.HEAL: 0,
    FKind.RESTART: 0,
    FKind.RESUME: 0,
    FKind.ETCD: 1,
    FKind.REPLY: 1,
    FKind.WATCH: 1,
    FKind.TIMEOUT: 2,
    FKind.CONNECT: 2,
    FKind.REPLICATE: 2,
    FKind.ACK: 2,
    FKind.FLUSH: 2,
    FKind.TICK: 3,
}


class FailoverMachine(RuleBasedStateMachine):
    """One group, stepped by Hypothesis through every kind of step the model has."""

    config: ClassVar[FailoverConfig] = CONFIG

    def __init__(self) -> None:
        super().__init__()
        self.model = FailoverModel(self.config)
        self.world: FailoverWorld = self.model.initial()
        self.violations: list[tuple[str, str]] = []
        self.trail: list[str] = []

    def _apply(self, step: FStep, *, enabled: bool = False) -> bool:
        """Take *step* (known to be enabled, or checked here); False if it is not."""
        apply = self.model._apply if enabled else self.model.apply
        out = apply(self.world, step)
        if out is None:
            return False
        self.trail.append(str(step))
        self.violations.extend(out.violations)
        if "failover_sss_written_by_non_master" in out.marks:
            self.violations.append(
                ("SSSChangeFenced", "etcd took a SyncStateSet change from a broker not master")
            )
        self.world = out.world
        return True

    def _enabled(self, *, faults: bool) -> list[FStep]:
        return [s for s in self.model.steps(self.world) if s.fault == faults]

    def _progress(self, step: FStep) -> bool:
        """Take *step* (an enabled one) if it changes the world."""
        before = self.world
        return self._apply(step, enabled=True) and self.world != before

    def _kinds(self, *kinds: FKind) -> list[FStep]:
        return [s for s in self.model.steps(self.world) if s.kind in kinds]

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """Any one thing that can happen without a fault, in any order."""
        enabled = self._enabled(faults=False)
        if enabled:
            self._apply(data.draw(st.sampled_from(enabled), label="step"), enabled=True)

    @rule(data_plane_first=st.booleans())
    def settle(self, data_plane_first: bool = False) -> None:
        """The network is fast: everything deliverable arrives, slaves catch up; either
        etcd's traffic or the data plane's goes first."""
        flip = 1 if data_plane_first else 0
        for _ in range(200):
            candidates = self._kinds(*_SETTLE)
            candidates.sort(key=lambda s: _SETTLE[s.kind] ^ flip)
            if not any(self._progress(c) for c in candidates):
                return

    @rule(ticks=st.integers(1, 6), data_plane_first=st.booleans())
    def time_passes(self, ticks: int, data_plane_first: bool) -> None:
        """Everything in flight arrives, then a tick; *ticks* times (a lease lasts four)."""
        for _ in range(ticks):
            self.settle(data_plane_first)
            self._apply(FStep(FKind.TICK))

    @rule(data=st.data())
    def put(self, data: st.DataObject) -> None:
        puts = self._kinds(FKind.PUT)
        if puts:
            self._apply(data.draw(st.sampled_from(puts), label="put"), enabled=True)

    @precondition(lambda self: any(s.fault for s in self.model.steps(self.world)))
    @rule(data=st.data())
    def fault(self, data: st.DataObject) -> None:
        enabled = self._enabled(faults=True)
        self._apply(data.draw(st.sampled_from(enabled), label="fault"), enabled=True)

    @rule(data=st.data())
    def recover(self, data: st.DataObject) -> None:
        """A paused broker resumes, a crashed one restarts, or the network heals."""
        enabled = self._kinds(FKind.HEAL, FKind.RESTART, FKind.RESUME, FKind.TIMEOUT)
        if enabled:
            self._apply(data.draw(st.sampled_from(enabled), label="recover"), enabled=True)

    @invariant()
    def properties_hold(self) -> None:
        assert not self.violations, self._report(self.violations[0])
        for inv in STATE_INVARIANTS:
            message = inv.check(self.world)
            assert message is None, self._report((inv.name, message))

    def _report(self, violation: tuple[str, str]) -> str:
        name, message = violation
        return f"{name}: {message}\n" + "\n".join(self.trail[-40:])

    def teardown(self) -> None:
        """Heal everything, then let the group run without faults: a master must be able to
        acknowledge again, soon."""
        for _ in range(RECOVERY_STEPS):
            if master_can_ack(self.world, self.config):
                return
            candidates = sorted(
                (s for s in self._enabled(faults=False) if s.kind in _RECOVERY_ORDER),
                key=lambda s: _RECOVERY_ORDER[s.kind],
            )
            if not any(self._progress(c) for c in candidates):
                break
            assert not self.violations, self._report(self.violations[0])
        assert master_can_ack(self.world, self.config), (
            "no master can acknowledge after the faults healed\n" + "\n".join(self.trail[-60:])
        )


TestFailoverMachine = FailoverMachine.TestCase


def test_the_machine_runs_the_faults_it_names() -> None:
    assert {FKind.CRASH, FKind.PAUSE, FKind.CUT, FKind.CUT_LINK, FKind.LOSE} <= FAULTS
    assert CONFIG.faults.total() > 0


@pytest.mark.parametrize("kind", [FKind.CRASH, FKind.PAUSE, FKind.CUT])
def test_every_fault_can_strike_the_master(kind: FKind) -> None:
    """The machine's world lets each fault hit broker 1, the master, from the start."""
    model = FailoverModel(CONFIG)
    assert FStep(kind, 0) in set(model.steps(model.initial()))
