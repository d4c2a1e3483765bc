"""End to end on real nodes: the real control plane, operator, and trainer containers.

Each test applies a TrainingJob (examples/digits.yaml's workload) that the
operator under test runs as worker containers, injects a failure, and checks
that the job succeeds with the accuracy target and that the recovery was in
place (no steps computed twice) or, when no worker survives, from the
newest checkpoint.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from pathlib import Path

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
    # Rank 0 lived through it: the job's training is its ledger's, from its first step (firstStep) on, whatever
    # the reading the operator got first and however long the pods were accounted as Pending past its start.
    g = status["goodput"]
    assert g["lastReading"]["firstStep"] == 1, g
    assert g["seconds"]["training"] >= 0.95 * g["lastReading"]["seconds"]["training"] > 0, g
    # No step was computed again (0 steps lost): none of the steps run is lost work.
    assert g["lastReading"]["stepsRun"] > 0 and g["seconds"]["lostWork"] == 0, g


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


def steps_per_second(cluster, ns: str, names: tuple[str, ...], seconds: float,
                     until_step: float = float("inf")) -> tuple[list[float], float]:
    """Each job's training rate over the same few seconds: the least-squares slope of its reported step;
    and the window's length. The window ends after ``seconds``, or earlier, once the first job reports
    ``until_step`` (so that a window meant to end before a change at a known step does, however fast the
    machine).

    The operator refreshes the reported step about once a second, so a reading can be up to a second
    stale; a slope through a reading every 0.25 s averages that out.
    """
    ts: list[float] = []
    steps: list[list[int]] = [[] for _ in names]
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end and (not steps[0] or steps[0][-1] < until_step):
        ts.append(time.monotonic())
        for series, name in zip(steps, names, strict=True):
            series.append(progress(cluster, ns, name).get("step", 0))
        time.sleep(0.25)
    return [statistics.linear_regression(ts, series).slope for series in steps], ts[-1] - start


MIN_WINDOW_S = 20  # the windows before and after: 20 s ones read 0.96-1.04x of the control here (below)
LONG = {"epochs": 0, "maxSteps": 3000, "batchSize": 64, "modelArgs": {"hidden": 1024, "depth": 2},
        "evalEveryEpochs": 0}


def scheduled_on(cluster, ns: str, name: str, count: int) -> dict[str, str]:
    """Wait for ``count`` of the job's pods to be bound to nodes; pod -> node."""
    def bound():
        pods = {p.metadata.name: p.spec.node_name for p in cluster.job_pods(ns, name)}
        return len(pods) == count and all(pods.values()) and pods
    return wait_for(bound, 60, 0.25, what=f"{count} pods of {name} scheduled")


def place_mirrored(cluster, ns: str, nodes: list[str], jobs: dict[str, dict]) -> None:
    """Start the two jobs of 3 workers as mirror images: the first with workers 0 and 1 on nodes[0] and
    worker 2 on nodes[1], the second the other way round (3 workers on each node).

    Each is created with 2 workers and scaled to 3, with nodes cordoned so that each pod can only go
    where it belongs; the nodes are uncordoned on return.
    """
    (first, first_job), (second, second_job) = jobs.items()
    a, b = nodes[:2]
    try:
        kubectl(cluster, "cordon", b)
        create(cluster, ns, first_job)
        scheduled_on(cluster, ns, first, 2)
        kubectl(cluster, "uncordon", b)
        kubectl(cluster, "cordon", a)
        create(cluster, ns, second_job)
        scheduled_on(cluster, ns, second, 2)
        kubectl(cluster, "scale", f"tj/{first}", "-n", ns, "--replicas=3")
        scheduled_on(cluster, ns, first, 3)
        kubectl(cluster, "uncordon", a)
        kubectl(cluster, "cordon", b)
        kubectl(cluster, "scale", f"tj/{second}", "-n", ns, "--replicas=3")
        scheduled_on(cluster, ns, second, 3)
    finally:
        for node in (a, b):
            kubectl(cluster, "uncordon", node, check=False)


def test_slowed_rank_is_replaced_and_throughput_returns(cluster, namespace, real_nodes, operator):
    """A rank slowed 4x is replaced, and the job's throughput returns to 0.9x of what it was before.

    This machine's 2 cores run every node, and a healthy job's rate drifts with them: measured with no
    fault at all, the rate in one 12-20 s window was under 0.9x of the rate a minute earlier in about 30 %
    of pairs of windows. So the rate is taken relative to a healthy control job, identical but never
    slowed (and given more steps, so that it never ends first), that runs beside it over the same
    seconds: the drift is common to both and cancels.

    The two jobs are also placed alike, before and after the swap: each node's pods share half of the
    machine (each node is its own cgroup), so a job with more workers on the busier node is slower. With
    4 workers each, spread 2 + 2, the replacement (which avoids the straggler's node) left the slow job
    with 3 workers on a node of 5, the control with 2: 0.91-0.95x of the control for as long as both ran,
    against 0.98-1.02x before (one run, 20 s windows every 5 s; CI failed once at 0.90 vs 1.02). Here each
    job has 3 workers, placed as mirror images (2 + 1 and 1 + 2), and rank 1 is one of the slow job's two
    on its node: after the swap both jobs have 1 worker on one node and 2 on the other. In one such run
    the 20 s windows read 0.96-1.04x before the slowdown and 0.93-1.00x after the swap, so the windows
    here are 30 s.
    """
    # The slowdown starts soon after the window before it, and the slow job ends soon after the window
    # after it: in one run here (about 11 steps/s) they ended at steps 393 and 1190. slow_from 1000 and 3000
    # steps spent a minute waiting for the slowdown and another finishing. A faster machine (one run here
    # reached step 830 by the end of a 30 s window) ends each window early, at the slowdown or the end.
    window_s = 10
    slow_from = 800
    workload = {**LONG, "maxSteps": 2500}
    replicas = {"min": 2, "max": 3, "target": 2}
    a, b = real_nodes[:2]
    place_mirrored(cluster, namespace, real_nodes, {
        "slow": training_job("slow", env={"COHORT_FAULT_SLOW": f"rank=1,factor=4,step={slow_from}"},
                             workload=workload, replicas=replicas,
                             stragglers={"policy": "replace", "threshold": 2.0, "windowSeconds": window_s}),
        # The control is deleted before it ends; never let it end inside the window after.
        "control": training_job("control", workload=LONG, replicas=replicas, stragglers={"policy": "ignore"})})
    jobs = ("slow", "control")
    for name in jobs:
        wait_for(lambda name=name: len(world(cluster, namespace, name)["members"]) == 3, 90, 0.5,
                 what=f"{name}'s world of 3")
    slow_pods = scheduled_on(cluster, namespace, "slow", 3)
    straggler = world(cluster, namespace, "slow")["members"][1]["pod"]
    assert slow_pods[straggler] == a and sorted(slow_pods.values()) == [a, a, b], (straggler, slow_pods)

    def relative_rate(seconds: float, until_step: float = float("inf")) -> float:
        (slow, control), length = steps_per_second(cluster, namespace, jobs, seconds, until_step)
        # A window cut short by until_step: the machine ran the steps before it faster than this test's
        # step numbers allow for, and the ratio of a short window is noise.
        assert length >= MIN_WINDOW_S or seconds < MIN_WINDOW_S, (
            f"a {seconds} s window ended after {length:.1f} s, at step {until_step}")
        return slow / control

    time.sleep(4)  # the new worlds' first steps include their rendezvous and warm-up
    # Ends before the slowdown (the operator's reading is up to a second stale: 30 steps of margin at
    # 30 steps/s). It ran into it once, at step 830, where an earlier run here had ended the window at 393.
    before = relative_rate(30, until_step=slow_from - 30)
    wait_step(cluster, namespace, "slow", slow_from, timeout_s=240)
    t_slow = time.monotonic()
    slowed = relative_rate(4)
    wait_for(lambda: cluster.get_job(namespace, "slow")["status"]["replacements"]["straggler"] >= 1,
             window_s + 60, 0.5, what="the straggler replaced")
    assert time.monotonic() - t_slow <= window_s + 60
    # Every node here shares this machine's 2 cores: the kubelet tearing down the
    # straggler's container (CNI, mounts, status) competes with the survivors for
    # a few seconds, which a real cluster's separate node would not. Measure once it is gone.
    wait_for(lambda: len(cluster.job_pods(namespace, "slow")) == 3
             and not any(p.metadata.deletion_timestamp for p in cluster.job_pods(namespace, "slow")),
             60, 0.5, what="the straggler's pod gone")
    after_pods = scheduled_on(cluster, namespace, "slow", 3)
    assert sorted(after_pods.values()) == [a, b, b], after_pods  # mirrors the control's 1 + 2
    time.sleep(4)  # the new world's first steps include its rendezvous and warm-up
    after = relative_rate(30, until_step=workload["maxSteps"] - 30)  # ends before the slow job does
    rates = f"steps/s relative to the control: before the slowdown {before:.2f}, slowed {slowed:.2f}, after {after:.2f}"
    print(rates)  # shown with -rA
    assert slowed < 0.9 * before, f"the slowdown did not show: {rates}"
    assert after >= 0.9 * before, rates
    cluster.delete_job(namespace, "control")  # the slow job finishes alone
    status = assert_succeeded(wait_finished(cluster, namespace, "slow"))
    assert status["replacements"]["straggler"] >= 1
    reasons = [e.reason for e in cluster.events(namespace, "slow")]
    assert "StragglerReplaced" in reasons


def test_scaling_2_4_2_mid_run(cluster, namespace, real_nodes, operator):
    # 1500 steps: back to 2 workers near step 550 here (room for a machine 1.5x faster), and the rest is
    # only the finish (3000 steps took a minute more).
    create(cluster, namespace, training_job("scale", replicas={"min": 2, "max": 4, "target": 2},
                                            workload={**LONG, "maxSteps": 1500}))
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
    durable = cluster.get_job(namespace, "all")["status"]["lastDurableCheckpoint"]
    assert durable["step"] >= 200 and durable["location"].endswith(f"/step-{durable['step']:08d}"), durable
    assert durable["bytes"] > 0 and durable.get("restartCostSeconds", -1) >= 0, durable
    kubectl(cluster, "delete", "pods", "-n", namespace, "-l", "cohort.dev/job=all", "--grace-period=0", "--force")
    status = assert_succeeded(wait_finished(cluster, namespace, "all", timeout_s=300))
    records = worker_records(namespace, "all")
    resumed = [r for r in records if r["msg"] == "resumed from checkpoint"]
    assert resumed and resumed[0]["step"] >= durable["step"], (resumed, durable)
    assert status["progress"]["step"] > resumed[0]["step"]


def test_operator_killed_during_recovery_completes_after_restart(cluster, namespace, real_nodes, operator):
    """A worker is lost while no operator runs, rank 0 computes 3x slower from step 60: the restarted operator
    re-forms the world, and the job's time ledger (status.goodput) accounts for all of it."""
    create(cluster, namespace, training_job("opkill", workload={"epochs": 60}, stragglers={"policy": "ignore"},
                                            env={"COHORT_FAULT_SLOW": "rank=0,factor=3,step=60"}))
    wait_step(cluster, namespace, "opkill", 150)
    version = world(cluster, namespace, "opkill")["version"]
    victim = world(cluster, namespace, "opkill")["members"][1]["pod"]
    operator.kill()  # SIGKILL, then lose a worker while no operator runs
    kubectl(cluster, "delete", "pod", "-n", namespace, victim, "--grace-period=0", "--force")
    time.sleep(3)
    assert world(cluster, namespace, "opkill")["version"] == version  # nobody published while it was down
    operator.start().wait_ready()
    wait_for(lambda: world(cluster, namespace, "opkill")["version"] > version, 30, 0.5, what="a new world")
    status = assert_succeeded(wait_finished(cluster, namespace, "opkill"))
    lost = steps_lost(worker_records(namespace, "opkill"))
    assert lost and max(lost) <= 0, lost
    assert_time_accounted(cluster, namespace, "opkill", status)


def assert_time_accounted(cluster, ns: str, name: str, status: dict) -> None:
    """The ledger's parts sum to the job's wall time (creation to completion, Kubernetes' clock, whole seconds),
    a lost worker shows as recovery and a slowed one as straggler time; the durable checkpoint exists."""
    g = status["goodput"]
    seconds = g["seconds"]
    total = sum(seconds.values())
    created = dt.datetime.fromisoformat(cluster.get_job(ns, name)["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    completed = dt.datetime.fromisoformat(status["completionTime"].replace("Z", "+00:00"))
    wall = (completed - created).total_seconds()
    print(f"{name}: wall {wall:.0f} s, ledger {total:.2f} s: {seconds}, goodput {g.get('percent')} %")  # -rA
    assert abs(total - g["wallSeconds"]) <= 0.01 * len(seconds), g  # each part rounded to the millisecond
    # completionTime names a whole second (creationTimestamp too, and the ledger starts at it): the job ended
    # somewhere in [wall, wall + 1). The parts sum to within 2 % of an end in that second.
    assert 0 <= g["wallSeconds"] - wall < 1, (g, wall)
    assert 0.98 * wall <= total <= 1.02 * (wall + 1), (total, wall)
    for part in ("starting", "training", "recovery", "straggler", "finishing"):
        assert seconds.get(part, 0) > 0, (part, seconds)
    assert g["percent"] == round(100 * seconds["training"] / g["wallSeconds"], 1)
    table = kubectl(cluster, "get", "tj", name, "-n", ns).stdout.split("\n")
    assert "GOODPUT" in table[0].split() and str(g["percent"]) in table[1].split(), table
    durable = status["lastDurableCheckpoint"]
    claim = cluster.core.read_namespaced_persistent_volume_claim(f"{name}-checkpoints", ns)
    pv = cluster.core.read_persistent_volume(claim.spec.volume_name)
    root = (pv.spec.host_path or pv.spec.local).path  # local-path-provisioner: a directory on this machine
    step_dir = Path(root) / Path(durable["location"]).relative_to("/checkpoints")
    assert (step_dir / "COMMITTED").is_file(), (durable, step_dir)
