"""File-backed data: token shards, the python-source preparation, user Datasets and the prefetching loader."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from cohort.trainer.loader import BatchLoader
from cohort.trainer.sampler import ElasticSampler
from cohort.trainer.workloads import python_source
from cohort.trainer.workloads.data import Data
from cohort.trainer.workloads.models import DataInfo
from cohort.trainer.workloads.splits import MapDataset, TensorPairs
from cohort.trainer.workloads.tokens import load_token_data, write_shards
from cohort.trainer.workloads.workload import WorkloadError, build_data


def shards(tmp_path, n_train=1001, n_eval=201, vocab=300):
    g = np.random.default_rng(0)
    ids = {"train": g.integers(0, vocab, n_train), "eval": g.integers(0, vocab, n_eval)}
    return write_shards(tmp_path / "tok", ids, vocab), ids


def test_windows_are_consecutive_slices_of_the_shard(tmp_path):
    path, ids = shards(tmp_path)
    data = load_token_data(str(path), seq_len=10)
    assert len(data.train) == 100 and len(data.eval) == 20 and data.info.vocab_size == 300
    x, y = data.train.fetch(torch.tensor([0, 7, 99]))
    for row, i in enumerate([0, 7, 99]):
        assert x[row].tolist() == ids["train"][i * 10:i * 10 + 10].tolist()
        assert y[row].tolist() == ids["train"][i * 10 + 1:i * 10 + 11].tolist()  # the next token
    assert json.loads((path / "meta.json").read_text())["dtype"] == "uint16"
    with pytest.raises(IndexError):
        data.train.fetch(torch.tensor([100]))


def test_an_fsspec_url_reads_the_same_windows_as_the_memory_map(tmp_path):
    import fsspec

    path, _ = shards(tmp_path)
    fs = fsspec.filesystem("memory")
    for f in path.iterdir():
        fs.pipe(f"/shards/{f.name}", f.read_bytes())
    local, remote = load_token_data(str(path), 16), load_token_data("memory:///shards", 16)
    idx = torch.tensor([3, 0, 61, 5])
    for a, b in zip(local.train.fetch(idx), remote.train.fetch(idx), strict=True):
        assert torch.equal(a, b)


def test_a_missing_or_foreign_path_names_the_field(tmp_path):
    with pytest.raises(WorkloadError, match=r"spec.workload.datasetArgs: path .* holds no token shards"):
        build_data("tokens", {"path": str(tmp_path / "nothing")})
    (tmp_path / "meta.json").write_text('{"format": "other"}')
    with pytest.raises(WorkloadError, match="is not cohort-tokens/1"):
        build_data("tokens", {"path": str(tmp_path)})


def test_python_source_prepares_the_same_bytes_twice_and_splits_by_file(tmp_path):
    a = python_source.prepare(vocab_size=400, cache_dir=str(tmp_path / "a"), limit_files=40)
    b = python_source.prepare(vocab_size=400, cache_dir=str(tmp_path / "b"), limit_files=40)
    for name in ("meta.json", "train.bin", "eval.bin", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    meta = json.loads((a / "meta.json").read_text())
    assert meta["vocab_size"] == 400 and meta["splits"]["eval"]["tokens"] > 0
    assert 4.0 < meta["baseline"]["unigram_eval_loss"] < np.log(400)  # below the uniform distribution's
    assert python_source.prepare(vocab_size=400, cache_dir=str(tmp_path / "a"), limit_files=40) == a  # cached
    assert meta["source"]["files"] == 40
    files = [str(f) for f in python_source.source_files()]
    assert len(files) > 300 and not [f for f in files if "/site-packages/" in f or "/test/" in f]
    evals = [f for f in files if python_source.is_eval(f, 0.05)]
    assert 0.02 < len(evals) / len(files) < 0.1  # whole files, about eval_fraction of them


def test_python_source_uses_shards_prepared_ahead_and_writes_nothing(tmp_path, monkeypatch):
    """$COHORT_DATA_PREPARED (the trainer image's /opt/cohort-data) is looked in before the cache: its shards
    are used as they are, nothing is prepared or written; other settings are prepared into the cache."""
    ready = python_source.prepare(vocab_size=400, cache_dir=str(tmp_path / "ready"), limit_files=40)
    monkeypatch.setenv("COHORT_DATA_PREPARED", f"{tmp_path / 'none'}:{tmp_path / 'ready'}")
    assert ready.stat().st_mode & 0o777 == 0o755  # the image prepares as root, its workers read as 65532
    before = {p: p.stat().st_mtime_ns for p in ready.iterdir()}
    assert python_source.prepare(vocab_size=400, cache_dir=str(tmp_path / "cache"), limit_files=40) == ready
    assert not (tmp_path / "cache").exists() and {p: p.stat().st_mtime_ns for p in ready.iterdir()} == before
    other = python_source.prepare(vocab_size=300, cache_dir=str(tmp_path / "cache"), limit_files=40)
    assert other.parent == tmp_path / "cache" and (other / "meta.json").exists()


def test_the_tokenizer_round_trips_real_source(tmp_path):
    from tokenizers import Tokenizer

    out = python_source.prepare(vocab_size=500, cache_dir=str(tmp_path), limit_files=40)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = python_source.source_files()[0].read_text()
    assert tok.decode(tok.encode(text).ids) == text


class Squares(Dataset):
    def __len__(self):
        return 50

    def __getitem__(self, i):
        return torch.tensor([float(i)]), torch.tensor(i * i)


def test_a_user_map_dataset_is_fetched_and_collated():
    split = MapDataset(Squares(), "spec.workload.dataset")
    x, y = split.fetch(torch.tensor([3, 4]))
    assert x.tolist() == [[3.0], [4.0]] and y.tolist() == [9, 16]
    assert len(Data(Squares(), Squares(), DataInfo((1,)), "classification").train) == 50


def test_an_iterable_dataset_is_refused_with_the_reason():
    class Stream(IterableDataset):
        def __iter__(self):
            yield from ()

    with pytest.raises(TypeError, match="cannot be resumed exactly when the number of ranks changes"):
        MapDataset(Stream(), "spec.workload.dataset")


class Counting(TensorPairs):
    """Counts fetches in this process (workers run in others)."""

    fetches = 0

    def fetch(self, indices):
        Counting.fetches += 1
        return super().fetch(indices)


def test_the_prefetching_loader_returns_each_steps_batch_and_restarts_when_the_world_changes():
    data = torch.arange(200).float().unsqueeze(1)
    split = Counting(data, torch.arange(200))
    sampler = ElasticSampler(200, batch_size=8, seed=1)
    loader = BatchLoader(split, workers=2)
    seen = []
    for world, steps in ((2, 4), (3, 3), (2, 2)):
        for _ in range(steps):
            idx = sampler.indices(1, world)
            x, y = loader.get(idx, lambda w=world: sampler.upcoming(1, w))
            assert torch.equal(y, idx) and torch.equal(x[:, 0], idx.float())
            seen.append(idx)
            sampler.advance(world)
    assert loader.restarts == 3  # once per world: batches fetched ahead for the old world are dropped
    assert Counting.fetches == 0  # every batch came from the worker processes
    loader.close()


class WorkerPid(TensorPairs):
    """Each sample's input is the process id of the worker that fetched it."""

    def fetch(self, indices):
        x, y = super().fetch(indices)
        return torch.full_like(x, os.getpid()), y


def test_the_loaders_workers_outlive_world_changes_and_epochs():
    """A world change or a new epoch resets what the workers prefetch, not the workers: before, each one ended
    them and started new ones, on a recovery's critical path (bench/loader_restart.py)."""
    sampler = ElasticSampler(200, batch_size=8, seed=0)
    loader = BatchLoader(WorkerPid(torch.zeros(200, 1), torch.arange(200)), workers=2)
    pids = set()
    try:
        for world in (2, 3, 2, None, 3):  # None: the next epoch
            if world is None:
                sampler.next_epoch()
                continue
            for _ in range(2):
                idx = sampler.indices(1, world)
                x, y = loader.get(idx, lambda w=world: sampler.upcoming(1, w))
                assert torch.equal(y, idx)  # never a batch prefetched for the old world or epoch
                pids.update(int(p) for p in x[:, 0].tolist())
                sampler.advance(world)
    finally:
        loader.close()
    assert loader.restarts == 4
    assert len(pids) == 2 and os.getpid() not in pids


def test_a_started_loaders_first_batch_comes_from_workers_already_running():
    """``start`` (the trainer's, before any world) starts the workers, so a newcomer's or a promoted spare's
    first step does not wait for them (1.2-1.4 s here: the fork server imports torch)."""
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    sampler = ElasticSampler(64, batch_size=8, seed=0)
    loader = BatchLoader(WorkerPid(torch.zeros(64, 1), torch.arange(64)), workers=2)
    try:
        loader.start()
        running = {p.pid for p in multiprocessing.active_children()} - before
        assert len(running) == 2
        x, y = loader.get(sampler.indices(0, 1), lambda: sampler.upcoming(0, 1))
        assert {int(p) for p in x[:, 0].tolist()} <= running and torch.equal(y, sampler.indices(0, 1))
        assert loader.restarts == 1  # the empty pass that started them is not counted
    finally:
        loader.close()


def test_the_loader_refuses_upcoming_indices_that_do_not_start_at_the_step_asked_for():
    sampler = ElasticSampler(64, batch_size=8, seed=0)
    loader = BatchLoader(TensorPairs(torch.arange(64).float().unsqueeze(1), torch.arange(64)), workers=1)
    try:
        with pytest.raises(RuntimeError, match="do not start at the requested step"):
            loader.get(sampler.indices(0, 1), lambda: sampler.upcoming(1, 2))
    finally:
        loader.close()


def test_the_loaders_worker_processes_hold_none_of_the_trainers_sockets():
    """A worker forked from the trainer would keep its listening sockets (the metrics port) after it dies."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    loader = BatchLoader(TensorPairs(torch.arange(64).float().unsqueeze(1), torch.arange(64)), workers=1)
    sampler = ElasticSampler(64, batch_size=8, seed=0)
    loader.get(sampler.indices(0, 1), lambda: sampler.upcoming(0, 1))  # the worker is running now
    listener.close()
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        again.bind(("127.0.0.1", port))  # EADDRINUSE while a worker holds the old listener
    finally:
        again.close()
        loader.close()


def test_a_closed_loader_has_released_its_queues_semaphores():
    """``close`` returns once the semaphores of the loader's queues are unlinked and unregistered from the
    resource tracker. An index queue's last references to them are its feeder thread's, which ends after
    ``close`` sends it the queue's end: a trainer that went on to ``os._exit`` ended that thread with a
    semaphore taken from multiprocessing's registry but not yet released, and resource_tracker reported it
    as leaked (about 1 stopped or finished 2-worker run in 30)."""
    import threading
    from multiprocessing import synchronize, util

    def semaphores() -> set[str]:
        return {f._args[0] for f in list(util._finalizer_registry.values())
                if getattr(f, "_callback", None) is synchronize.SemLock._cleanup}

    def feeders() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "QueueFeederThread"}

    before, feeding = semaphores(), feeders()
    loader = BatchLoader(TensorPairs(torch.arange(64).float().unsqueeze(1), torch.arange(64)), workers=1)
    sampler = ElasticSampler(64, batch_size=8, seed=0)
    for _ in range(6):  # the feeder often ended by itself before close() returned; 6 tries catch it
        loader.get(sampler.indices(0, 1), lambda: sampler.upcoming(0, 1))  # its index queue's feeder is running
        assert semaphores() - before and feeders() - feeding
        loader.close()
        assert semaphores() - before == set()
        assert feeders() - feeding == set()


_LOADS_THEN_EXITS = """
import multiprocessing
import torch
from cohort.trainer.loader import BatchLoader
from cohort.trainer.runtime.exit import exit_process
from cohort.trainer.sampler import ElasticSampler
from cohort.trainer.workloads.splits import TensorPairs

if __name__ == "__main__":
    loader = BatchLoader(TensorPairs(torch.arange(64).float().unsqueeze(1), torch.arange(64)), workers=1)
    sampler = ElasticSampler(64, batch_size=8, seed=0)
    loader.get(sampler.indices(0, 1), lambda: sampler.upcoming(0, 1))  # a batch from the worker process
    print(multiprocessing.util.get_temp_dir(), flush=True)
    exit_process(0)
"""


def test_a_trainer_and_its_loader_workers_leave_no_multiprocessing_temp_dirs(tmp_path):
    """``exit_process`` and the loader workers' exit once the trainer is gone both skip the exit handlers
    (``os._exit``); the ``pymp-*`` directories multiprocessing made for their sockets (the trainer's fork
    server's, a worker's resource sharer's once it sent a batch) are removed all the same."""
    import os
    import subprocess
    import sys
    import time

    script = tmp_path / "loads.py"  # a file, not -c: the fork server's children import __main__
    script.write_text(_LOADS_THEN_EXITS)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = subprocess.run([sys.executable, str(script)], env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p
    made = p.stdout.strip().splitlines()[-1]
    assert os.path.dirname(made) == str(tmp) and os.path.basename(made).startswith("pymp-"), made
    assert not os.path.exists(made), sorted(os.listdir(made))
    deadline = time.monotonic() + 15  # the workers look for the trainer once a second
    while list(tmp.glob("pymp-*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not list(tmp.glob("pymp-*")), [sorted(os.listdir(d)) for d in tmp.glob("pymp-*")]


_WORKER_LEAVES_AS_THE_TRAINER_DIES = """
import multiprocessing.util as util
import os
import subprocess
import sys
import time

from cohort.trainer.loader import _exit_with

trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
_exit_with(trainer.pid, 0)  # the worker's init: its watchdog waits for the trainer
# A slow exit handler: the watchdog fires (at 0.5 s) while the main thread is inside it.
util.Finalize(None, lambda: (time.sleep(2), open(sys.argv[1], "w").close()), exitpriority=-50)
util._exit_function()  # the main thread leaves as a worker does: multiprocessing's exit handlers,
os._exit(3)  # then the fork server's os._exit
"""


def test_a_loader_workers_watchdog_waits_for_an_exit_already_under_way(tmp_path):
    """A worker whose trainer died fails to fetch its next indices and leaves by its main thread while the
    watchdog sees the trainer gone: the watchdog's ``os._exit`` must not cut the main thread's exit handlers
    short (it did, midway through removing the worker's pymp-* directory: 4 runs in 13 of the test above)."""
    import subprocess
    import sys

    script, done = tmp_path / "worker.py", tmp_path / "handlers-done"
    script.write_text(_WORKER_LEAVES_AS_THE_TRAINER_DIES)
    p = subprocess.run([sys.executable, str(script), str(done)], capture_output=True, text=True, timeout=120)
    assert (p.returncode, done.exists()) == (3, True), p.stderr[-2000:]


_CHILD_EXITS = """
import multiprocessing
import multiprocessing.util
import os
from cohort.trainer.runtime.exit import exit_process


def child():
    exit_process(0)  # as a spawned test rank or calibration worker ends


if __name__ == "__main__":
    mine = multiprocessing.util.get_temp_dir()
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    p.join()
    print(p.exitcode, os.path.isdir(mine), flush=True)
"""


def test_a_child_that_exits_with_exit_process_leaves_its_parents_temp_dir_alone(tmp_path):
    """A process multiprocessing started inherits its parent's ``pymp-*`` directory (not its removal): its
    ``exit_process`` must not remove it from under the parent, which made it and is still running."""
    import os
    import subprocess
    import sys

    script = tmp_path / "child_exits.py"
    script.write_text(_CHILD_EXITS)
    p = subprocess.run([sys.executable, str(script)], env={**os.environ, "TMPDIR": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.split() == ["0", "True"], p
    assert "Traceback" not in p.stderr, p.stderr  # the parent's own removal at exit found its directory
    assert not list(tmp_path.glob("pymp-*"))


@pytest.mark.parametrize("how", ["pidfd", "proc"])
def test_a_trainer_that_exited_and_was_not_reaped_counts_as_gone(how, monkeypatch):
    """The loader workers' watch on the trainer: a zombie (exited, its parent has not waited for it yet) has
    exited, seen through a pidfd or, without one, through /proc; a running process has not."""
    import os
    import subprocess
    import sys
    import threading

    from cohort.trainer.loader import _running, _wait_exited

    if how == "proc":
        def no_pidfds(pid: int) -> int:
            raise OSError(38, "Function not implemented")
        monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    assert _running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
    try:
        returned = threading.Event()
        threading.Thread(target=lambda: (_wait_exited(child.pid), returned.set()), daemon=True).start()
        assert not returned.wait(0.3) and _running(child.pid)
        assert returned.wait(30)
        assert child.returncode is None and os.path.exists(f"/proc/{child.pid}")  # not reaped: a zombie
        assert not _running(child.pid)
    finally:
        child.wait()
