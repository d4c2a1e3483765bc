"""Real multi-process training on CPU/gloo through `cohort run --local` (marker dist)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.support.local import (
    cohort,
    final_model,
    kill_tree,
    manifest,
    run_local,
    start_local,
    wait_for_file,
    write_manifest,
)

pytestmark = [pytest.mark.dist]


@pytest.mark.slow
def test_digits_example_reaches_96_percent_within_60s(tmp_path):
    proc = cohort("run", "examples/digits.yaml", "--local", "--workers", "4", "--run-dir", str(tmp_path / "run"),
                  "--summary-json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["accuracy"] >= 0.96, s
    assert s["wallSeconds"] <= 60, s
    assert "test accuracy" in proc.stdout and "checkpoints" in proc.stdout
    etas = [int(m) for m in re.findall(r" eta (\d+)s", proc.stderr)]  # the progress lines: the trainer's etaSeconds
    assert etas and etas[-1] <= etas[0] <= 120, etas


def test_a_second_run_in_the_same_run_dir_follows_its_own_world_and_reports_its_own_result(tmp_path):
    """`cohort run --local --run-dir D` twice: the first run's world file and results are not the second's."""
    short = {"epochs": 0, "maxSteps": 10}
    assert run_local(tmp_path, manifest("again", workload=short, checkpoint={"everySteps": 0}), workers=2)["step"] == 10
    again = run_local(tmp_path, manifest("again", workload={**short, "maxSteps": 20}, checkpoint={"everySteps": 0}),
                      workers=2)
    assert again["step"] == 20 and again["restarts"] == 0 and again["worldVersions"] == 1, again


@pytest.mark.slow
def test_resume_after_every_worker_is_killed_is_bitwise_exact(tmp_path):
    m = manifest("exact", workload={"epochs": 0, "maxSteps": 60}, checkpoint={"everySteps": 20})
    reference = run_local(tmp_path / "a", m, workers=2, ckpt=tmp_path / "a-ck")
    assert reference["step"] == 60
    # The summary names the final checkpoint (the operator's status takes it from there at the end).
    assert reference["lastCheckpoint"]["step"] == 60, reference.get("lastCheckpoint")
    assert (tmp_path / "a-ck/exact/step-00000060/COMMITTED").is_file()

    ck = tmp_path / "b-ck"
    (tmp_path / "b").mkdir()
    # Every worker SIGKILLs itself at step 50, after the checkpoints of steps 20 and 40 were started: a kill
    # at a known step (the test used to SIGKILL them once step 40's marker appeared, and on a loaded machine
    # the asynchronous commit of 40 landed after the run had reached 60). Without replacements, the launcher
    # then gives up.
    proc = start_local(tmp_path / "b", m, workers=2, ckpt=ck, extra=["--no-replace"],
                       env={"COHORT_FAULT_KILL": "rank=all,step=50"})
    assert proc.wait(timeout=240) != 0
    kill_tree(proc)
    committed = sorted(p.parent.name for p in (ck / "exact").glob("step-*/COMMITTED"))
    assert committed and committed[-1] in ("step-00000020", "step-00000040"), committed

    (tmp_path / "c").mkdir()
    resumed = run_local(tmp_path / "c", m, workers=2, ckpt=ck)
    assert resumed["step"] == 60
    logs = "".join(p.read_text() for p in (tmp_path / "c/run").glob("*.log"))
    assert '"resumed from checkpoint"' in logs
    a, b = final_model(tmp_path / "a-ck/exact"), final_model(ck / "exact")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"


@pytest.mark.slow
def test_resume_at_a_smaller_world_meets_the_target(tmp_path):
    m = manifest("shrink", checkpoint={"everySteps": 50})
    ck = tmp_path / "ck"
    (tmp_path / "a").mkdir()
    proc = start_local(tmp_path / "a", m, workers=4, ckpt=ck, extra=["--no-replace"])
    wait_for_file(ck / "shrink/step-00000100/COMMITTED")
    kill_tree(proc)
    (tmp_path / "b").mkdir()
    s = run_local(tmp_path / "b", m, workers=2, ckpt=ck)
    logs = "".join(p.read_text() for p in (tmp_path / "b/run").glob("*.log"))
    assert '"resumed from checkpoint"' in logs and '"size": 2' in logs
    assert s["accuracy"] >= 0.96, s


@pytest.mark.slow
def test_a_ready_spare_is_promoted_in_the_world_that_drops_the_killed_worker(tmp_path):
    m = manifest("spare", replicas={"spares": 1}, workload={"epochs": 12})
    s = run_local(tmp_path, m, workers=4, env={"COHORT_FAULT_KILL": "rank=2,step=60"})
    assert s["step"] == 132, s  # trained to the end: 12 epochs x 11 steps of 4 x 32 samples
    assert [w["size"] for w in s["worlds"]][:2] == [4, 4], s["worlds"]
    assert "spare spare-worker-4 promoted" in s["worlds"][1]["reason"], s["worlds"]
    spare = [json.loads(line) for line in (tmp_path / "run/spare-worker-4.log").read_text().splitlines()
             if '"joined world"' in line]
    assert spare[0]["world_version"] == 2 and spare[0]["size"] == 4
    assert spare[0]["step"] == 60 and spare[0]["source"] == "peer", spare  # state from the survivors: 0 lost


@pytest.mark.parametrize("sync", [None, {"algorithm": "localsgd", "period": 8, "outerOptimizer": {"name": "nesterov"}}],
                         ids=["allreduce", "diloco"])
def test_a_worker_lost_in_the_final_evaluation_is_recovered_from_and_the_job_finishes(tmp_path, sync):
    """Rank 1 dies after the last step, as the job's end starts (the benchmark of issue 31 met it with a kill
    every 15 s: rank 0's evaluation collective failed and the whole job exited 2). With DiLoCo (rounds after steps
    10, 18, 26) the end's round fails with it: the next world, the survivor and the promoted spare, goes on with
    the outer step of the round of 26 and takes the end's round again."""
    m = manifest("lastkill", replicas={"spares": 1}, workload={"epochs": 0, "maxSteps": 30},
                 **({"sync": sync} if sync else {}))
    s = run_local(tmp_path, m, workers=2, env={"COHORT_FAULT_KILL": "rank=1,step=30"})
    assert s["step"] == 30 and s["accuracy"] > 0, s
    assert len(s["worlds"]) >= 2 and "promoted" in s["worlds"][1]["reason"], s["worlds"]
    log = (tmp_path / "run/lastkill-worker-0.log").read_text()
    assert '"fault injection: SIGKILL self"' in (tmp_path / "run/lastkill-worker-1.log").read_text()
    joined = [json.loads(line) for line in log.splitlines() if '"joined world"' in line]
    assert [j["step"] for j in joined] == [0, 30], joined  # the second world trains no step, only finishes
    if sync:
        continued = [json.loads(line)["round"] for line in log.splitlines() if '"outer step continues"' in line]
        assert continued == [26], continued
        ends = [json.loads(line) for line in log.splitlines() if '"replicas made one at the end of training"' in line]
        assert [(e["world_version"], e["rounds"]) for e in ends] == [(2, 1)], ends  # the first world's failed


@pytest.mark.slow
def test_worker_killed_mid_training_recovers_in_place_without_lost_steps(tmp_path):
    s = run_local(tmp_path, manifest("inplace"), workers=4, env={"COHORT_FAULT_KILL": "rank=2,step=100"})
    assert s["accuracy"] >= 0.96, s
    logs = {p.name: p.read_text() for p in (tmp_path / "run").glob("*.log")}
    survivor = logs["inplace-worker-0.log"]
    joined = [json.loads(line) for line in survivor.splitlines() if '"joined world"' in line]
    assert [j["world_version"] for j in joined][:2] == [1, 2]
    assert joined[1]["step"] == 100 and joined[1]["source"] == "peer"  # continued from the step it held: 0 lost
    assert joined[1]["size"] == 3
    assert '"resumed from checkpoint"' not in survivor


def test_diloco_outer_state_goes_on_through_a_lost_worker_and_a_restart(tmp_path):
    """Local SGD every 4 steps (rounds after steps 10, 14, 18, ...) with DiLoCo's outer step. Rank 1 dies
    at step 16: the survivor and the promoted spare (a newcomer, handed the state by the survivor) continue
    the outer step from the round of step 14, momentum included, instead of starting it again. The job
    ends at step 40 with the round the end of training takes (steps 39 and 40 trained since the round of 38)
    and a checkpoint; a second run from it to step 60 continues from that round, which the checkpoint holds."""
    sync = {"algorithm": "localsgd", "period": 4, "outerOptimizer": {"name": "nesterov"}}
    m = manifest("diloco", sync=sync, replicas={"spares": 1}, workload={"epochs": 0, "maxSteps": 40},
                 checkpoint={"everySteps": 20})
    ck = tmp_path / "ck"

    def continued(run: Path) -> dict[str, list[int]]:
        rounds = {p.stem: [json.loads(line)["round"] for line in p.read_text().splitlines()
                           if '"outer step continues"' in line] for p in sorted((run / "run").glob("*.log"))}
        return {name: r for name, r in rounds.items() if r}  # the spare started after the promotion never joined

    s = run_local(tmp_path / "a", m, workers=2, ckpt=ck, env={"COHORT_FAULT_KILL": "rank=1,step=16"})
    assert s["step"] == 40 and "promoted" in s["worlds"][1]["reason"], s["worlds"]
    assert continued(tmp_path / "a") == {"diloco-worker-0": [14], "diloco-worker-2": [14]}, continued(tmp_path / "a")
    m["spec"]["workload"]["maxSteps"] = 60
    s = run_local(tmp_path / "b", m, workers=2, ckpt=ck)
    assert s["step"] == 60, s
    assert continued(tmp_path / "b") == {"diloco-worker-0": [40], "diloco-worker-1": [40]}, continued(tmp_path / "b")


def test_local_sgd_between_rounds_is_checkpointed_and_evaluated_as_the_model_it_would_end_with(tmp_path):
    """Plain local SGD every 4 steps (rounds after steps 10, 14, 18, 22): at step 20 the two replicas have trained
    apart for 2 steps. Run A ends there, so its checkpoint and evaluation at 20 are of the one model the end makes
    (the replicas' average). Run B goes on to 22, saving and evaluating at 20 on the way: the same model, bit for
    bit, and the same scores, not rank 0's replica (the checkpoint) or each rank's own on its shard (the
    evaluation); its evaluation also logs how far rank 0's replica was from the average."""
    sync = {"algorithm": "localsgd", "period": 4}

    def at_20(run: Path, max_steps: int, every: dict) -> tuple[dict, dict]:
        m = manifest("between", sync=sync, workload={"epochs": 0, "maxSteps": max_steps, **every},
                     checkpoint={"everySteps": 20})
        run_local(run, m, workers=2, ckpt=run / "ck")
        evaluated = [json.loads(line) for line in (run / "run/between-worker-0.log").read_text().splitlines()
                     if '"evaluated"' in line]
        scores = {k: e[k] for e in evaluated if e["step"] == 20 for k in ("accuracy", "eval_loss", "replica_drift")
                  if k in e}
        return final_model(run / "ck/between", step=20), scores

    ended, ended_scores = at_20(tmp_path / "a", 20, {})
    between, between_scores = at_20(tmp_path / "b", 22, {"evalEverySteps": 20})
    assert ended.keys() == between.keys()
    assert all(torch.equal(ended[k], between[k]) for k in ended), [k for k in ended if not torch.equal(ended[k],
                                                                                                       between[k])]
    drift = between_scores.pop("replica_drift")  # measured before the average was evaluated; the end has none
    assert 0 < drift < 0.1 and "replica_drift" not in ended_scores, (drift, ended_scores)
    assert between_scores == ended_scores and ended_scores, (between_scores, ended_scores)


def test_bad_inputs_exit_2_naming_the_field_or_module(tmp_path):
    cases = {
        "unknown model": ({"workload": {"model": "resnet9000"}}, "spec.workload.model"),
        "unknown dataset": ({"workload": {"dataset": "imagenet"}}, "spec.workload.dataset"),
        "entry point import fails": ({"workload": {"model": "no_such_pkg.models:build"}}, "no_such_pkg"),
        "entry point missing function": ({"workload": {"model": "json:no_such_fn"}}, "no_such_fn"),
    }
    for what, (spec, needle) in cases.items():
        mf = write_manifest(tmp_path / "m.yaml", manifest("bad", **spec))
        doc = cohort("validate", str(mf))
        if doc.returncode == 0:  # valid shape; the failure comes when the worker builds the workload
            from cohort.api.jobconfig import load_manifest

            (tmp_path / "job.json").write_text(json.dumps(load_manifest(mf).to_document()))
            doc = cohort("train", "--config", str(tmp_path / "job.json"),
                         env={"COHORT_PATH_MAP": json.dumps({"/checkpoints": str(tmp_path / "ck")})})
        assert doc.returncode == 2, f"{what}: {doc.stderr[-2000:]}"
        assert needle in doc.stderr, f"{what}: {doc.stderr[-2000:]}"

    (tmp_path / "malformed.json").write_text("{oops")
    p = cohort("train", "--config", str(tmp_path / "malformed.json"))
    assert p.returncode == 2 and "not valid JSON" in p.stderr

    from cohort.api.jobconfig import load_manifest

    (tmp_path / "file").write_text("not a directory")
    mf = write_manifest(tmp_path / "m.yaml", manifest("ck", checkpoint={"path": str(tmp_path / "file" / "sub")}))
    (tmp_path / "job.json").write_text(json.dumps(load_manifest(mf).to_document()))
    p = cohort("train", "--config", str(tmp_path / "job.json"))
    assert p.returncode == 2 and "spec.checkpoint.path" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_bf16_autocast_trains(tmp_path):
    s = run_local(tmp_path, manifest("bf16", workload={"precision": "bf16", "epochs": 10}), workers=2)
    assert s["accuracy"] >= 0.9, s


@pytest.mark.slow
def test_runs_under_torchrun_with_its_env(tmp_path):
    """No COHORT_WORLD: RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from torchrun give a static world."""
    import subprocess
    import sys

    from cohort.api.jobconfig import from_manifest

    doc = from_manifest(manifest("tr", workload={"epochs": 5}, checkpoint={"everySteps": 0})).to_document()
    (tmp_path / "job.json").write_text(json.dumps(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", "127.0.0.1:29871", "-m", "cohort.trainer.cli", "train", "--config",
         str(tmp_path / "job.json")],
        capture_output=True, text=True, timeout=240,
        env={**__import__("os").environ, "COHORT_PATH_MAP": json.dumps({"/checkpoints": str(tmp_path / "ck")})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [json.loads(line) for line in proc.stderr.splitlines()
            if line.startswith("{") and '"training complete"' in line]
    assert len(done) == 2 and {d["rank"] for d in done} == {0, 1}
    assert done[0]["accuracy"] > 0.9


@pytest.mark.slow
def test_eta_at_half_way_is_the_rest_at_the_rate_so_far(tmp_path):
    """The trainer's etaSeconds (status.progress.etaSeconds, the ETA column), read when half the steps are
    done, against the steps left at the rate the run had kept from its first step to that reading (rank 0's
    "first step in world" record says when that was): the launcher's progress lines carry it.

    Not against the time the second half then took: that also measures how the machine's speed changed after
    the reading, which no estimate can know. On 2 cores shared with the local cluster's daemons the second half
    ran 34 % faster than the first (ETA 32 s, 23.9 s left; 14 % on a quiet machine), so that comparison failed
    on a correct ETA. A wrong one is off by far more, whatever the machine does: with the per-rank batch for
    the global one, ETA 14 s against 30.4 s at the rate so far. The run is stopped once the ETA is read: the
    second half says nothing more."""
    m = manifest("eta", workload={"epochs": 0, "maxSteps": 3000, "evalEveryEpochs": 0,
                                  "modelArgs": {"hidden": 1024, "depth": 2}}, checkpoint={"everySteps": 0})
    mf = write_manifest(tmp_path / "eta.yaml", m)
    proc = subprocess.Popen([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers",
                             "2", "--run-dir", str(tmp_path / "run")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    half: tuple[float, int, int, int] | None = None  # when read, the step, the last step, the ETA
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        found = re.search(r"step (\d+)/(\d+) .* eta (\d+)s", line)
        if found and int(found[1]) >= int(found[2]) / 2:
            half = (time.time(), int(found[1]), int(found[2]), int(found[3]))
            proc.terminate()  # cohort run --local stops its workers on SIGTERM (cli.py)
            break
    proc.communicate(timeout=60)  # the rest of its output, so its shutdown never waits on a full pipe
    assert half is not None, "".join(lines[-30:])
    records = [json.loads(x) for p in (tmp_path / "run").glob("*.log") for x in p.read_text().splitlines()
               if '"rank": 0' in x and '"first step in world"' in x]
    first = records[0]
    read_at, step, last, eta = half
    so_far = read_at - first["t"]
    assert so_far > 5, f"the first half took {so_far:.1f} s: too short to judge an ETA"
    expected = (last - step) * so_far / (step - first["step"])
    print(f"ETA {eta} s at step {step}/{last}: {expected:.1f} s at the rate so far")
    assert abs(eta - expected) <= 0.25 * expected, f"ETA {eta} s at step {step}, {expected:.1f} s at the rate so far"
