"""workload.precision and workload.compile are honoured on the CPU (CI has no GPU; bf16 autocast on the CPU is real).

One rank, no process group: the data plan over a world of one, through the same StepRunner the trainer uses.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gloo_ranks import data_plan, train_steps

from cohort.api.jobconfig import from_manifest
from cohort.trainer.step import StepRunner


def spec_with(**workload: Any) -> Any:
    return from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "p"},
                          "spec": {"workload": {"model": "mlp", "dataset": "digits", "batchSize": 16,
                                                "modelArgs": {"hidden": 64}, **workload}}}).spec


def train(spec: Any, steps: int) -> tuple[list[float], list[torch.dtype], StepRunner, torch.nn.Module]:
    """``steps`` steps on one rank; returns the losses, the dtypes the first layer computed in, the runner."""
    dp = data_plan(spec)
    dtypes: list[torch.dtype] = []
    dp.workload.model.fc1.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    return train_steps(dp, steps, 16), dtypes, dp.runner, dp.module


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16),
                                             ("fp16", torch.float16)])
def test_precision_sets_the_dtype_forward_computes_in(precision, dtype):
    losses, dtypes, runner, module = train(spec_with(precision=precision), 3)
    assert set(dtypes) == {dtype}
    assert all(p.dtype == torch.float32 for p in module.parameters())  # the weights stay fp32
    assert (runner.scaler is not None) == (precision == "fp16")
    if runner.scaler is not None:
        assert runner.scaler.get_scale() > 1.0  # fp16's dynamic loss scale is in use
    assert all(torch.isfinite(torch.tensor(losses)))


def test_bf16_trains_close_to_fp32_but_not_identically():
    fp32, _, _, _ = train(spec_with(precision="fp32"), 5)
    bf16, _, _, _ = train(spec_with(precision="bf16"), 5)
    assert fp32 != bf16  # the casts are real
    assert abs(fp32[-1] - bf16[-1]) < 0.05 * fp32[-1]


def test_compile_runs_the_model_through_torch_compile_with_eager_results():
    torch._dynamo.reset()
    eager, _, _, _ = train(spec_with(), 3)
    torch._dynamo.utils.counters.clear()
    compiled, _, _, module = train(spec_with(compile=True), 3)
    assert getattr(module, "_cohort_compiled", False)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # dynamo captured the model
    assert compiled == pytest.approx(eager, rel=1e-4)
