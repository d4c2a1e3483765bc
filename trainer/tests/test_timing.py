"""StepClock: the loop's step-to-step time, warm-up and recovery gaps left out."""

from __future__ import annotations

import pytest

from cohort.trainer.timing import StepClock


def test_loop_time_is_end_to_end_and_excludes_warm_up_and_the_gap_of_a_new_world():
    clock = StepClock(warmup=2)
    ends = [0.0, 5.0, 6.0, 6.5, 7.0]  # steps 1-2 are warm-up; 5 s before step 2 is start-up
    for i, end in enumerate(ends):
        clock.record(wall=0.1 * (i + 1), end=end)
    clock.restart()  # a new world: the 100 s until the next step are recovery, not a step
    clock.record(wall=0.9, end=107.0)
    clock.record(wall=0.2, end=107.25)
    assert list(clock.loops) == [1.0, 0.5, 0.5, 0.25]   # 6.0-5.0, 6.5-6.0, 7.0-6.5, 107.25-107.0
    assert clock.loop_mean() == pytest.approx(0.5625)
    assert clock.step_median() == pytest.approx(0.4)      # walls of steps 3..7: 0.3 0.4 0.5 0.9 0.2


def test_memory_is_bounded():
    clock = StepClock(warmup=0, keep=8)
    for i in range(1000):
        clock.record(wall=1.0, end=float(i))
    assert len(clock.walls) == 8 and len(clock.loops) == 8


def test_the_running_median_equals_the_median_of_the_kept_walls():
    """step_median keeps a sorted copy (the collective timeout asks for it every step): equal to
    statistics.median over the newest ``keep`` walls, through evictions, repeats and both parities."""
    import random
    import statistics

    rng = random.Random(7)
    clock = StepClock(warmup=0, keep=16)
    for i in range(200):
        clock.record(rng.choice([0.1, 0.2, rng.random()]), end=float(i))
        assert clock.step_median() == statistics.median(clock.walls)


def test_the_rate_is_samples_over_time_not_an_average_of_per_step_rates():
    """Steps of 10 and 30 ms, 128 samples each: 128 / 20 ms = 6400 samples/s. The mean of the per-step
    rates (12800 and 4267) is 8533: an ETA from it would be 25 % short."""
    clock = StepClock()
    end = 0.0
    clock.record(0.0, end, samples=128)
    assert clock.samples_per_second() is None  # one step end: no interval yet
    for i in range(400):
        end += 0.010 if i % 2 else 0.030
        clock.record(0.0, end, samples=128)
    assert clock.samples_per_second() == pytest.approx(6400, rel=0.01)


def test_the_rate_follows_a_change_within_its_horizon():
    clock = StepClock(rate_horizon_s=30)
    end = 0.0
    clock.record(0.0, end, samples=100)
    for _ in range(600):  # 60 s at 1000 samples/s
        end += 0.1
        clock.record(0.0, end, samples=100)
    for _ in range(300):  # then 60 s at 500
        end += 0.2
        clock.record(0.0, end, samples=100)
    assert clock.samples_per_second() == pytest.approx(500, rel=0.15)


def test_a_new_worlds_gap_is_not_progress():
    clock = StepClock()
    for end in (0.0, 0.1, 0.2):
        clock.record(0.0, end, samples=64)
    clock.restart()
    clock.record(0.0, 30.0, samples=64)  # the first step after 30 s of recovery
    assert clock.samples_per_second() == pytest.approx(640)
