"""The operator's time ledger (decide/goodput.py): every second from creation to the final phase, once."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json

import pytest
from tests.support.specs import WORKLOAD

from cohort.api.models import TrainingJobSpec, TrainingJobStatus
from cohort.api.schema import parse
from cohort.operator.decide import Decision, Inputs
from cohort.operator.decide.goodput import account
from cohort.operator.observe import PodView
from cohort.operator.world import Member, World

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
SPEC = parse(TrainingJobSpec, {"workload": dict(WORKLOAD), "replicas": {"min": 1, "max": 2, "target": 1}})
WORLD = World(version=1, members=(Member("j-worker-0", "u0", "10.0.0.1"),))


def ledger(started: float, at: float, pod: str = "j-worker-0", first: int | None = None, ran: int | None = None,
           step: int | None = None, **seconds: float) -> dict:
    doc = {"pod": pod, "startedAt": T0.timestamp() + started, "at": T0.timestamp() + at, "seconds": seconds}
    for key, value in (("firstStep", first), ("stepsRun", ran), ("step", step)):
        if value is not None:
            doc[key] = value
    return doc


class Job:
    """One job's status carried from reconcile to reconcile, as the reconciler does."""

    def __init__(self) -> None:
        self.status = TrainingJobStatus()

    def reconcile(self, t: float, after: str, progress: dict | None = None, summary: dict | None = None) -> None:
        pods = [PodView(name="j-worker-0", uid="u0", index=0, ip="10.0.0.1", node="n", phase="Succeeded",
                        ready=False, message=json.dumps(summary))] if summary else []
        observed = Inputs(job={"metadata": {"name": "j", "creationTimestamp": "2026-01-01T12:00:00Z"}}, spec=SPEC,
                          status=self.status, world=WORLD, pods=pods, now=T0 + dt.timedelta(seconds=t),
                          progress=progress)
        decision = Decision(status=copy.deepcopy(self.status))
        decision.status.phase = after
        account(observed, decision)
        self.status = decision.status

    @property
    def seconds(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in dataclasses.asdict(self.status.goodput.seconds).items() if v}


def test_a_life_with_a_queue_a_restart_from_checkpoint_and_a_finish_sums_to_its_wall_time():
    job = Job()
    job.reconcile(1, "Suspended")                      # the first reconcile: waiting in a queue
    job.reconcile(11, "Pending")                       # admitted after 11 s in all
    job.reconcile(14, "Running")                       # pods Ready
    job.reconcile(15, "Running")                       # nothing read yet: nothing accounted
    assert job.status.goodput.accounted_until.startswith("2026-01-01T12:00:14")
    # The trainer (started at 12 s) first answers at 16 s: 14..16 was starting.
    job.reconcile(16, "Running", {"step": 0, "ledger": ledger(12, 16, starting=4)})
    job.reconcile(26, "Running", {"step": 100, "ledger": ledger(12, 26, starting=5, training=8, checkpoint=1)})
    job.reconcile(36, "Running", {"step": 200, "ledger": ledger(12, 36, starting=5, training=15, checkpoint=1,
                                                                straggler=3)})
    # Every worker killed at step 200; the job re-forms from the checkpoint of step 100.
    job.reconcile(38, "Recovering")
    job.reconcile(40, "Running")
    job.reconcile(45, "Running", {"step": 100, "ledger": ledger(41, 45, starting=4)})
    # 100 -> 250 in 10 s of training: 100 -> 200 was done before (lost work), 200 -> 250 was not.
    job.reconcile(55, "Running", {"step": 250, "ledger": ledger(41, 55, starting=4, training=9, evaluation=1)})
    # The summary's ledger is the last reading; from it to the final phase is finishing.
    job.reconcile(60, "Succeeded", {"step": 250, "ledger": ledger(41, 55, starting=4, training=9, evaluation=1)},
                  summary={"step": 250, "ledger": ledger(41, 58, starting=4, training=9, evaluation=1, finishing=2,
                                                        checkpoint=1)})
    g = job.status.goodput
    assert job.seconds == {"queued": 11.0, "starting": 3 + 2 + 1, "training": 8 + 7 + 3, "checkpoint": 2.0,
                           "recovery": 9.0, "lost_work": 6.0, "straggler": 3.0, "evaluation": 1.0,
                           "finishing": 2 + 2}
    assert sum(job.seconds.values()) == pytest.approx(60) and g.wall_seconds == 60
    assert g.percent == round(100 * 18 / 60, 1) and g.high_water_step == 250
    job.reconcile(90, "Succeeded")  # closed: a finished job's ledger does not grow
    assert job.status.goodput.wall_seconds == 60


def test_a_reading_seen_again_or_older_adds_nothing_and_a_new_process_is_recovery_once_steps_were_reported():
    job = Job()
    job.reconcile(2, "Running", {"step": 5, "ledger": ledger(0, 2, starting=2)})
    job.reconcile(4, "Running", {"step": 9, "ledger": ledger(0, 4, starting=2, training=2)})
    before = copy.deepcopy(job.status.goodput)
    job.reconcile(6, "Running", {"step": 9, "ledger": ledger(0, 4, starting=2, training=2)})
    job.reconcile(7, "Running", {"step": 9, "ledger": ledger(0, 3, starting=2, training=1)})
    assert job.status.goodput == before
    job.reconcile(9, "Running", {"step": 9, "ledger": ledger(7, 9, pod="j-worker-3", starting=2)})
    assert job.seconds == {"starting": 2.0, "training": 2.0, "recovery": 5.0}


def test_readings_are_scaled_to_the_interval_they_account_for():
    job = Job()
    job.reconcile(2, "Running", {"step": 0, "ledger": ledger(0, 2, starting=2)})
    # The trainer's clock says 4 s went by (3 training, 1 checkpoint) where the readings say 2 s.
    job.reconcile(4, "Running", {"step": 10, "ledger": ledger(0, 4, starting=2, training=3, checkpoint=1)})
    assert job.seconds == {"starting": 2.0, "training": 1.5, "checkpoint": 0.5}


def test_idle_phases_are_accounted_every_few_seconds_and_at_each_change():
    job = Job()
    job.reconcile(3, "Pending")
    assert job.seconds == {}  # less than MIN_INTERVAL_S, and no change
    job.reconcile(6, "Pending")
    job.reconcile(7, "Pending")
    assert job.seconds == {"starting": 6.0}
    job.reconcile(10, "Suspended")  # a user suspends it: the Pending seconds before are starting
    job.reconcile(20, "Suspended")
    assert job.seconds == {"starting": 10.0, "queued": 10.0}


def test_a_job_whose_rank_0_never_answered_never_got_past_starting():
    job = Job()
    job.reconcile(5, "Running")
    job.reconcile(30, "Running")  # a kwok pod, or probes blocked: no reading
    job.reconcile(40, "Failed")
    assert job.seconds == {"starting": 40.0} and job.status.goodput.percent == 0.0


def test_a_job_read_only_once_its_trainer_finished_counts_the_training_its_ledger_holds():
    """A short job: rank 0 finished before any /progress was read, so its termination summary is the first
    and only reading. Up to the process's start the pod was starting; from there its own ledger says it
    (the quickstart's digits job read 0 % goodput when the whole interval was counted as starting)."""
    job = Job()
    job.reconcile(3, "Pending")
    job.reconcile(6, "Running")  # no reading yet: nothing accounted while it runs
    summary = {"step": 330, "ledger": ledger(7, 15, first=1, starting=5, training=2, checkpoint=0.1, evaluation=0.5,
                                             finishing=0.4)}
    job.reconcile(16, "Succeeded", summary=summary)
    assert job.seconds == {"starting": 6 + 1 + 5, "training": 2.0, "checkpoint": 0.1, "evaluation": 0.5,
                           "finishing": 0.4 + 1}
    assert sum(job.seconds.values()) == pytest.approx(16) and job.status.goodput.percent == 12.5
    assert job.status.goodput.high_water_step == 330 and job.status.goodput.last_reading.first_step == 1


@pytest.mark.parametrize("ran", [None, 250 - 101], ids=["step-counts", "stepsRun"])
def test_a_replacements_first_reading_splits_its_training_into_lost_work_and_new_steps_from_its_first_step(ran):
    """By the step counts (older trainers) or by the steps run (all but the world's first): the same split."""
    job = Job()
    job.reconcile(2, "Running", {"step": 0, "ledger": ledger(0, 2, starting=2)})
    job.reconcile(12, "Running", {"step": 200, "ledger": ledger(0, 12, first=1, starting=2, training=10)})
    job.reconcile(14, "Recovering")  # every worker lost at step 200; the newest checkpoint is step 100
    # The new rank 0 started at 16, restored step 100, and its first step (101) ended its starting; read first
    # at 36: steps 101 -> 250 in 15 s of training, of which 101 -> 200 computed again. Its own starting is
    # the job's recovery.
    job.reconcile(36, "Running", {"step": 250, "ledger": ledger(16, 36, pod="j-worker-4", first=101, ran=ran,
                                                                 starting=4, training=15, evaluation=1)})
    lost = 15 * (200 - 101) / (250 - 101)
    assert job.seconds == {"starting": 2.0, "training": round(10 + 15 - lost, 3), "lost_work": round(lost, 3),
                           "recovery": 4 + 4, "evaluation": 1.0}
    assert sum(job.seconds.values()) == pytest.approx(36)


def test_a_pending_phase_accounted_while_the_trainer_already_trained_is_taken_back_from_starting():
    """The pods are not Ready while the trainer sets up and trains its first steps, and the operator accounts
    that Pending phase every few seconds, as starting, past the process's start (4 s) and past the end of its
    starting (10 s). The first reading takes that overlap back, and the process's whole life is what its
    ledger says: seen on the real nodes, a job's 1.66 s of training came out as 1.55 s when the ledger was
    squeezed into the interval after the cursor."""
    job = Job()
    job.reconcile(6, "Pending")
    job.reconcile(12, "Pending")
    job.reconcile(14, "Running")  # starting 0..14 accounted; the trainer trained from 10 s on
    job.reconcile(20, "Running", {"step": 50, "ledger": ledger(4, 20, first=1, starting=6, training=9, evaluation=1)})
    assert job.seconds == {"starting": 4 + 6, "training": 9.0, "evaluation": 1.0}
    assert sum(job.seconds.values()) == pytest.approx(20)


def test_a_survivor_become_rank_0_is_counted_from_its_ledger_as_of_the_last_reading():
    """Rank 0 is lost; rank 1, which lived through it, becomes rank 0. Its ledger covers the whole run, most of
    which the old rank 0's readings accounted already; its ``base`` (its ledger as of the cursor, served for
    ``/progress?ledgerAt=``) says what it did since: trained until the loss, recovered, trained again."""
    job = Job()
    job.reconcile(2, "Running", {"step": 0, "ledger": ledger(0, 2, starting=2)})
    job.reconcile(12, "Running", {"step": 200, "ledger": ledger(0, 12, first=1, ran=199, step=200, starting=2,
                                                                   training=10)})
    # The survivor's mark at 11.5 s (one at most a second), then 5 s of training, 1 s of recovery, 2.5 s of training.
    survivor = {"pod": "j-worker-1", "first": 1, "starting": 1.5}
    base = {"at": T0.timestamp() + 11.5, "step": 195, "stepsRun": 194, "seconds": {"starting": 1.5, "training": 10}}
    doc = ledger(0.5, 20, ran=274, step=275, training=17.5, recovery=1, **survivor)
    job.reconcile(20, "Running", {"step": 275, "ledger": {**doc, "base": base}})
    # 8 s from the cursor (12) to the reading, split as the survivor's 8.5 s since its mark: 7.5 training, 1 recovery.
    assert job.seconds == {"starting": 2.0, "training": pytest.approx(10 + 8 * 7.5 / 8.5, abs=1e-3),
                           "recovery": pytest.approx(8 / 8.5, abs=1e-3)}
    # Its 5 steps from its mark (195) to the cursor's step (200) ran before the cursor: none is lost work.
    assert job.status.goodput.high_water_step == 275
    job.reconcile(25, "Running", {"step": 325, "ledger": ledger(0.5, 25, ran=324, step=325, training=22.5, recovery=1,
                                                                **survivor)})
    assert job.seconds["training"] == pytest.approx(10 + 8 * 7.5 / 8.5 + 5, abs=1e-3)
    assert sum(job.seconds.values()) == pytest.approx(25)


def test_a_survivor_become_rank_0_without_a_base_is_recovery_up_to_its_first_reading():
    """From a trainer that keeps no mark that old (or serves none): the interval up to its first reading is
    recovery, and its readings after are differences from that one."""
    job = Job()
    job.reconcile(2, "Running", {"step": 0, "ledger": ledger(0, 2, starting=2)})
    job.reconcile(12, "Running", {"step": 200, "ledger": ledger(0, 12, first=1, starting=2, training=10)})
    survivor = {"pod": "j-worker-1", "first": 1, "starting": 1.5, "recovery": 1}
    job.reconcile(20, "Running", {"step": 280, "ledger": ledger(0.5, 20, training=17, **survivor)})
    assert job.seconds == {"starting": 2.0, "training": 10.0, "recovery": 8.0}
    job.reconcile(25, "Running", {"step": 330, "ledger": ledger(0.5, 25, training=22, **survivor)})
    assert job.seconds == {"starting": 2.0, "training": 15.0, "recovery": 8.0}


def test_a_process_that_goes_back_to_a_checkpoint_in_place_counts_the_steps_it_redoes_as_lost_work():
    """A sharded plan's survivors reload the newest checkpoint in their own processes: the step goes down
    between two readings of one process. Its steps run (stepsRun) below the high-water step are lost work;
    by the step counts alone (older trainers) the interval looked like no work was redone."""
    job = Job()
    job.reconcile(2, "Running", {"step": 0, "ledger": ledger(0, 2, starting=2)})
    job.reconcile(12, "Running", {"step": 200, "ledger": ledger(0, 12, first=1, ran=199, starting=2, training=10)})
    # A worker lost at step 200; back to the checkpoint of step 100 in place, then 100 -> 150: 50 steps redone.
    job.reconcile(22, "Running", {"step": 150, "ledger": ledger(0, 22, first=1, ran=249, starting=2, training=18,
                                                                recovery=2)})
    assert job.seconds == {"starting": 2.0, "training": 10.0, "lost_work": 8.0, "recovery": 2.0}
    # 150 -> 260: 50 steps redone, 60 past the high-water step.
    job.reconcile(32, "Running", {"step": 260, "ledger": ledger(0, 32, first=1, ran=359, starting=2, training=28,
                                                                recovery=2)})
    assert job.seconds == {"starting": 2.0, "training": round(10 + 10 * 60 / 110, 3),
                           "lost_work": round(8 + 10 * 50 / 110, 3), "recovery": 2.0}
    assert sum(job.seconds.values()) == pytest.approx(32, abs=0.002) and job.status.goodput.high_water_step == 260


def test_the_steps_run_are_set_against_the_ledgers_own_step_not_the_documents():
    """/progress copies its step before it reads the ledger: served between a step's end in the ledger and the
    trainer's update of the step, the document's step is one behind the steps run. Against it, one step of a
    job that never went back would be lost work; the ledger's own step, taken with stepsRun, is not behind."""
    job = Job()
    job.reconcile(2, "Running", {"step": 0, "ledger": ledger(0, 2, starting=2)})
    job.reconcile(12, "Running", {"step": 100, "ledger": ledger(0, 12, first=1, ran=99, step=100, starting=2,
                                                                training=10)})
    job.reconcile(22, "Running", {"step": 199, "ledger": ledger(0, 22, first=1, ran=199, step=200, starting=2,
                                                                training=20)})
    assert job.seconds == {"starting": 2.0, "training": 20.0}
    assert job.status.goodput.high_water_step == 200
