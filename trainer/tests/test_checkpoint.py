"""Checkpoints: atomic commit, pruning, resume only from complete ones, local paths and fsspec URLs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from tests.support.wait import wait_for
from torch.distributed.checkpoint.api import CheckpointException

from cohort.trainer.checkpoint import MARKER, Checkpointer, CheckpointError


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4, 4), value)}, "trainer": {"step": int(value)}}


@pytest.mark.parametrize("async_save", [True, False])
def test_save_commits_and_prunes(tmp_path, async_save):
    ck = Checkpointer(str(tmp_path / "job"), keep=2, async_save=async_save)
    for step in (10, 20, 30):
        ck.save(step, state(step), {"worldSize": 2})
    ck.wait()
    assert ck.committed_steps() == [20, 30]
    assert (tmp_path / "job/step-00000030" / MARKER).exists()
    assert ck.latest().step == 30
    files = sum(f.stat().st_size for f in (tmp_path / "job/step-00000030").iterdir() if f.name != MARKER)
    assert files > 4 * 4 * 4 and ck.last.bytes == files == ck.latest().bytes  # the size, also after a restart
    loaded = state(0)
    ck.load(30, loaded)
    assert torch.equal(loaded["model"]["w"], torch.full((4, 4), 30.0))
    assert loaded["trainer"]["step"] == 30


def test_optional_entries_load_where_the_checkpoint_has_them(tmp_path):
    """An optional entry (TrainState.OPTIONAL: local SGD's outer state) is read back in place when the
    checkpoint has it, and left as it is when the checkpoint was written without it; the others stay
    required."""
    ck = Checkpointer(str(tmp_path / "job"), keep=3, async_save=False)
    outer = {"round": torch.tensor(6), "params": torch.arange(5.0), "momentum": torch.full((5,), 0.5)}
    ck.save(10, {**state(10), "sync": outer}, {})
    ck.save(20, state(20), {})  # a checkpoint from before the outer state was kept
    ck.wait()
    template = {"round": torch.tensor(-1), "params": torch.zeros(5), "momentum": torch.zeros(5)}
    loaded = {**state(0), "sync": {k: v.clone() for k, v in template.items()}}
    held = loaded["sync"]["params"]
    ck.load(10, loaded, optional=("sync",))
    assert loaded["sync"]["params"] is held and all(torch.equal(loaded["sync"][k], outer[k]) for k in outer)
    loaded = {**state(0), "sync": {k: v.clone() for k, v in template.items()}}
    ck.load(20, loaded, optional=("sync",))
    assert loaded["trainer"]["step"] == 20 and all(torch.equal(loaded["sync"][k], template[k]) for k in template)
    with pytest.raises(CheckpointException) as refused:  # not optional: the missing entry is an error
        ck.load(20, {**state(0), "sync": {k: v.clone() for k, v in template.items()}})
    assert "Missing key in checkpoint state_dict: sync.round" in repr(refused.value.failures)


def test_incomplete_checkpoint_is_never_chosen(tmp_path):
    ck = Checkpointer(str(tmp_path), keep=3, async_save=False)
    ck.save(5, state(5), {})
    ck.wait()
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000009" / "__0_0.distcp").write_bytes(b"partial")
    assert ck.latest().step == 5


def test_checkpoint_killed_mid_write_is_ignored(tmp_path):
    """A real interrupted write: a process saving ~200 MB is SIGKILLed part-way."""
    ck = Checkpointer(str(tmp_path), keep=3, async_save=False)
    ck.save(1, state(1), {})
    ck.wait()
    script = textwrap.dedent(f"""
        import torch
        from cohort.trainer.checkpoint import Checkpointer
        ck = Checkpointer({str(tmp_path)!r}, keep=3, async_save=False)
        big = {{"model": {{f"w{{i}}": torch.randn(1024, 1024) for i in range(50)}}}}
        print("saving", flush=True)
        ck.save(2, big, {{}})
        print("saved", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "saving"
    try:
        wait_for((tmp_path / "step-00000002").exists, 30, 0.01, what="the writer to start")
        time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "step-00000002" / MARKER).exists()
    assert ck.latest().step == 1
    ck.save(3, state(3), {})
    ck.wait()
    assert not (tmp_path / "step-00000002").exists(), "leftovers of an interrupted write are pruned"


def test_fsspec_url(tmp_path):
    ck = Checkpointer(f"file://{tmp_path}/remote", keep=1, async_save=True)
    ck.check_writable()
    ck.save(7, state(7), {})
    ck.wait()
    assert ck.latest().step == 7
    loaded = state(0)
    ck.load(7, loaded)
    assert loaded["trainer"]["step"] == 7


def test_unwritable_location_names_the_field(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    ck = Checkpointer(str(ro / "job"), keep=1, async_save=False)
    if os.geteuid() == 0:  # root ignores permission bits: use a path under a file instead
        (tmp_path / "file").write_text("x")
        ck = Checkpointer(str(tmp_path / "file" / "job"), keep=1, async_save=False)
    with pytest.raises(CheckpointError, match="spec.checkpoint.path"):
        ck.check_writable()


def test_a_checkpoint_of_given_parameters_writes_them_under_every_name_and_loads_them_back(tmp_path):
    """``TrainState.checkpoint_state(params)`` (the replicas' average, for gossip and local SGD): a flat vector in
    ``parameters_to_vector``'s order goes into the model's state dict under each parameter's name, a tied one
    (an output layer sharing the embedding's weight) under both, and loads back as the model's parameters; the
    buffers and the optimizer state stay this process's."""
    from torch import nn
    from torch.nn.utils import parameters_to_vector

    from cohort.trainer.sampler import ElasticSampler
    from cohort.trainer.state import TrainState

    def build() -> TrainState:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Embedding(6, 4), nn.LayerNorm(4), nn.Linear(4, 6, bias=False), nn.BatchNorm1d(6))
        model[2].weight = model[0].weight
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.tensor([1, 2, 3])).sum().backward()
        opt.step()
        return TrainState(model, opt, ElasticSampler(10, 2, 0))

    mine = build()
    given = torch.arange(parameters_to_vector(mine.model.parameters()).numel(), dtype=torch.float32)
    ck = Checkpointer(str(tmp_path / "job"), keep=1, async_save=False)
    ck.save(3, mine.checkpoint_state(given), {})
    ck.wait()
    loaded = build()
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.zero_()
    template = loaded.checkpoint_state()
    ck.load(3, template)
    loaded.after_checkpoint_load(template)
    assert torch.equal(parameters_to_vector(loaded.model.parameters()), given)
    assert torch.equal(loaded.model[2].weight, given[:24].view(6, 4))  # the tied name holds the embedding's part
    assert torch.equal(loaded.model[3].running_mean, mine.model[3].running_mean)
    exp_avg = [s["exp_avg"] for s in loaded.optimizer.state.values()]
    assert exp_avg and all(torch.equal(a, b["exp_avg"]) for a, b in zip(exp_avg, mine.optimizer.state.values(), strict=True))
    assert torch.equal(parameters_to_vector(mine.model.parameters()), parameters_to_vector(build().model.parameters()))


def _sharded_saves(rank: int, world: int, root: str, stage_once: bool) -> list[int]:
    """Three async saves of a DTensor state through one Checkpointer; with ``stage_once``, torch's DefaultStager
    behaves as torch 2.11's does (pytorch/pytorch issue 183413): its copier is closed at the end of each stage."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.staging import DefaultStager
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from cohort.trainer import staging

    if stage_once:
        stage = DefaultStager._stage

        def once(self, *args, **kwargs):
            staged = stage(self, *args, **kwargs)
            self._state_dict_stager.close()
            return staged
        DefaultStager._stage = once
        assert not staging.default_stager_reusable()
    mesh = init_device_mesh("cpu", (world,))
    group = dist.new_group(backend="gloo")  # the saves' own, as the trainer's plans have (Plan.checkpoint_group)
    ck = Checkpointer(root, keep=3, async_save=True)
    for step in (1, 2, 3):
        w = DTensor.from_local(torch.full((2, 4), float(step)), mesh, [Shard(0)])
        ck.save(step, {"model": {"w": w}}, {}, coordinator=rank == 0, group=group, sharded=True)
        ck.before_update()
    ck.wait()
    dist.barrier()  # rank 0 commits (its wait() returns after its marker is written); then both read
    return ck.committed_steps()


@pytest.mark.dist
@pytest.mark.parametrize("stage_once", [False, True])
def test_every_sharded_async_save_commits_with_a_stager_that_stages_once(tmp_path, stage_once):
    """torch 2.11's DefaultStager fails its second save with KeyError(<class 'type'>); the GPU machines lent so
    far run 2.11. Such a stager is found out and a new one made for each save. The saves are the processes' first
    DTensor ops after from_local: on torch 2.11 without a GPU the first save crashed (SIGSEGV) unless the saving
    thread propagated a DTensor op before the staging thread did (staging.propagate_in_this_thread)."""
    from gloo_ranks import run_ranks

    assert run_ranks(_sharded_saves, 2, str(tmp_path / "job"), stage_once) == [[1, 2, 3], [1, 2, 3]]
