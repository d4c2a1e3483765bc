"""The worker's time ledger (ledger.py): one open interval, so the categories sum to the process's age."""

from __future__ import annotations

import pytest
from tests.support.local import manifest, run_local

from cohort.trainer.ledger import CATEGORIES, WINDOW, HealthyPace, TimeLedger


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_switch_relabel_and_step_split_every_second_once():
    clock = FakeClock()
    ledger = TimeLedger(clock=clock, wall=lambda: 1000.0 + clock.t)
    fresh = ledger.snapshot()
    assert "firstStep" not in fresh and "step" not in fresh and fresh["stepsRun"] == 0  # unset before a step
    clock.t += 3
    ledger.first_step_in_world(7)  # ends starting (restored step 6, say): not a step run
    clock.t += 1.0
    assert ledger.step(healthy_s=0.5, threshold=1.5, reached=8) == 1.0  # 2x the healthy pace: 0.5 s straggling
    clock.t += 0.6
    ledger.step(healthy_s=0.5, threshold=1.5, reached=9)  # 1.2x: within the threshold, all training
    clock.t += 2
    ledger.relabel("recovery")  # that step's collective failed
    ledger.switch("recovery")
    clock.t += 1
    previous = ledger.switch("checkpoint")
    clock.t += 0.5
    ledger.switch(previous)
    clock.t += 0.25
    snap = ledger.snapshot()
    assert snap["seconds"] == {"starting": 3.0, "training": 1.1, "checkpoint": 0.5, "recovery": 3.25,
                               "straggler": 0.5, "evaluation": 0.0, "finishing": 0.0}
    assert sum(snap["seconds"].values()) == pytest.approx(clock.t - 100.0)
    assert snap["current"] == "recovery" and snap["at"] == 1000.0 + clock.t
    with pytest.raises(ValueError, match="unknown ledger category"):
        ledger.switch("lunch")
    # The steps closed by step(), whose time is training's (and straggling's), with the step they reached.
    assert (snap["firstStep"], snap["step"], snap["stepsRun"]) == (7, 9, 2)
    ledger.first_step_in_world(5)  # a world that went back to a checkpoint in place: its process's first step stays
    ledger.step(healthy_s=None, threshold=1.5, reached=6)
    snap = ledger.snapshot()
    assert (snap["firstStep"], snap["step"], snap["stepsRun"]) == (7, 6, 3)


def test_healthy_pace_is_the_fastest_window_median_per_world_size():
    pace = HealthyPace()
    pace.new_world(2)
    for s in [0.1] * (WINDOW - 1):
        pace.add(s)
    assert pace.healthy() is None  # not a whole window yet
    pace.add(5.0)  # one outlier does not move a median
    assert pace.healthy() == pytest.approx(0.1)
    for _ in range(WINDOW):
        pace.add(0.4)  # a straggler for a whole window: the best median stays
    assert pace.healthy() == pytest.approx(0.1)
    pace.new_world(3)
    assert pace.healthy() is None
    pace.new_world(2)
    assert pace.healthy() == pytest.approx(0.1)


@pytest.mark.dist
def test_a_run_with_a_slowed_rank_accounts_straggling_evaluation_and_checkpoints(tmp_path):
    m = manifest("ledger", workload={"epochs": 0, "maxSteps": 240, "evalEverySteps": 80},
                 checkpoint={"everySteps": 60}, stragglers={"policy": "ignore", "threshold": 1.5})
    s = run_local(tmp_path, m, workers=2, ckpt=tmp_path / "ck", env={"COHORT_FAULT_SLOW": "rank=1,factor=6,step=120"})
    seconds = s["ledger"]["seconds"]
    assert set(seconds) == set(CATEGORIES)
    # Rank 0's process age, every second once: its totals add up to the time from its start to the reading.
    assert sum(seconds.values()) == pytest.approx(s["ledger"]["at"] - s["ledger"]["startedAt"], abs=0.01)
    for category in ("starting", "training", "checkpoint", "evaluation"):
        assert seconds[category] > 0, (category, seconds)
    # Half the steps ran beside a 6x slower rank: rank 0 waited for it in every allreduce.
    assert seconds["straggler"] > 0.5 * seconds["training"], seconds
    assert seconds["recovery"] == 0, seconds
    assert s["ledger"]["firstStep"] == 1, s["ledger"]  # its training counts from the first step's end
    assert s["ledger"]["stepsRun"] == 240 - 1, s["ledger"]  # every step but the first, one world throughout
    assert s["ledger"]["step"] == s["step"] == 240, s["ledger"]
    for log in (tmp_path / "run").glob("*.log"):  # the ledger's switch at a world's first step, and only there
        text = log.read_text()
        assert text.count('"first step in world"') == text.count('"joined world"') == 1, log.name


def test_during_gives_a_block_its_category_and_resumes_the_one_before():
    clock = FakeClock()
    ledger = TimeLedger(clock=clock)
    with pytest.raises(RuntimeError), ledger.during("evaluation"):
        clock.t += 2
        raise RuntimeError("a collective failed")
    clock.t += 1
    assert ledger.current == "starting"
    assert ledger.snapshot()["seconds"]["evaluation"] == 2.0 and ledger.snapshot()["seconds"]["starting"] == 1.0


def test_base_is_the_ledger_as_of_the_newest_mark_at_or_before_a_time():
    """``snapshot(base_at)`` (``/progress?ledgerAt=``): what a survivor become rank 0 had done by the operator's
    last reading of the old rank 0. Marks are taken as intervals close, at most one per MARK_EVERY_S."""
    clock = FakeClock()
    ledger = TimeLedger(clock=clock, wall=lambda: 1000.0 + clock.t)  # started at wall 1100
    assert "base" not in ledger.snapshot()
    assert "base" not in ledger.snapshot(base_at=1099.0)  # before the process started: nothing to say
    clock.t += 2
    ledger.first_step_in_world(1)  # wall 1102: a mark
    for reached in range(2, 12):   # ten steps of 0.4 s: marks at walls 1103.2, 1104.4, 1105.6
        clock.t += 0.4
        ledger.step(healthy_s=None, threshold=1.5, reached=reached)
    assert ledger.snapshot(base_at=1100.5)["base"] == {
        "at": 1100.0, "stepsRun": 0,
        "seconds": {"starting": 0.0, "training": 0.0, "checkpoint": 0.0, "recovery": 0.0, "straggler": 0.0,
                    "evaluation": 0.0, "finishing": 0.0}}
    base = ledger.snapshot(base_at=1104.0)["base"]  # the mark of wall 1103.2: 3 steps run
    assert (base["at"], base["step"], base["stepsRun"]) == (1103.2, 4, 3)
    assert base["seconds"]["starting"] == 2.0 and base["seconds"]["training"] == pytest.approx(1.2)
    now = ledger.snapshot(base_at=1e12)
    assert now["base"]["at"] == 1105.6 and now["base"]["stepsRun"] == 9  # the newest mark, not the open interval
    assert now["at"] == 1106.0 and now["stepsRun"] == 10
