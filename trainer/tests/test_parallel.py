"""Every parallelism strategy trains the transformer like data parallelism does (marker dist).

Each run is the real Trainer as ``cohort run --local`` runs it (RUNS, on shared worker
processes; the planner's choice, the resume and the elastic run go through ``cohort run --local``
itself): the transformer (dim 32, 2 layers, 4 heads) on synthetic-lm, 30 AdamW steps, the same
seed and the same *global* batch of 32 sequences (per-rank batch 16 where dp = 2, 32 where dp = 1), lr not
rescaled. The tolerance: the final evaluation loss is within 1% (relative) of
data parallelism's. The strategies compute the same mathematics (sharded or
split differently), so in practice they agree to about 1e-4; 1% leaves room for
reduction-order differences without hiding a wrong gradient (a missing dp
average or a dropped microbatch moves it by far more).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from gloo_ranks import run_jobs
from tests.support.local import cohort, run_local, write_manifest

from cohort.api.jobconfig import from_manifest
from cohort.trainer.parallel.activation_probe import ProbeBatch
from cohort.trainer.parallel.memory_budget import memory_profile
from cohort.trainer.planner.dims import ParallelDims
from cohort.trainer.planner.memory import memory_per_device
from cohort.trainer.planner.profile import ModelProfile
from cohort.trainer.profiling import profile_spec
from cohort.trainer.workloads.workload import build_workload

pytestmark = [pytest.mark.dist]

TOLERANCE = 0.01
GLOBAL_BATCH = 32
STEPS = 30


def lm_manifest(name: str, strategy: str, *, dp: int, tensor: int = 1, pipeline: int = 1, microbatches: int = 4,
                schedule: str = "1f1b", steps: int = STEPS, every: int = 0, ac: str = "none") -> dict:
    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"workload": {"model": "transformer", "dataset": "synthetic-lm", "epochs": 0, "maxSteps": steps,
                                  "batchSize": GLOBAL_BATCH // dp,
                                  "modelArgs": {"dim": 32, "n_layers": 2, "n_heads": 4},
                                  "optimizer": {"name": "adamw", "lr": 0.01, "lrScaling": "none"},
                                  "activationCheckpointing": ac},
                     # admission wants min and max to be multiples of tensor x pipeline
                     "replicas": {"min": tensor * pipeline, "max": 8, "target": max(2, tensor * pipeline)},
                     "parallelism": {"strategy": strategy, "tensor": tensor, "pipeline": pipeline,
                                     "microbatches": microbatches, "schedule": schedule},
                     "checkpoint": {"everySteps": every, "keep": 5}}}


def logs(run: Path) -> list[dict]:
    return [{**json.loads(line), "_file": p.name} for p in sorted(run.glob("*.log"))
            for line in p.read_text().splitlines() if line.startswith("{")]


CASES = {
    "fsdp": (2, dict(strategy="fsdp", dp=2), "dp=2 tp=1 pp=1 fsdp"),
    "tensor": (2, dict(strategy="tensor", dp=1, tensor=2), "dp=1 tp=2 pp=1"),
    "pipeline": (2, dict(strategy="pipeline", dp=1, pipeline=2), "dp=1 tp=1 pp=2 mb=4 1f1b"),
    "hybrid": (4, dict(strategy="hybrid", dp=1, tensor=2, pipeline=2, schedule="gpipe"),
               "dp=1 tp=2 pp=2 mb=4 gpipe"),
}


def clipped(m: dict) -> dict:
    """SGD with a clip well under the gradient's norm: unlike Adam, SGD's step follows the clipped norm,
    so a norm computed per shard (not over the whole model) moves the loss."""
    m["spec"]["workload"]["optimizer"] = {"name": "sgd", "lr": 2.0, "momentum": 0.9, "lrScaling": "none",
                                          "gradClipNorm": 0.1, "schedule": "cosine", "minLrRatio": 0.1}
    return m


# Every strategy's run and its data-parallel reference, plain and clipped, as (name, workers, manifest). They
# run one after another on the same 4 worker processes (gloo_ranks.run_jobs; a 2-worker run leaves ranks 2
# and 3 idle), less the launcher (its elastic path is the last two tests' below): 10 runs of new processes
# paid the imports 26 times over on 2 cores.
# Activation checkpointing under FSDP2 (full) and under tensor parallelism in pipeline stages (selective,
# which keeps the all-reduces' outputs): the same losses as the same plan without it.
CHECKPOINTED = {"fsdp": "full", "hybrid": "selective"}


def fitted_auto(name: str) -> dict:
    """FSDP on 2 ranks in bf16 with activationCheckpointing auto, on a device (a CPU worker's: the pod's memory
    limit) that holds the plan with selective checkpointing as bf16 keeps it (measured here as the trainer
    measures it), but neither without checkpointing nor with selective as the planner's fp32 count has it: the
    trainer must measure its blocks on its samples, in bf16 with FSDP's bf16 parameters, and choose selective."""
    m = lm_manifest(name, "fsdp", dp=2, ac="auto")
    m["spec"]["workload"]["precision"] = "bf16"
    spec, dims = from_manifest(m).spec, ParallelDims(dp=2)
    w = build_workload(spec)
    measured, _why = memory_profile(spec, w.model, dims, torch.device("cpu"), ProbeBatch.of(w))
    assert measured is not None

    def need(profile: ModelProfile, ac: str) -> float:
        return memory_per_device(profile, replace(dims, ac=ac), GLOBAL_BATCH).total
    low, high = need(measured, "selective"), min(need(measured, "none"), need(profile_spec(spec), "selective"))
    assert low < high
    m["spec"]["resources"] = {"limits": {"memory": str(int((low + high) / 2))}}
    return m


RUNS = [(f"{prefix}{name}", workers, change(lm_manifest(name, **kwargs)))
        for prefix, change in (("", lambda m: m), ("clipped-", clipped))
        for name, (workers, kwargs, _plan) in {"data": (2, dict(strategy="data", dp=2), ""), **CASES}.items()] + [
    (f"{name}-{ac}", CASES[name][0], lm_manifest(f"{name}-{ac}", **CASES[name][1], ac=ac))
    for name, ac in CHECKPOINTED.items()] + [("fsdp-auto", 2, fitted_auto("fsdp-auto"))]


@pytest.fixture(scope="module")
def runs() -> dict[str, dict]:
    """Rank 0's summary of every run in RUNS (what `cohort run --local` reports)."""
    return run_jobs(RUNS, timeout_s=600)


@pytest.fixture(scope="module")
def reference(runs) -> dict:
    """Data parallelism (DDP) on 2 ranks: the loss every strategy must reach."""
    s = runs["data"]
    assert s.get("step") == STEPS and s["eval_loss"] < 2.5, s  # it learned (ln 64 = 4.16 at the start)
    return s


@pytest.mark.parametrize("name", list(CASES))
def test_strategy_reaches_the_data_parallel_loss(runs, reference, name):
    s = runs[name]
    assert s.get("step") == STEPS and s["plan"] == CASES[name][2], s
    assert s["eval_loss"] == pytest.approx(reference["eval_loss"], rel=TOLERANCE), (s, reference)


@pytest.mark.parametrize("name", list(CHECKPOINTED))
def test_checkpointed_blocks_train_the_plans_own_losses(runs, name):
    plain, checkpointed = runs[name], runs[f"{name}-{CHECKPOINTED[name]}"]
    ac = CHECKPOINTED[name]
    assert checkpointed.get("step") == STEPS and checkpointed["plan"] == f"{plain['plan']} ac={ac}", checkpointed
    assert (plain["activationCheckpointing"], checkpointed["activationCheckpointing"]) == ("none", ac)
    assert checkpointed["eval_loss"] == plain["eval_loss"] and checkpointed["loss"] == plain["loss"]


def test_auto_checkpoints_as_far_as_the_pods_memory_needs_as_measured_in_bf16(runs):
    auto = runs["fsdp-auto"]
    assert (auto.get("step"), auto["plan"], auto["activationCheckpointing"], auto["precision"]) == \
        (STEPS, f"{CASES['fsdp'][2]} ac=selective", "selective", "bf16"), auto
    assert auto["eval_loss"] < 2.5  # it learned (ln 64 = 4.16 at the start)


@pytest.fixture(scope="module")
def clipped_reference(runs) -> dict:
    s = runs["clipped-data"]
    assert s.get("step") == STEPS and s["eval_loss"] < 3.5, s  # it learned (ln 64 = 4.16 at the start)
    return s


@pytest.mark.parametrize("name", list(CASES))
def test_clipping_by_the_global_norm_matches_data_parallel(runs, clipped_reference, name):
    s = runs[f"clipped-{name}"]
    assert s.get("step") == STEPS and s["plan"] == CASES[name][2], s
    assert s["eval_loss"] == pytest.approx(clipped_reference["eval_loss"], rel=TOLERANCE), (s, clipped_reference)


def test_auto_runs_the_planners_choice(tmp_path, reference):
    # 2.5 MiB per device rules out the replicated plans of this model (about 3.0 MiB with AdamW and the
    # activations), so the planner has to pick a sharded one; the job must say which and train like DDP.
    from cohort.trainer.planner.hardware import Hardware, save_hardware

    defaults = save_hardware(Hardware(), tmp_path / "calibration.json")  # not this machine's own file
    s = run_local(tmp_path, lm_manifest("auto", "auto", dp=2), workers=2,
                  env={"COHORT_DEVICE_MEMORY": "2.5MiB", "COHORT_CALIBRATION": str(defaults)})
    chosen = [r for r in logs(tmp_path / "run") if r["msg"] == "auto plan chosen"]
    assert chosen, "rank 0 logs the planner's choice"
    assert "ddp" not in chosen[0]["plan"] and chosen[0]["ranking"][2].lstrip().startswith("1")
    assert s["plan"] == "auto: " + chosen[0]["plan"], (s, chosen[0])
    assert s["eval_loss"] == pytest.approx(reference["eval_loss"], rel=TOLERANCE), (s, reference)


def test_tensor_parallel_resumes_at_a_smaller_dp(tmp_path):
    """dp=2 x tp=2 on 4 workers checkpoints; dp=1 x tp=2 on 2 workers resumes from it (DCP reshards)."""
    ck = tmp_path / "ck"
    first = run_local(tmp_path / "a", lm_manifest("resume", "tensor", dp=2, tensor=2, steps=10, every=10),
                      workers=4, ckpt=ck)
    assert first["step"] == 10 and first["plan"] == "dp=2 tp=2 pp=1 fsdp"
    m = lm_manifest("resume", "tensor", dp=2, tensor=2, steps=20, every=10)
    second = run_local(tmp_path / "b", m, workers=2, ckpt=ck)
    assert second["step"] == 20 and second["plan"] == "dp=1 tp=2 pp=1"
    resumed = [r for r in logs(tmp_path / "b/run") if r["msg"] == "resumed from checkpoint"]
    assert len(resumed) == 2 and {r["step"] for r in resumed} == {10}
    assert second["eval_loss"] < first["eval_loss"]


@pytest.mark.slow
def test_fsdp_survives_a_worker_death_by_reloading_the_newest_checkpoint(tmp_path):
    """A worker is killed at step 12: the survivor re-forms dp=1 and loads the step-10 checkpoint,
    the replacement joins (dp=2 again, from the newest checkpoint), and the job completes."""
    m = lm_manifest("elastic", "fsdp", dp=2, steps=30, every=5)
    s = run_local(tmp_path, m, workers=2, env={"COHORT_FAULT_KILL": "rank=1,step=12"})
    assert s["step"] == 30 and s["worldVersions"] >= 2, s
    records = logs(tmp_path / "run")
    joined = [r for r in records if r["msg"] == "joined world" and r.get("world_version", 1) > 1]
    assert joined and all(r["source"] == "checkpoint" for r in joined), joined
    assert any(r["plan"] == "dp=1 tp=1 pp=1" for r in joined)
    assert s["eval_loss"] < 2.5
    # Rank 0 went back to a checkpoint in its own process: its ledger ran the steps it redid twice (the operator
    # counts those as lost work), each world's first step aside. A world's redone steps are those from its first
    # step up to the step reached before the world was left.
    rank0 = [r for r in logs(tmp_path / "run") if r.get("_file") == "elastic-worker-0.log"]
    redone, left = 0, None
    for r in rank0:
        if r["msg"] == "left world":
            left = r["step"]
        elif r["msg"] == "first step in world" and left is not None:
            redone, left = redone + max(0, left - r["step"] + 1), None
    worlds = sum(r["msg"] == "first step in world" for r in rank0)
    assert redone >= 2 and s["ledger"]["stepsRun"] == 30 - worlds + redone, (s["ledger"], redone, worlds)


def test_a_world_that_tp_x_pp_does_not_divide_is_refused(tmp_path):
    mf = write_manifest(tmp_path / "j.yaml", lm_manifest("bad", "tensor", dp=1, tensor=2))
    proc = cohort("run", str(mf), "--local", "--workers", "3")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: spec.parallelism: a world of 3 ranks is not a multiple of tensor x pipeline = 2 x 1; "
        "run a multiple of 2 workers (the operator keeps the rest as spares)"]


def test_a_model_without_a_split_is_refused_before_training(tmp_path):
    m = lm_manifest("conv", "pipeline", dp=1, pipeline=2)
    m["spec"]["workload"].update(model="convnet", dataset="digits", modelArgs={})
    mf = write_manifest(tmp_path / "j.yaml", m)
    cfg = tmp_path / "job.json"
    from cohort.api.jobconfig import load_manifest

    cfg.write_text(json.dumps(load_manifest(mf).to_document()))
    proc = cohort("train", "--config", str(cfg))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: spec.parallelism.pipeline: no stage split for ConvNet (built-in: transformer); "
        "use strategy data, fsdp or tensor")
