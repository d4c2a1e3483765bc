"""End to end behind the real Kueue: a training job on real nodes is preempted by a higher-priority
job, checkpoints as its pods stop, queues again, and resumes from that checkpoint when the quota
comes back, to succeed at its accuracy target.

The preemptor is a TrainingJob on kwok nodes (its pods never run; the test ends it as a kubelet
would), so the two cores of this machine train one job at a time.
"""

from __future__ import annotations

import json

import pytest

from tests.support.kube import condition, wait_for
from tests.support.kueue import kueue, queue, queued  # noqa: F401  (fixtures)
from tests.support.operator import job_manifest, pods, terminate, wait_phase, world
from tests.support.training import create, explained, progress, training_job, wait_finished, wait_step, worker_records

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ACCURACY = 0.96


def test_preempted_job_checkpoints_requeues_and_resumes_without_going_back(
        cluster, namespace, real_nodes, queue, operator):  # noqa: F811
    queue.create(cpu="1", preemption=True)
    low, high = queue.priority("low", 10), queue.priority("high", 1000)
    # The first workers compute 40 times slower (about 50 ms a step, not 2): the job's 660 steps outlast
    # the preemption (unslowed, it ran from step 150 to the end before its pods were told to stop, and
    # never checkpointed on leaving). Processes that resume past step 1 are not slowed.
    job = training_job("train", env={"COHORT_FAULT_SLOW": "rank=all,factor=40,step=1"},
                       replicas={"min": 2, "max": 2, "target": 2},
                       resources={"requests": {"cpu": "500m", "memory": "256Mi"},
                                  "limits": {"cpu": "2", "memory": "1536Mi"}},
                       checkpoint={"everySteps": 1000})  # periodic saves far apart: the one on eviction counts
    create(cluster, namespace, queued(job, priority=low))
    wait_step(cluster, namespace, "train", 150, 240)

    preemptor = queued(job_manifest("urgent", resources={"requests": {"cpu": "500m"}}), priority=high)
    cluster.create_job(namespace, preemptor)
    job = wait_phase(cluster, namespace, "train", "Suspended", 60)
    assert condition(job, "Suspended")["reason"] == "Preempted", condition(job, "Suspended")
    # Gone, not only being deleted: their last log lines (the checkpoint) are written by then.
    wait_for(lambda: not pods(cluster, namespace, "train", live=False), 90, what="the preempted job's pods gone")
    wait_phase(cluster, namespace, "urgent", "Running", 30)

    def saved_records() -> list[dict]:
        return [r for r in worker_records(namespace, "train") if r.get("msg") == "checkpointed on leaving"]
    with explained(cluster, namespace, "train"):
        saved = wait_for(saved_records, 20, 0.5, what="rank 0's checkpoint on leaving in the worker logs")
    records = worker_records(namespace, "train")
    assert len(saved) == 1, saved
    reached = max(r["step"] for r in records if r.get("msg") in ("left world", "stopped by SIGTERM"))
    assert saved[0]["step"] == reached  # nothing trained before the eviction is lost
    assert saved[0]["step"] >= 150

    # The preemptor finishes; its quota goes back and the preempted job resumes from that checkpoint.
    terminate(cluster, namespace, world(cluster, namespace, "urgent")["members"][0]["pod"], 0,
              json.dumps({"step": 10, "accuracy": 0.5}))
    with explained(cluster, namespace, "train"):
        try:  # training again, past the checkpoint
            wait_for(lambda: progress(cluster, namespace, "train").get("step", 0) > saved[0]["step"], 240, 0.5,
                     what="the preempted job training again")
        except AssertionError as e:
            raise AssertionError(f"{e}\nWorkloads: {json.dumps(queue.workloads('train'))[:3000]}") from e
    status = wait_finished(cluster, namespace, "train", 420)["status"]
    assert status["phase"] == "Succeeded", status
    assert status["progress"]["accuracy"] >= ACCURACY, status["progress"]
    records = worker_records(namespace, "train")
    restored = [r for r in records if r.get("msg") == "resumed from checkpoint"]
    assert restored and {r["step"] for r in restored} == {saved[0]["step"]}, restored
    # The step counter never went back past the checkpoint: every world after it starts there or later.
    after = [r["step"] for r in records if r.get("msg") == "joined world" and r["ts"] > saved[0]["ts"]]
    assert after and min(after) == saved[0]["step"], (after, saved[0]["step"])
    [wl] = queue.workloads("train")
    assert condition(wl, "Finished")["status"] == "True"
    assert (wl["status"].get("schedulingStats") or {}).get("evictions"), wl["status"]
