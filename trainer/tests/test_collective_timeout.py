"""A collective whose peer never comes fails within the job's collective timeout (collective_timeout.py).

Four parts: the rule that picks each step's timeout; the private torch call that sets it, on two real
gloo ranks (a peer that never joins the collective: the waiting rank raises after the timeout, not the
group's minute); and the whole trainer under the local launcher, where rank 1 hangs at a known step without
closing its connections (``COHORT_FAULT_HANG``) and dies 12 s later: the survivors' collective fails
within the 2 s timeout plus slack, and the job goes on without losing a step. Without the timeout
(``_arm_timeout`` never setting one) they wait until the hung process dies, 12 s. And the time-based
checkpoint decision the rule depends on, which the ranks now agree on: without it, a sharded plan's
ranks saved at different steps and committed checkpoints missing a rank's shards.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_ranks
from tests.support.local import manifest, run_local

from cohort.trainer.collective_timeout import AUTO_FACTOR, AUTO_MARGIN_S, CALM_AFTER, CollectiveTimeout
from cohort.trainer.runtime.device import NCCL_ERROR_HANDLING, keep_process_on_nccl_errors
from cohort.trainer.runtime.process_group import set_collective_timeout


def test_only_calm_steps_get_the_short_timeout():
    t = CollectiveTimeout(configured_s=2.0, group_s=60.0)
    t.new_world()
    picks = []
    for plain in [True] * CALM_AFTER + [True, False, True, True, True]:
        picks.append(t.for_next_step(0.05))
        t.after(plain)
    # the first CALM_AFTER steps of a world, and CALM_AFTER steps after an evaluation or a save: the long one
    assert picks == [60.0] * CALM_AFTER + [2.0, 2.0, 60.0, 60.0, 2.0]
    t.new_world()
    assert t.for_next_step(0.05) == 60.0


def test_automatic_timeout_follows_the_step_time_and_the_sync_period():
    t = CollectiveTimeout(configured_s=0.0, group_s=60.0, plain_steps=CALM_AFTER)
    assert t.for_next_step(None) == 60.0  # no median yet: the group's timeout
    assert t.for_next_step(0.5) == pytest.approx(AUTO_MARGIN_S + AUTO_FACTOR * 0.5)
    assert t.for_next_step(100.0) == 60.0  # never longer than the group's own
    local_sgd = CollectiveTimeout(configured_s=0.0, group_s=600.0, steps_per_sync=8, plain_steps=CALM_AFTER)
    assert local_sgd.for_next_step(0.5) == pytest.approx(AUTO_MARGIN_S + AUTO_FACTOR * 0.5 * 8)
    longer = CollectiveTimeout(configured_s=90.0, group_s=60.0)
    assert longer.long_s == 90.0  # a configured timeout above the group's raises the long one too


def _wait_for_a_peer_that_is_late(rank: int, world: int) -> dict[str, object]:
    t = torch.ones(4)
    dist.all_reduce(t)  # connected
    set_collective_timeout(1.0)
    if rank == 1:
        time.sleep(4)  # never there in time, connections open
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        return {"raised": False, "after": time.monotonic() - t0}
    except RuntimeError as e:
        return {"raised": True, "after": time.monotonic() - t0, "error": str(e).splitlines()[0]}


@pytest.mark.dist
def test_a_step_near_its_timeout_names_the_field_that_set_it():
    auto, fixed, over = CollectiveTimeout(0, 60), CollectiveTimeout(5, 60), CollectiveTimeout(90, 60)
    assert auto.near_limit(29.0, 60) is None and auto.near_limit(31.0, 0) is None  # under half; no timeout known
    assert auto.near_limit(31.0, 60) == "faultTolerance.processGroupTimeoutSeconds"  # a first step, a save
    assert auto.near_limit(8.0, 13.0) == "faultTolerance.collectiveTimeoutSeconds"   # a calm step, automatic
    assert fixed.near_limit(3.0, 5.0) == "faultTolerance.collectiveTimeoutSeconds"
    assert fixed.near_limit(31.0, 60) == "faultTolerance.processGroupTimeoutSeconds"
    assert over.near_limit(50.0, 90) == "faultTolerance.collectiveTimeoutSeconds"  # it sets the long one too


@pytest.mark.dist
def test_a_first_step_near_the_process_group_timeout_is_a_warning_naming_the_field(tmp_path):
    """Rank 0 stops 3.5 s before its second step (COHORT_FAULT_PAUSE): rank 1's step waits for it about 3.5 s
    of the 6 s the first steps of a world may wait (processGroupTimeoutSeconds), so rank 1 warns, once,
    naming the field, and the run goes on."""
    m = manifest("near", faultTolerance={"processGroupTimeoutSeconds": 6}, checkpoint={"everySteps": 0},
                 workload={"epochs": 0, "maxSteps": 20})
    s = run_local(tmp_path, m, workers=2, timeout=120, env={"COHORT_FAULT_PAUSE": "rank=0,step=1,seconds=3.5"})
    assert s["step"] == 20 and s["restarts"] == 0, s
    lines = (tmp_path / "run" / "near-worker-1.log").read_text().splitlines()
    near = [e for e in (json.loads(line) for line in lines if line.startswith("{")) if e.get("field")]
    assert len(near) == 1 and near[0]["field"] == "faultTolerance.processGroupTimeoutSeconds", near
    assert near[0]["timeout"] == 6 and 3.0 <= near[0]["seconds"] < 6 and near[0]["step"] == 2, near


def test_a_collective_fails_after_the_timeout_set_on_the_group():
    waiting, late = run_ranks(_wait_for_a_peer_that_is_late, 2, timeout_s=60)
    assert waiting["raised"], waiting
    assert 0.9 <= waiting["after"] < 3.0, waiting  # the group's own timeout is 60 s
    assert late["raised"], late  # the late one finds the group gone


@pytest.mark.dist
def test_a_silently_lost_peer_is_detected_within_the_collective_timeout(tmp_path):
    m = manifest("hang", faultTolerance={"collectiveTimeoutSeconds": 2}, checkpoint={"everySteps": 0},
                 workload={"epochs": 0, "maxSteps": 60})
    s = run_local(tmp_path, m, workers=3, env={"COHORT_FAULT_HANG": "rank=1,step=30,seconds=12"})
    assert s["step"] == 60, s
    logs = {p.stem: [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
            for p in (tmp_path / "run").glob("*.log")}
    hung = [e for e in logs["hang-worker-1"] if e.get("msg") == "fault injection: hanging, then SIGKILL self"]
    assert hung, "the fault did not fire"
    for pod in ("hang-worker-0", "hang-worker-2"):
        failed = [e for e in logs[pod] if e.get("msg") == "collective failed; waiting for the next world"]
        assert failed, f"{pod} never saw its collective fail"
        detected = failed[0]["t"] - hung[0]["t"]
        assert detected < 2 + 2.5, f"{pod} waited {detected:.1f}s for the hung peer (timeout 2 s, the hang 12 s)"
        joined = [e for e in logs[pod] if e.get("msg") == "joined world"]
        assert joined[1]["step"] == 30 and joined[1]["source"] == "peer", joined  # 0 steps lost


@pytest.mark.dist
def test_a_false_alarm_re_forms_the_same_members_in_place(tmp_path):
    """Rank 1 pauses 4 s and goes on (``COHORT_FAULT_PAUSE``): its peers' collective times out after 2 s and
    they report it. Every process is alive, so the launcher re-forms the same members under a new version
    (as the operator does, reports.py) and the job goes on at 3 ranks without a lost step or a restart.
    Without the launcher taking reports, all three waited for a world nobody would publish, exited when
    their wait ran out (``COHORT_RECOVERY_WAIT_S``) and were restarted. (A pause past twice the timeout and
    ``OVERDUE_GRACE_S`` more, 6 s here, is a hang: the test after the next.)"""
    m = manifest("pause", faultTolerance={"collectiveTimeoutSeconds": 2}, checkpoint={"everySteps": 0},
                 workload={"epochs": 0, "maxSteps": 60})
    s = run_local(tmp_path, m, workers=3, env={"COHORT_FAULT_PAUSE": "rank=1,step=30,seconds=4",
                                               "COHORT_RECOVERY_WAIT_S": "20"})
    assert s["step"] == 60 and s["restarts"] == 0, s
    reformed = [w for w in s["worlds"] if w["reason"].startswith("the same members re-form")]
    assert len(reformed) == 1 and reformed[0]["size"] == 3, s["worlds"]
    logs = {p.stem: [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
            for p in (tmp_path / "run").glob("*.log")}
    assert set(logs) == {"pause-worker-0", "pause-worker-1", "pause-worker-2"}, sorted(logs)  # nobody replaced
    paused = [e for e in logs["pause-worker-1"] if e.get("msg") == "fault injection: pausing"]
    assert paused, "the fault did not fire"
    for pod, events in logs.items():
        joined = [e for e in events if e.get("msg") == "joined world"]
        assert [e["world_version"] for e in joined] == [1, reformed[0]["version"]], (pod, joined)
        assert joined[1]["step"] == 30 and joined[1]["source"] == "peer", (pod, joined)  # 0 steps lost
        assert joined[1]["t"] - paused[0]["t"] < 5 + 5, (pod, joined)  # not the 20 s wait


@pytest.mark.dist
def test_a_member_hung_in_a_step_is_killed_once_past_its_deadline_not_after_the_rendezvous_timeout(tmp_path):
    """Rank 1 sleeps for good in step 30 (``COHORT_FAULT_HANG`` with 600 s), its metrics thread answering. Its
    peers' collective times out (2 s); every process being alive, the launcher re-forms the same members, and
    reads each member's /progress: rank 1 is still in world 1's step, past the deadline it gave it (twice the
    2 s timeout), so it is hung: killed, and the next world goes on without it, seconds after the fault.
    Before, its peers waited the re-formed world's rendezvous timeout (60 s here) out, then named it absent."""
    m = manifest("hung", faultTolerance={"collectiveTimeoutSeconds": 2, "processGroupTimeoutSeconds": 60},
                 checkpoint={"everySteps": 0}, workload={"epochs": 0, "maxSteps": 60})
    s = run_local(tmp_path, m, workers=3, timeout=200, env={"COHORT_FAULT_HANG": "rank=1,step=30,seconds=600"})
    assert s["step"] == 60 and s["restarts"] == 1, s
    worlds = s["worlds"]
    assert worlds[1]["reason"].startswith("the same members re-form"), worlds
    assert worlds[2]["reason"].startswith("worker hung-worker-1 failed"), worlds
    logs = {p.stem: [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
            for p in (tmp_path / "run").glob("*.log")}
    hung = [e for e in logs["hung-worker-1"] if e.get("msg") == "fault injection: hanging, then SIGKILL self"]
    assert hung, "the fault did not fire"
    assert worlds[2]["t"] - hung[0]["t"] < 20, (worlds, hung[0])  # 2 x 2 s + the grace, not the 60 s wait
    for pod in ("hung-worker-0", "hung-worker-2"):
        assert not [e for e in logs[pod] if e.get("absent")], pod  # nobody waited the rendezvous out
        joined = [e for e in logs[pod] if e.get("msg") == "joined world"]
        assert joined[-1]["step"] == 30 and joined[-1]["source"] == "peer" and joined[-1]["size"] == 2, joined


@pytest.mark.dist
def test_a_frozen_rank_0_never_answers_the_re_formed_world_and_is_killed_and_replaced(tmp_path):
    """Rank 0 stops itself for good at step 30 (``COHORT_FAULT_FREEZE``: SIGSTOP, its rendezvous store's thread
    and its metrics thread too, whose ports the kernel still accepts connections on). Its peers' collective
    times out (2 s) and, every process being alive, the launcher re-forms the same members; rank 0's store never
    answers, its peers give up after the rendezvous timeout (8 s here) and report it absent, and the launcher
    kills it: a world without it, then its replacement. Before, the peers' rendezvous timeout ended their
    processes, and a frozen rank 0's peers waited on its store's unanswered ping for good."""
    name, lost, error = "frozen", 0, "rank 0's rendezvous store"
    m = manifest(name, faultTolerance={"collectiveTimeoutSeconds": 2, "processGroupTimeoutSeconds": 8},
                 checkpoint={"everySteps": 0}, workload={"epochs": 0, "maxSteps": 60})
    s = run_local(tmp_path, m, workers=3, timeout=200, env={"COHORT_FAULT_FREEZE": "rank=0,step=30"})
    assert s["step"] == 60 and s["restarts"] == 1, s
    reasons = [w["reason"] for w in s["worlds"]]
    assert reasons[1].startswith("the same members re-form"), reasons
    assert reasons[2].startswith(f"worker {name}-worker-{lost} failed"), reasons
    logs = {p.stem: [json.loads(line) for line in p.read_text().splitlines() if line.startswith("{")]
            for p in (tmp_path / "run").glob("*.log")}
    for pod in (f"{name}-worker-{r}" for r in range(3) if r != lost):
        absent = [e for e in logs[pod] if e.get("msg") == "collective failed; waiting for the next world"
                  and e.get("absent")]
        assert absent and absent[0]["absent"] == [f"{name}-worker-{lost}"], (pod, absent)
        assert error in absent[0]["error"] and "within 8s" in absent[0]["error"], absent[0]  # the job's timeout
        joined = [e for e in logs[pod] if e.get("msg") == "joined world"]
        assert joined[1]["step"] == 30 and joined[1]["source"] == "peer" and joined[1]["size"] == 2, joined


@pytest.mark.dist
def test_time_based_checkpoints_of_a_sharded_plan_are_taken_together(tmp_path):
    """checkpoint.everySeconds is agreed by the ranks (``Trainer._due_by_seconds``): a sharded save is a
    collective, and ranks whose clocks started apart would otherwise enter it at different steps (one rank
    in the save's collectives, the other in the next step's) and hang or fail."""
    m = manifest("secs", parallelism={"strategy": "fsdp"}, checkpoint={"everySteps": 0, "everySeconds": 1},
                 workload={"epochs": 0, "maxSteps": 800})
    ck = tmp_path / "ck"
    s = run_local(tmp_path, m, workers=2, ckpt=ck, timeout=150)
    assert s["step"] == 800, s
    saved = sorted(p.parent for p in (ck / "secs").glob("step-*/COMMITTED"))
    assert len(saved) == 3 and saved[-1].name == "step-00000800", saved  # keep: 3, the last the final one
    for step in saved:  # without the agreement: rank 0's shard in one step's directory, rank 1's in another's
        shards = sorted(p.name.split("_")[2] for p in step.glob("__*_*.distcp"))
        assert shards == ["0", "1"], f"{step.name} holds the shards of ranks {shards}"


def test_an_elastic_gpu_worker_keeps_its_process_when_nccl_fails():
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    env: dict[str, str] = {}
    assert keep_process_on_nccl_errors(gpu, True, env) and env == {NCCL_ERROR_HANDLING: "2"}
    mine = {NCCL_ERROR_HANDLING: "1"}
    assert not keep_process_on_nccl_errors(gpu, True, mine) and mine[NCCL_ERROR_HANDLING] == "1"  # the job's wins
    for device, elastic in ((gpu, False), (cpu, True)):  # torchrun-style, or no NCCL: torch's default stays
        env = {}
        assert not keep_process_on_nccl_errors(device, elastic, env) and env == {}
