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


def test_a_changed_seed_on_resume_finishes_the_epoch_in_its_order_then_reseeds(caplog):
    """Issue 32: a resumed job whose spec.workload.seed changed used the new seed's permutation from the
    saved offset on, so the epoch in progress trained some samples twice and skipped others. Now the epoch
    in progress keeps the order it began with (the position carries its seed), later epochs follow the new
    seed, and the log says so."""
    old = ElasticSampler(100, 5, seed=0)
    before = consume(old, 4, 2)  # 40 samples of epoch 0, seed 0
    resumed = ElasticSampler(100, 5, seed=7)
    with caplog.at_level("WARNING", logger="cohort.trainer.sampler"):
        resumed.load_state_dict(old.state_dict())
    after = consume(resumed, 3, 4)  # 60 more: the rest of epoch 0, at another world size
    assert sorted(before + after) == list(range(100)), "the epoch is no longer one permutation"
    assert "spec.workload.seed is 7" in caplog.text and "epochs from 1 on follow seed 7" in caplog.text
    resumed.next_epoch()
    fresh = ElasticSampler(100, 5, seed=7)
    fresh.next_epoch()
    assert torch.equal(resumed._permutation(), fresh._permutation())  # epoch 1 on: the new seed's order
    # A position taken after the re-seed carries the epoch's own seed on: resuming it again is exact.
    again = ElasticSampler(100, 5, seed=7)
    again.load_state_dict(resumed.state_dict())
    assert torch.equal(again._permutation(), fresh._permutation())
    # Mid-epoch after the re-seed, a checkpoint still orders the rest of epoch 0 by seed 0.
    mid = ElasticSampler(100, 5, seed=0)
    consume(mid, 4, 1)
    third = ElasticSampler(100, 5, seed=7)
    third.load_state_dict(mid.state_dict())
    saved = third.state_dict()
    assert saved["seed"] == 0
    fourth = ElasticSampler(100, 5, seed=7)
    fourth.load_state_dict(saved)
    assert torch.equal(fourth.indices(0, 2), mid.indices(0, 2))


def test_a_position_at_the_start_of_an_epoch_takes_the_new_seed_at_once():
    old = ElasticSampler(100, 5, seed=0)
    old.next_epoch()  # epoch 1, offset 0: nothing of it trained yet
    resumed = ElasticSampler(100, 5, seed=7)
    resumed.load_state_dict(old.state_dict())
    fresh = ElasticSampler(100, 5, seed=7)
    fresh.next_epoch()
    assert torch.equal(resumed._permutation(), fresh._permutation())
