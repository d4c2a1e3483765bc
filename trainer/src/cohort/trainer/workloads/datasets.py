"""Built-in datasets, keyed by the CRD's ``workload.dataset`` strings; each returns a ``data.Data``.

Three are small, in memory and reproducible: scikit-learn's bundled digits
with a fixed train/test split, and two generated ones whose seed is part of
their arguments. Two are file-backed: ``tokens`` reads token shards from a
path or fsspec URL (``workloads/tokens.py``), and ``python-source`` prepares
such shards once from the Python standard library's own source
(``workloads/python_source.py``). Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from .data import Data
from .defaults import SYNTHETIC_LM
from .models import DataInfo

SPLIT_SEED = 1234  # the digits split never changes with the workload seed


def digits_file() -> Path:
    """scikit-learn's bundled digits (the UCI test set: 1797 images of 8x8 pixels, 0-16, then the label),
    found without importing ``sklearn.datasets``, whose import (SciPy with it) costs each worker about
    1.5 s of CPU: more than reading the file."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("workload.dataset digits needs scikit-learn (its bundled copy of the data)")
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels as float64 [1797, 64], labels as int64 [1797]), as ``sklearn.datasets.load_digits`` returns them."""
    with gzip.open(digits_file(), "rt") as f:
        rows = torch.tensor([[float(v) for v in line.split(",")] for line in f if line.strip()], dtype=torch.float64)
    return rows[:, :-1], rows[:, -1].long()


def digits(test_fraction: float = 0.2) -> Data:
    pixels, y = load_digits()
    x = pixels.float().view(-1, 1, 8, 8) / 16.0
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_test = int(round(len(y) * test_fraction))
    test, train = perm[:n_test], perm[n_test:]
    # Standardise each pixel with train-split statistics (sparse border pixels otherwise dominate).
    mean, std = x[train].mean(0, keepdim=True), x[train].std(0, keepdim=True).clamp_min(0.1)
    x = (x - mean) / std
    return Data.from_tensors(x[train], y[train], x[test], y[test], DataInfo((1, 8, 8), num_classes=10), "classification")


def synthetic_classification(samples: int = 4096, features: int = 32, classes: int = 4,
                             noise: float = 1.0, seed: int = 0, test_fraction: float = 0.2) -> Data:
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 2.0
    y = torch.randint(0, classes, (samples,), generator=g)
    x = centers[y] + noise * torch.randn(samples, features, generator=g)
    n_test = int(samples * test_fraction)
    return Data.from_tensors(x[n_test:], y[n_test:], x[:n_test], y[:n_test], DataInfo((features,), num_classes=classes),
                "classification")


def synthetic_lm(sequences: int = SYNTHETIC_LM.sequences, seq_len: int = SYNTHETIC_LM.seq_len,
                 vocab: int = SYNTHETIC_LM.vocab, branching: int = SYNTHETIC_LM.branching,
                 seed: int = SYNTHETIC_LM.seed, test_fraction: float = SYNTHETIC_LM.test_fraction) -> Data:
    """Token sequences from a sparse random Markov chain: learnable, with a known entropy floor."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.stack([torch.randperm(vocab, generator=g)[:branching] for _ in range(vocab)])
    tokens = torch.empty(sequences, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, vocab, (sequences,), generator=g)
    for t in range(seq_len):
        choice = torch.randint(0, branching, (sequences,), generator=g)
        tokens[:, t + 1] = successors[tokens[:, t], choice]
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    n_test = int(sequences * test_fraction)
    return Data.from_tensors(x[n_test:], y[n_test:], x[:n_test], y[:n_test],
                DataInfo((seq_len,), vocab_size=vocab, seq_len=seq_len), "lm")


def tokens(path: str, seq_len: int = 128) -> Data:
    """Token shards written by ``tokens.write_shards`` (a directory or fsspec URL): windows of seq_len + 1 tokens."""
    from .tokens import load_token_data

    return load_token_data(path, seq_len)


def python_source(seq_len: int = 128, vocab_size: int = 4096, cache_dir: str = "", eval_fraction: float = 0.05) -> Data:
    """This Python's standard library sources, BPE-tokenised once into cached shards (python_source.py)."""
    from .python_source import prepare

    return tokens(str(prepare(vocab_size=vocab_size, cache_dir=cache_dir, eval_fraction=eval_fraction)), seq_len)


DATASETS: dict[str, Callable[..., Data]] = {"digits": digits, "synthetic-classification": synthetic_classification,
                                            "synthetic-lm": synthetic_lm, "tokens": tokens,
                                            "python-source": python_source}
