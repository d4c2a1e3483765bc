"""File-backed data: token shards, the python-source preparation, user Datasets and the prefetching loader."""

from __future__ import annotations

import json

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
