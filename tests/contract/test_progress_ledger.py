"""The ledger contract (docs/contracts.md §4): the operator's prober asks rank 0 for ``/progress?ledgerAt=``, the
trainer's endpoint answers with its ledger and its ``base``, and the operator's goodput accounts a survivor become
rank 0 from that base. The operator's and the trainer's own code on both ends, over real HTTP."""

from __future__ import annotations

import copy
import datetime as dt
import json
import urllib.request

import pytest

from cohort.api.models import TrainingJobSpec
from cohort.api.schema import parse
from cohort.operator.decide import Decision, Inputs
from cohort.operator.decide.goodput import account
from cohort.operator.jobstate import JobMemory
from cohort.operator.prober import _progress_path
from cohort.operator.world import Member, World
from cohort.trainer.ledger import TimeLedger
from cohort.trainer.metrics import WorkerMetrics
from cohort.trainer.runtime.ports import free_port
from tests.support.specs import WORKLOAD

W0 = 1_800_000_000.0  # the survivor's start, Unix seconds
SPEC = parse(TrainingJobSpec, {"workload": dict(WORKLOAD), "replicas": {"min": 1, "max": 3, "target": 3}})


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(W0 + t, dt.timezone.utc)


def _reconcile(mem: JobMemory, t: float, progress: dict) -> None:
    world = World(version=2, members=(Member("j-worker-1", "u1", "127.0.0.1"),))
    observed = Inputs(job={"metadata": {"name": "j", "creationTimestamp": _at(0).strftime("%Y-%m-%dT%H:%M:%SZ")}},
                      spec=SPEC, status=mem.status, world=world, pods=[], now=_at(t), progress=progress)
    decision = Decision(status=copy.deepcopy(mem.status))
    decision.status.phase = "Running"
    account(observed, decision)
    mem.status = decision.status


def test_a_survivor_become_rank_0_is_accounted_from_the_base_its_endpoint_serves():
    clock = Clock()
    survivor = TimeLedger(clock=clock, wall=lambda: W0 + clock.t)
    survivor.pod = "j-worker-1"
    metrics = WorkerMetrics()
    metrics.ledger = survivor.snapshot
    port = free_port()
    server = metrics.serve("127.0.0.1", port)
    mem = JobMemory(key=("ns", "j"))
    try:
        # The old rank 0 (j-worker-0, started with the survivor) was last read at 30 s: 2 s starting, 28 training.
        old = {"pod": "j-worker-0", "startedAt": W0, "at": W0 + 30, "firstStep": 1, "stepsRun": 279, "step": 280,
               "seconds": {"starting": 2.0, "training": 28.0}}
        _reconcile(mem, 30, {"step": 280, "ledger": old})
        assert mem.status.goodput.accounted_until
        # The survivor: 2 s starting, steps of 0.1 s to 34 s, when rank 0 died; 1 s of recovery; steps to 40 s.
        clock.t = 2.0
        survivor.first_step_in_world(1)
        step = 1
        while clock.t < 33.95:
            clock.t += 0.1
            step += 1
            survivor.step(healthy_s=None, threshold=1.5, reached=step)
        survivor.switch("recovery")
        clock.t += 1.0
        survivor.first_step_in_world(step + 1)
        step += 1
        while clock.t < 39.95:
            clock.t += 0.1
            step += 1
            survivor.step(healthy_s=None, threshold=1.5, reached=step)
        path = _progress_path(mem)
        assert path.startswith("/progress?ledgerAt="), path
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            doc = json.load(r)
        assert doc["ledger"]["base"]["at"] <= W0 + 30, doc["ledger"]
        _reconcile(mem, 40, doc)
    finally:
        server.shutdown()
        server.server_close()
    seconds = mem.status.goodput.seconds
    # The 10 s since the last reading: 9 s of the survivor's training and its 1 s of recovery, not 10 s of recovery.
    assert seconds.recovery == pytest.approx(1.0, abs=0.15), seconds
    assert seconds.training == pytest.approx(28 + 9, abs=0.15), seconds
    assert seconds.lost_work == 0, seconds  # its steps from its mark to the cursor were the old rank 0's too
    assert seconds.starting + seconds.training + seconds.recovery == pytest.approx(40, abs=0.01), seconds
