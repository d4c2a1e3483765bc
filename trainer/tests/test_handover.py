"""The live-peer hand-over (handover.py): a newcomer's state equals the sender's bit for bit, and so do their next steps.

Rank 0 trains 3 steps; rank 1 only builds the same job (another seed, so nothing agrees by chance). After
TrainState.broadcast from rank 0, both hold the same parameters, optimizer state, step, data position and
RNG state, and one more identical step leaves them identical.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gloo_ranks import job_spec, run_ranks

from cohort.trainer.optim import build_optimizer
from cohort.trainer.sampler import ElasticSampler
from cohort.trainer.state import TrainState
from cohort.trainer.workloads.workload import build_workload

pytestmark = [pytest.mark.dist]


def _hand_over(rank: int, world: int) -> dict[str, Any]:
    spec = job_spec()
    w = build_workload(spec, seed=rank)
    optimizer = build_optimizer(w.model.parameters(), spec.workload.optimizer)
    sampler = ElasticSampler(len(w.data.train), 16, spec.workload.seed)
    state = TrainState(w.model, optimizer, sampler)

    def step() -> None:
        x, y = w.data.train.fetch(sampler.indices(0, 1))
        optimizer.zero_grad()
        w.loss_fn(w.model(x), y).backward()
        optimizer.step()
        sampler.advance(1)
        state.step += 1
        torch.rand(1)  # the RNG moves too

    if rank == 0:
        for _ in range(3):
            step()
    nbytes = state.broadcast(0, rank)
    step()
    return {"model": {k: v.clone() for k, v in w.model.state_dict().items()},
            "momentum": [s["momentum_buffer"].clone() for s in optimizer.state.values()],
            "step": state.step, "offset": sampler.offset, "rng": torch.get_rng_state(), "bytes": nbytes}


def test_the_newcomer_continues_bit_for_bit_from_the_senders_state():
    sender, newcomer = run_ranks(_hand_over, 2)
    assert sender["step"] == newcomer["step"] == 4 and sender["offset"] == newcomer["offset"]
    assert sender["model"].keys() == newcomer["model"].keys()
    assert all(torch.equal(sender["model"][k], newcomer["model"][k]) for k in sender["model"])
    assert len(sender["momentum"]) == len(newcomer["momentum"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(sender["momentum"], newcomer["momentum"], strict=True))
    assert torch.equal(sender["rng"], newcomer["rng"])
    params = sum(v.numel() * v.element_size() for v in sender["model"].values())
    assert params < sender["bytes"] == newcomer["bytes"]  # the tensors went through the group
