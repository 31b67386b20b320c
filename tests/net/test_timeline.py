"""LogTimeline: how long ago the master's log went past a slave's ack."""

from __future__ import annotations

import time

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
        with pytest.raises(ValueError, match=r"^a timeline needs room for at least 3 samples$"):
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


def test_by_default_the_service_samples_every_10_ms_in_a_ring_of_1024_on_the_monotonic_clock() -> (
    None
):
    clock = Clock()
    timeline = LogTimeline(0, clock=clock)
    clock.now = 101.0
    timeline.grew(10)
    clock.now = 101.0 + 0.0078125  # within 10 ms: the same sample
    timeline.grew(20)
    assert len(timeline) == 2
    clock.now = 101.0 + 0.015625  # 10 ms later or more: a new one
    timeline.grew(30)
    assert len(timeline) == 3
    for end in range(31, 31 + 1021):
        clock.now += 1
        timeline.grew(end)
    assert len(timeline) == 1024  # full, not merged yet
    clock.now += 1
    timeline.grew(5000)
    assert len(timeline) == 514  # 1 + 512 merged pairwise, then the new sample
    before = time.monotonic()
    real = LogTimeline(0)
    real.grew(1)
    assert 0.0 <= real.seconds_behind(0, 1) <= time.monotonic() - before


def test_a_growth_exactly_one_resolution_later_is_a_new_sample() -> None:
    clock = Clock()
    timeline = LogTimeline(0, resolution=0.5, clock=clock)
    clock.now = 101.0
    timeline.grew(10)
    clock.now = 101.5
    timeline.grew(20)
    assert len(timeline) == 3
    clock.now = 102.0
    assert timeline.seconds_behind(10, 20) == 0.5
    assert timeline.seconds_behind(9, 20) == 1.0


def test_the_start_up_sample_is_never_moved_even_within_the_resolution() -> None:
    clock = Clock()
    timeline = LogTimeline(100, resolution=10.0, clock=clock)  # 100 ended at t=100
    clock.now = 101.0
    timeline.grew(200)
    assert len(timeline) == 2
    clock.now = 102.0
    timeline.grew(300)  # within 10 s of 200's sample: 200's sample now reaches 300
    assert len(timeline) == 2
    clock.now = 110.0
    assert timeline.seconds_behind(99, 300) == 10.0  # bytes before 100: as old as start-up
    assert timeline.seconds_behind(100, 300) == 9.0  # past 100: first seen at t=101
    assert timeline.seconds_behind(250, 300) == 9.0


def test_an_end_that_did_not_move_is_not_a_sample() -> None:
    clock = Clock()
    timeline = LogTimeline(0, clock=clock)
    clock.now = 101.0
    timeline.grew(10)
    clock.now = 105.0
    timeline.grew(10)
    timeline.grew(5)  # an end below the last one (never happens; ignored)
    assert len(timeline) == 2
    clock.now = 110.0
    assert timeline.seconds_behind(10, 20) == 9.0  # past the last sample: the newest time
    assert timeline.seconds_behind(9, 10) == 9.0


@pytest.mark.parametrize("capacity", [4, 5])
def test_a_full_ring_merges_pairs_into_the_later_offset_at_the_earlier_time(capacity: int) -> None:
    clock = Clock()
    timeline = LogTimeline(0, capacity=capacity, clock=clock)
    # Sample i (1..capacity-1) is offset 10*i at time 100+i.
    for i in range(1, capacity):
        clock.now = 100.0 + i
        timeline.grew(10 * i)
    assert len(timeline) == capacity
    clock.now = 100.0 + capacity
    timeline.grew(10 * capacity)  # full: merge, then add
    clock.now = 200.0
    # Pairs (10, 20) and (30, 40) become offsets 20 and 40 at times 101 and 103; with 4
    # samples the odd last one (30 at 103) stays as it was. Then the new sample.
    expected = {
        4: [(0, 99), (15, 99), (20, 97), (25, 97), (30, 96), (35, 96)],
        5: [(0, 99), (15, 99), (20, 97), (35, 97), (40, 95), (45, 95)],
    }
    for acked, behind in expected[capacity]:
        assert timeline.seconds_behind(acked, 10 * capacity) == behind, acked
    assert len(timeline) == 4


def test_growth_within_the_resolution_moves_the_newest_sample_only() -> None:
    clock = Clock()
    timeline = LogTimeline(0, resolution=0.5, clock=clock)
    for t, end in ((101.0, 10), (102.0, 20), (102.25, 30)):  # 30: the same instant as 20
        clock.now = t
        timeline.grew(end)
    assert len(timeline) == 3
    clock.now = 110.0
    assert timeline.seconds_behind(25, 30) == 8.0  # past 25: the sample of t=102
    assert timeline.seconds_behind(10, 30) == 8.0
    assert timeline.seconds_behind(9, 30) == 9.0


def test_acks_below_the_start_up_end_keep_the_start_up_time_through_merges() -> None:
    clock = Clock()
    timeline = LogTimeline(5, capacity=4, clock=clock)  # the log ended at 5 at t=100
    for i in range(1, 6):
        clock.now = 100.0 + i
        timeline.grew(10 * i)
    clock.now = 200.0
    assert timeline.seconds_behind(0, 50) == 100.0  # older than start-up: at least this old


def test_an_ack_past_the_second_sample_drops_the_first() -> None:
    clock = Clock()
    timeline = LogTimeline(0, clock=clock)
    for end in (10, 20, 30):
        clock.now += 1
        timeline.grew(end)
    timeline.acked(9)  # below the second sample: nothing to drop
    assert len(timeline) == 4
    timeline.acked(15)  # 10 is the anchor now; 0 goes
    assert len(timeline) == 3
    assert timeline.seconds_behind(15, 30) == clock.now - 102
