"""Fault injection fires once, in the process that holds the rank when the step is first reached."""

from __future__ import annotations

import pytest

from cohort.trainer.faults import Faults


def test_slow_fires_only_when_crossing_the_step():
    f = Faults.from_env({"COHORT_FAULT_SLOW": "rank=1,factor=4,step=10"})
    for step in range(0, 10):
        f.before_step(rank=2, step=step)
    f.before_step(rank=2, step=10)     # crosses step 10 holding rank 2: not the target
    f.before_step(rank=1, step=11)     # later holds rank 1: too late, the fault is for step 10
    assert not f.slowed
    g = Faults.from_env({"COHORT_FAULT_SLOW": "rank=1,factor=4,step=10"})
    for step in range(0, 11):
        g.before_step(rank=1, step=step)
    assert g.slowed


def test_newcomer_and_replay_do_not_fire(monkeypatch):
    """The kill is recorded, not performed: a regression fails this test instead of killing pytest."""
    kills = []
    monkeypatch.setattr("cohort.trainer.faults.die", lambda: kills.append("SIGKILL"))
    newcomer = Faults.from_env({"COHORT_FAULT_SLOW": "rank=1,step=10"})
    newcomer.before_step(rank=1, step=10)  # its first step is 10: it was not training before
    assert not newcomer.slowed
    survivor = Faults.from_env({"COHORT_FAULT_KILL": "rank=2,step=5"})
    for step in range(0, 5):
        survivor.before_step(rank=3, step=step)
    survivor.before_step(rank=3, step=5)   # reached step 5 holding rank 3
    survivor.before_step(rank=2, step=5)   # the replay after a kill, now as rank 2: must not die
    assert survivor.max_seen == 5 and kills == []
    target = Faults.from_env({"COHORT_FAULT_KILL": "rank=2,step=5"})
    for step in range(0, 7):
        target.before_step(rank=2, step=step)
    assert kills == ["SIGKILL"]  # the control: the process that crosses step 5 as rank 2 dies, once


def test_oom_fault_parses_and_fires_once_at_its_step(monkeypatch):
    fired = []
    monkeypatch.setattr("cohort.trainer.faults.exhaust_memory", lambda mb: fired.append(mb))
    f = Faults.from_env({"COHORT_FAULT_OOM": "rank=1,step=5,mb=256"})
    assert (f.oom_rank, f.oom_step, f.oom_mb) == (1, 5, 256)
    for step in range(3, 8):
        f.before_step(rank=1, step=step)
    f.before_step(rank=1, step=5)  # replayed in a new world: no second time
    assert fired == [256]
    other = Faults.from_env({"COHORT_FAULT_OOM": "rank=1,step=5"})
    for step in range(3, 8):
        other.before_step(rank=0, step=step)


def test_freeze_parses_and_fires_once_at_its_step_in_its_rank(monkeypatch):
    frozen = []
    monkeypatch.setattr("cohort.trainer.faults.freeze", lambda: frozen.append("SIGSTOP"))
    f = Faults.from_env({"COHORT_FAULT_FREEZE": "rank=0,step=4"})
    for step in range(2, 7):
        f.before_step(rank=0, step=step)
    f.before_step(rank=0, step=4)  # replayed in a new world: no second time
    other = Faults.from_env({"COHORT_FAULT_FREEZE": "rank=0,step=4"})
    for step in range(2, 7):
        other.before_step(rank=1, step=step)
    assert (f.freeze_rank, f.freeze_step, frozen) == (0, 4, ["SIGSTOP"])


def test_rank_all_kills_every_rank_at_its_step(monkeypatch):
    kills = []
    monkeypatch.setattr("cohort.trainer.faults.die", lambda: kills.append("SIGKILL"))
    for rank in range(3):
        f = Faults.from_env({"COHORT_FAULT_KILL": "rank=all,step=4"})
        for step in range(0, 4):
            f.before_step(rank=rank, step=step)
        assert len(kills) == rank  # not before step 4
        f.before_step(rank=rank, step=4)
        assert len(kills) == rank + 1
    with pytest.raises(ValueError):
        Faults.from_env({"COHORT_FAULT_KILL": "rank=some,step=4"})
