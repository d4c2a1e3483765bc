"""workload.globalBatchSize: the same optimisation whatever the world size (marker dist, plus unit tests)."""

from __future__ import annotations

import json

import pytest
import torch
from tests.support.local import manifest, run_local

from cohort.trainer.sampler import ElasticSampler

STEPS = 60
TOLERANCE = 0.01  # relative, on the final evaluation loss: float sums in another order, nothing more


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_every_rank_takes_a_disjoint_share_of_the_fixed_global_batch(world):
    s = ElasticSampler(num_samples=1000, batch_size=16, seed=3, global_batch_size=96)
    for _ in range(4):
        shares = [s.indices(r, world) for r in range(world)]
        step = torch.cat(shares)
        assert len(step) == 96 and len(set(step.tolist())) == 96  # every sample of the step once
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert s.micro_batches(world) * 16 >= max(map(len, shares))  # micro-batches of at most batchSize
        s.advance(world)
    assert s.offset == 4 * 96


def test_without_a_global_batch_the_shares_are_batch_size():
    s = ElasticSampler(num_samples=1000, batch_size=16, seed=3)
    assert [len(s.indices(r, 3)) for r in range(3)] == [16, 16, 16] and s.micro_batches(3) == 1
    assert torch.equal(s.indices(1, 3), s._permutation()[16:32])


def job(name: str, global_batch: int) -> dict:
    return manifest(name, workload={"epochs": 0, "maxSteps": STEPS, "batchSize": 16, "globalBatchSize": global_batch,
                                    "optimizer": {"name": "sgd", "lr": 0.05, "lrScaling": "none"}},
                    checkpoint={"everySteps": 0})


@pytest.fixture(scope="module")
def four_workers(tmp_path_factory) -> dict:
    """96 samples a step on 4 workers: 24 each, in 2 micro-batches of 12."""
    return run_local(tmp_path_factory.mktemp("four"), job("four", 96), workers=4)


@pytest.mark.dist
def test_a_fixed_global_batch_trains_the_same_on_2_and_4_workers(tmp_path, four_workers):
    two = run_local(tmp_path / "two", job("two", 96), workers=2)  # 48 each: 3 micro-batches of 16
    assert two["step"] == four_workers["step"] == STEPS
    assert two["eval_loss"] == pytest.approx(four_workers["eval_loss"], rel=TOLERANCE), (two, four_workers)
    # The control: without it the global batch follows the world (32 vs 64), and so does the loss.
    free_two = run_local(tmp_path / "f2", job("f2", 0), workers=2)
    free_four = run_local(tmp_path / "f4", job("f4", 0), workers=4)
    assert free_two["eval_loss"] != pytest.approx(free_four["eval_loss"], rel=TOLERANCE), (free_two, free_four)


@pytest.mark.dist
def test_losing_a_worker_keeps_the_loss_curve(tmp_path, four_workers):
    """Rank 2 dies at step 30: the world goes on at 3 (32 samples each, 2 micro-batches), the replacement
    joins, and the run ends where the uninterrupted one did."""
    s = run_local(tmp_path, job("lose", 96), workers=4, env={"COHORT_FAULT_KILL": "rank=2,step=30"})
    assert s["step"] == STEPS and s["worldVersion"] >= 2, s
    sizes = [json.loads(line)["size"] for line in (tmp_path / "run" / "lose-worker-0.log").read_text().splitlines()
             if '"joined world"' in line]
    assert 3 in sizes, sizes
    assert s["eval_loss"] == pytest.approx(four_workers["eval_loss"], rel=TOLERANCE), (s, four_workers)
