"""LogTimeline: how long ago the master's log went past a slave's ack."""

from __future__ import annotations

import pytest

from trioha.net._timeline import LogTimeline


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_seconds_behind_is_the_age_of_the_first_byte_past_the_ack() -> None:
    clock = Clock()
    timeline = LogTimeline(1000, clock=clock)  # the log ended at 1000 at start-up (t=100)
    clock.now = 101.0
    timeline.grew(2000)
    clock.now = 103.0
    timeline.grew(3000)
    clock.now = 110.0
    assert timeline.seconds_behind(3000, 3000) == 0
    assert timeline.seconds_behind(2500, 3000) == 7.0  # bytes past 2500 arrived at t=103
    assert timeline.seconds_behind(2000, 3000) == 7.0
    assert timeline.seconds_behind(1999, 3000) == 9.0  # past 1999: t=101
    assert timeline.seconds_behind(500, 3000) == 10.0  # older than start-up: at least this


def test_growth_within_the_resolution_is_one_sample_and_the_ring_stays_bounded() -> None:
    clock = Clock()
    timeline = LogTimeline(0, capacity=8, resolution=0.5, clock=clock)
    clock.now += 1
    timeline.grew(10)
    clock.now += 0.1
    timeline.grew(20)  # same instant as 10, as far as we measure
    clock.now += 1
    assert timeline.seconds_behind(15, 20) == pytest.approx(1.1)
    for i in range(1000):
        clock.now += 1
        timeline.grew(100 + i)
    assert len(timeline) <= 8
    clock.now += 1
    # Exact for the newest; for old offsets off by at most the spacing of what is kept.
    assert timeline.seconds_behind(1098, 1099) == pytest.approx(1.0)
    truth = clock.now - (102.1 + (150 - 100) + 1)  # 150 was reached on the 51st growth
    found = timeline.seconds_behind(150, 1099)
    assert abs(found - truth) <= 1001 / 2
    assert timeline.seconds_behind(5, 1099) == pytest.approx(clock.now - 101)


def test_what_every_slave_acked_is_forgotten() -> None:
    clock = Clock()
    timeline = LogTimeline(0, clock=clock)
    for end in range(10, 110, 10):
        clock.now += 1
        timeline.grew(end)
    assert len(timeline) == 11
    timeline.acked(55)
    assert len(timeline) == 6  # 50 (the anchor), 60, 70, 80, 90, 100
    assert timeline.seconds_behind(55, 100) == clock.now - 106


def test_a_timeline_needs_room_for_three_samples_and_stays_within_them() -> None:
    for capacity in (1, 2):  # with 2, merging pairs after the start-up sample frees nothing
        with pytest.raises(ValueError, match="a timeline needs room for at least 3 samples"):
            LogTimeline(0, capacity=capacity)
    clock = Clock()
    timeline = LogTimeline(0, capacity=3, clock=clock)
    for end in (10, 20, 30, 40, 50):
        clock.now += 1
        timeline.grew(end)
        assert len(timeline) <= 3
    clock.now += 1
    assert timeline.seconds_behind(45, 50) == 1.0  # the newest sample is exact
    assert timeline.seconds_behind(0, 50) == 5.0  # older ones merged, at their earlier time
