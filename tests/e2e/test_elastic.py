"""End to end on real nodes: the real control plane, operator, and trainer containers.

Each test applies a TrainingJob (examples/digits.yaml's workload) that the
operator under test runs as worker containers, injects a failure, and checks
that the job succeeds with the accuracy target and that the recovery was in
place (no steps computed twice) or, when no worker survives, from the
newest checkpoint.
"""

from __future__ import annotations

import statistics
import time

import pytest

from tests.support.kube import wait_for
from tests.support.operator import kubectl, world
from tests.support.training import (
    create,
    progress,
    steps_lost,
    training_job,
    wait_finished,
    wait_step,
    worker_records,
    world_sizes,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ACCURACY = 0.96


def assert_succeeded(job: dict) -> dict:
    status = job.get("status", {})
    assert status.get("phase") == "Succeeded", status
    assert status["progress"]["accuracy"] >= ACCURACY, status["progress"]
    return status


def test_worker_sigkilled_mid_training_recovers_in_place(cluster, namespace, real_nodes, operator):
    create(cluster, namespace, training_job("kill", env={"COHORT_FAULT_KILL": "rank=2,step=100"}))
    status = assert_succeeded(wait_finished(cluster, namespace, "kill"))
    assert status["replacements"]["failure"] == 1
    records = worker_records(namespace, "kill")
    assert any(r["msg"] == "fault injection: SIGKILL self" for r in records)
    lost = steps_lost(records)
    assert lost and max(lost) <= 0, lost
    assert not any(r["msg"] == "resumed from checkpoint" for r in records)


def test_worker_pod_deleted_with_kubectl_recovers_in_place(cluster, namespace, real_nodes, operator):
    create(cluster, namespace, training_job("delete", workload={"epochs": 60}))
    wait_step(cluster, namespace, "delete", 150)
    victim = world(cluster, namespace, "delete")["members"][2]["pod"]
    kubectl(cluster, "delete", "pod", "-n", namespace, victim, "--wait=false")
    assert_succeeded(wait_finished(cluster, namespace, "delete"))
    assert victim not in [m["pod"] for m in world(cluster, namespace, "delete")["members"]]
    records = worker_records(namespace, "delete")
    assert any(r["msg"] == "stopped by SIGTERM" and r["_pod"] == victim for r in records)
    lost = steps_lost(records)
    assert lost and max(lost) <= 0, lost


def steps_per_second(cluster, ns: str, name: str, seconds: float) -> float:
    """Training rate over a few seconds: the least-squares slope of the job's reported step against time.

    The operator refreshes the reported step about once a second, so a reading can be up to a second
    stale. Two end-point readings of a 12 s window at 15 steps/s were off by up to 8 %, nearly the 10 %
    the test allows (a run failed at 0.886x, within that error); a slope through a reading every 0.25 s averages
    the staleness out.
    """
    ts: list[float] = []
    steps: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ts.append(time.monotonic())
        steps.append(progress(cluster, ns, name).get("step", 0))
        time.sleep(0.25)
    return statistics.linear_regression(ts, steps).slope


LONG = {"epochs": 0, "maxSteps": 3000, "batchSize": 64, "modelArgs": {"hidden": 1024, "depth": 2},
        "evalEveryEpochs": 0}


def test_slowed_rank_is_replaced_and_throughput_returns(cluster, namespace, real_nodes, operator):
    window_s = 10
    # Rates come from the reported step, which the operator refreshes once a second: windows of
    # 12 s keep that sampling within about 10 % (6 s windows made the check flaky on 2 cores).
    job = training_job("slow", env={"COHORT_FAULT_SLOW": "rank=1,factor=4,step=800"}, workload=LONG,
                       stragglers={"policy": "replace", "threshold": 2.0, "windowSeconds": window_s})
    create(cluster, namespace, job)
    wait_step(cluster, namespace, "slow", 100)
    before = steps_per_second(cluster, namespace, "slow", 12)
    assert progress(cluster, namespace, "slow").get("step", 0) < 800, "the window before ran into the slowdown"
    wait_step(cluster, namespace, "slow", 800)
    t_slow = time.monotonic()
    slowed = steps_per_second(cluster, namespace, "slow", 3)
    wait_for(lambda: cluster.get_job(namespace, "slow")["status"]["replacements"]["straggler"] >= 1,
             window_s + 60, 0.5, what="the straggler replaced")
    assert time.monotonic() - t_slow <= window_s + 60
    # Every node here shares this machine's 2 cores: the kubelet tearing down the
    # straggler's container (CNI, mounts, status) competes with the survivors for
    # a few seconds, which a real cluster's separate node would not. Measure once it is gone.
    wait_for(lambda: len(cluster.job_pods(namespace, "slow")) == 4
             and not any(p.metadata.deletion_timestamp for p in cluster.job_pods(namespace, "slow")),
             60, 0.5, what="the straggler's pod gone")
    time.sleep(4)  # the new world's first steps include its rendezvous and warm-up
    after = steps_per_second(cluster, namespace, "slow", 12)
    print(f"steps/s before the slowdown {before:.2f}, slowed {slowed:.2f}, after {after:.2f}")  # shown with -rA
    assert after >= 0.9 * before, f"steps/s before the slowdown {before:.1f}, slowed {slowed:.1f}, after {after:.1f}"
    status = assert_succeeded(wait_finished(cluster, namespace, "slow"))
    assert status["replacements"]["straggler"] >= 1
    reasons = [e.reason for e in cluster.events(namespace, "slow")]
    assert "StragglerReplaced" in reasons


def test_scaling_2_4_2_mid_run(cluster, namespace, real_nodes, operator):
    create(cluster, namespace, training_job("scale", replicas={"min": 2, "max": 4, "target": 2}, workload=LONG))
    wait_step(cluster, namespace, "scale", 100)
    kubectl(cluster, "scale", "tj/scale", "-n", namespace, "--replicas=4")
    wait_for(lambda: world(cluster, namespace, "scale")["members"].__len__() == 4, 90, 0.5, what="world of 4")
    step = progress(cluster, namespace, "scale").get("step", 0)
    wait_step(cluster, namespace, "scale", step + 150)
    kubectl(cluster, "scale", "tj/scale", "-n", namespace, "--replicas=2")
    wait_for(lambda: len(world(cluster, namespace, "scale")["members"]) == 2, 60, 0.5, what="world of 2")
    assert_succeeded(wait_finished(cluster, namespace, "scale"))
    records = worker_records(namespace, "scale")
    first = min((r for r in records if r["msg"] == "joined world"), key=lambda r: r["ts"])["_pod"]
    sizes = world_sizes(records, first)
    collapsed = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert collapsed[0] == 2 and 4 in collapsed and collapsed[-1] == 2, sizes
    assert collapsed.index(4) < len(collapsed) - 1


def test_every_worker_killed_resumes_from_checkpoint(cluster, namespace, real_nodes, operator):
    create(cluster, namespace, training_job("all", workload={"epochs": 60}))
    wait_for(lambda: (cluster.get_job(namespace, "all").get("status", {}).get("lastCheckpoint") or {}).get("step", 0) >= 200,
             120, 0.5, what="a committed checkpoint")
    kubectl(cluster, "delete", "pods", "-n", namespace, "-l", "cohort.dev/job=all", "--grace-period=0", "--force")
    status = assert_succeeded(wait_finished(cluster, namespace, "all", timeout_s=300))
    records = worker_records(namespace, "all")
    resumed = [r for r in records if r["msg"] == "resumed from checkpoint"]
    assert resumed and resumed[0]["step"] >= 200, resumed
    assert status["progress"]["step"] > resumed[0]["step"]


def test_operator_killed_during_recovery_completes_after_restart(cluster, namespace, real_nodes, operator):
    create(cluster, namespace, training_job("opkill", workload={"epochs": 60}))
    wait_step(cluster, namespace, "opkill", 150)
    version = world(cluster, namespace, "opkill")["version"]
    victim = world(cluster, namespace, "opkill")["members"][1]["pod"]
    operator.kill()  # SIGKILL, then lose a worker while no operator runs
    kubectl(cluster, "delete", "pod", "-n", namespace, victim, "--grace-period=0", "--force")
    time.sleep(3)
    assert world(cluster, namespace, "opkill")["version"] == version  # nobody published while it was down
    operator.start().wait_ready()
    wait_for(lambda: world(cluster, namespace, "opkill")["version"] > version, 30, 0.5, what="a new world")
    assert_succeeded(wait_finished(cluster, namespace, "opkill"))
    lost = steps_lost(worker_records(namespace, "opkill"))
    assert lost and max(lost) <= 0, lost
