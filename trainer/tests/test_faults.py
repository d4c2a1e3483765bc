"""Fault injection fires once, in the process that holds the rank when the step is first reached."""

from __future__ import annotations

import pytest

from cohort.trainer.faults import Fault, Faults


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
    assert f.oom == Fault(1, 5, 256)
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
    assert (f.freeze, frozen) == (Fault(0, 4), ["SIGSTOP"])


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


@pytest.mark.parametrize("name,value,says", [
    ("COHORT_FAULT_KILL", "rank=1,setp=30", "COHORT_FAULT_KILL: expected rank=R,step=S, got"),
    ("COHORT_FAULT_HANG", "rank=1,step=30,secs=5", "COHORT_FAULT_HANG: expected rank=R,step=S,seconds=A"),
    ("COHORT_FAULT_PAUSE", "step=30", "COHORT_FAULT_PAUSE: rank=R is required"),
])
def test_a_mistyped_fault_is_refused_naming_its_variable(name, value, says):
    """A misspelt key was ignored: ``setp=30`` killed at step 0, ``secs=5`` hung for the default 30 s."""
    with pytest.raises(ValueError, match=says):
        Faults.from_env({name: value})


def test_each_fault_takes_its_amount_or_its_default():
    f = Faults.from_env({"COHORT_FAULT_SLOW": "rank=all,step=1", "COHORT_FAULT_HANG": "rank=1,step=3,seconds=7",
                         "COHORT_FAULT_PAUSE": "rank=2,step=4", "COHORT_FAULT_OOM": "rank=0,step=2"})
    assert (f.slow, f.hang, f.pause, f.oom) == (Fault(-2, 1, 2.0), Fault(1, 3, 7.0), Fault(2, 4, 10.0),
                                                Fault(0, 2, 4096.0))
    assert f.kill == f.freeze == f.partial == Fault()
