"""Backoff, phases and conditions."""

from __future__ import annotations

import datetime as dt

from cohort.operator.lifecycle import (
    backoff_seconds,
    effective_target,
    fmt_time,
    get_condition,
    next_phase,
    parse_time,
    phase_conditions,
    set_condition,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def test_backoff_doubles_and_caps():
    assert [backoff_seconds(n, 10, 300) for n in range(0, 7)] == [0, 10, 20, 40, 80, 160, 300]
    assert backoff_seconds(10_000, 10, 300) == 300
    assert backoff_seconds(3, 0, 300) == 0


def test_phases():
    assert next_phase("Pending", world_size=1, minimum=2, target=4, lost_member=False) == "Pending"
    assert next_phase("Pending", world_size=2, minimum=2, target=4, lost_member=False) == "Running"
    assert next_phase("Running", world_size=3, minimum=2, target=4, lost_member=True) == "Recovering"
    assert next_phase("Recovering", world_size=3, minimum=2, target=4, lost_member=False) == "Recovering"
    assert next_phase("Recovering", world_size=4, minimum=2, target=4, lost_member=False) == "Running"
    assert next_phase("Running", world_size=0, minimum=2, target=4, lost_member=True) == "Recovering"
    assert next_phase("Running", world_size=3, minimum=2, target=4, lost_member=False) == "Running"  # scale-up
    assert effective_target(7, 2) == 6


def test_ready_says_why_no_workers_are_wanted_once_a_job_has_ended_or_is_suspended():
    def ready(phase: str, world_size: int):
        conds = phase_conditions([], phase=phase, world_size=world_size, target=4, minimum=2, final_reason="R",
                                 final_message="m", generation=1, now=T0)
        c = get_condition(conds, "Ready")
        return c.status, c.reason, c.message

    assert ready("Running", 4) == ("True", "AllWorkersReady", "4/4 workers in the world")
    assert ready("Recovering", 3) == ("False", "WorkersNotReady", "3/4 workers in the world")
    assert ready("Pending", 0) == ("False", "WorkersNotReady", "0/4 workers in the world")
    for phase in ("Succeeded", "Failed", "Suspended"):
        assert ready(phase, 0) == ("False", phase, f"job is {phase}")


def test_condition_transition_time_moves_only_on_status_change():
    conds = set_condition([], "Ready", False, "A", "m", generation=1, now=T0)
    later = T0 + dt.timedelta(minutes=1)
    conds = set_condition(conds, "Ready", False, "B", "m2", generation=2, now=later)
    c = get_condition(conds, "Ready")
    assert c.last_transition_time == fmt_time(T0) and c.reason == "B" and c.observed_generation == 2
    conds = set_condition(conds, "Ready", True, "C", "", generation=2, now=later)
    assert get_condition(conds, "Ready").last_transition_time == fmt_time(later)
    assert len(conds) == 1


def test_time_round_trip():
    assert parse_time(fmt_time(T0)) == T0
    assert parse_time("") is None and parse_time("garbage") is None
