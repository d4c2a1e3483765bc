"""The run's length and its time estimates (progress.py), as /progress reports them."""

from __future__ import annotations

from cohort.api.models import Workload
from cohort.trainer import progress
from cohort.trainer.sampler import ElasticSampler


def workload(epochs: int, max_steps: int = 0) -> Workload:
    return Workload(model="mlp", dataset="digits", epochs=epochs, max_steps=max_steps)


def sampler_at(epoch: int, offset: int, global_batch_size: int = 0) -> ElasticSampler:
    s = ElasticSampler(num_samples=100, batch_size=10, seed=0, global_batch_size=global_batch_size)
    s.epoch, s.offset = epoch, offset
    return s


def test_an_epoch_run_ends_after_this_epochs_steps_left_and_every_later_epochs():
    # 100 samples, 2 ranks of 10: 20 a step, 5 steps an epoch; in epoch 1 of 3 with 40 consumed (3 left)
    s = sampler_at(epoch=1, offset=40)
    assert progress.total_steps(workload(3), s, step=7, dp_size=2) == 7 + 3 + 5
    assert progress.total_steps(workload(3), s, step=7, dp_size=3) == 7 + 2 + 3  # 30 a step, tail dropped
    assert progress.total_steps(workload(3), sampler_at(1, 40, global_batch_size=20), 7, 3) == 7 + 3 + 5
    assert progress.total_steps(workload(2), s, step=7, dp_size=2) == 7 + 3  # the last epoch
    assert progress.total_steps(workload(3), s, step=7, dp_size=None) is None  # no plan yet


def test_max_steps_ends_the_run_whatever_the_epochs():
    assert progress.total_steps(workload(3, max_steps=40), sampler_at(0, 0), 7, None) == 40


def test_seconds_follow_the_measured_global_throughput_at_this_size():
    s = sampler_at(0, 0)
    assert progress.seconds_for(30, s, dp_size=2, samples_per_second=100.0) == 6   # 30 x 20 samples / 100
    assert progress.seconds_for(30, s, dp_size=4, samples_per_second=100.0) == 12  # a bigger global batch
    assert progress.seconds_for(30, s, dp_size=2, samples_per_second=None) is None  # not measured yet
    assert progress.seconds_for(30, s, dp_size=None, samples_per_second=100.0) is None
