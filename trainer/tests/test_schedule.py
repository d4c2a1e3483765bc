"""The learning-rate schedule (optimizer.schedule, minLrRatio, warmupSteps) and clipping by the global norm."""

from __future__ import annotations

import math

import pytest
import torch
from tests.support.specs import with_workload

from cohort.api import TrainingJobSpec, parse
from cohort.trainer.optim import decay, lr_at
from cohort.trainer.parallel.clip import clip_grad_norm


def spec(**optimizer) -> TrainingJobSpec:
    workload = {"maxSteps": 110, "epochs": 0, "optimizer": {"lr": 1.0, "lrScaling": "none", **optimizer}}
    return parse(TrainingJobSpec, with_workload({"workload": workload, "replicas": {"min": 1, "target": 1}}))


def test_constant_is_the_default_and_does_not_decay():
    s = spec()
    assert s.workload.optimizer.schedule == "constant"
    assert [lr_at(step, 1, s) for step in (0, 50, 109)] == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("schedule, middle", [("linear", 0.55), ("cosine", 0.55)])
def test_decay_runs_from_the_end_of_warmup_to_the_floor_at_max_steps(schedule, middle):
    s = spec(schedule=schedule, warmupSteps=10, minLrRatio=0.1)
    assert lr_at(0, 1, s) == pytest.approx(0.1)      # warmup: (0 + 1) / 10
    assert lr_at(10, 1, s) == pytest.approx(1.0)     # warmup done, decay not started
    assert lr_at(60, 1, s) == pytest.approx(middle)  # halfway: 0.1 + 0.9 * 0.5 for both shapes
    assert lr_at(110, 1, s) == pytest.approx(0.1)    # the floor at maxSteps
    assert lr_at(35, 1, s) != lr_at(85, 1, s)


def test_cosine_and_linear_differ_off_the_middle():
    assert decay("cosine", 0.0, 0.25) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert decay("linear", 0.0, 0.25) == pytest.approx(0.75)
    assert decay("cosine", 0.0, 2.0) == pytest.approx(0.0)  # past the end: stays at the floor


def test_an_epoch_run_decays_over_the_epochs_done():
    s = parse(TrainingJobSpec, with_workload({"workload": {"epochs": 4, "optimizer": {
        "lr": 1.0, "lrScaling": "none", "schedule": "linear"}}, "replicas": {"min": 1, "target": 1}}))
    assert lr_at(1000, 1, s, epochs_done=1.0) == pytest.approx(0.75)  # the step count does not matter
    assert lr_at(7, 1, s, epochs_done=3.0) == pytest.approx(0.25)


def test_clipping_matches_torch_on_plain_gradients():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    theirs.load_state_dict(ours.state_dict())
    ours(torch.randn(16, 8)).pow(2).sum().backward()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        b.grad = a.grad.clone()
    before = clip_grad_norm(ours.parameters(), 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
    assert before == pytest.approx(float(expected), rel=1e-6) and before > 0.5
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5)
    assert clip_grad_norm(ours.parameters(), 100.0) == pytest.approx(0.5, rel=1e-4)  # already small: unchanged
