"""The elastic sampler: every sample once per epoch, exact position across world-size changes."""

from __future__ import annotations

import torch

from cohort.trainer.sampler import ElasticSampler


def consume(s: ElasticSampler, world: int, steps: int) -> list[int]:
    seen = []
    for _ in range(steps):
        for r in range(world):
            seen += s.indices(r, world).tolist()
        s.advance(world)
    return seen


def test_epoch_covers_samples_once_even_when_world_changes():
    s = ElasticSampler(num_samples=100, batch_size=5, seed=3)
    seen = consume(s, 4, 2) + consume(s, 2, 3) + consume(s, 3, 1)  # 40 + 30 + 15 samples
    assert len(seen) == len(set(seen)) == 85
    assert s.steps_left_in_epoch(3) == 1 and not s.epoch_done(3)
    consume(s, 3, 1)
    assert s.epoch_done(3)


def test_state_dict_resumes_exactly():
    a = ElasticSampler(200, 8, seed=1)
    consume(a, 2, 5)
    b = ElasticSampler(200, 8, seed=1)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.indices(1, 2), b.indices(1, 2))
    a.next_epoch()
    b.next_epoch()
    assert torch.equal(a.indices(0, 4), b.indices(0, 4))
    assert not torch.equal(a._permutation(), ElasticSampler(200, 8, seed=2)._permutation())
