"""workload.optimizer.implementation: torch's foreach, fused and per-parameter kernels give the same update."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cohort.api.models import Optimizer
from cohort.trainer.trainer import build_optimizer

IMPLEMENTATIONS = ("auto", "foreach", "fused", "loop")


def train(name: str, implementation: str, steps: int = 12) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = build_optimizer(model.parameters(), Optimizer(name=name, lr=0.01, momentum=0.9, weight_decay=0.01,
                                                        implementation=implementation))
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return opt, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_every_kernel_computes_the_same_update(name):
    _, reference = train(name, "loop")
    for implementation in IMPLEMENTATIONS[:-1]:
        _, params = train(name, implementation)
        for a, b in zip(reference, params, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_kernel_asked_for_is_the_one_torch_runs(name):
    assert train(name, "fused", 1)[0].defaults["fused"] is True
    assert train(name, "foreach", 1)[0].defaults["foreach"] is True
    assert train(name, "loop", 1)[0].defaults["foreach"] is False
    assert not train(name, "auto", 1)[0].defaults.get("fused")
