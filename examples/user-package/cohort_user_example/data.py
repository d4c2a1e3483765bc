"""A map-style Dataset over text files on a volume: byte-level windows for next-byte prediction.

The job's ``datasetArgs`` reach ``make_data`` as keyword arguments:

    dataset: "cohort_user_example.data:make_data"
    datasetArgs: {root: /data/text, pattern: "*.txt", seq_len: 64}
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from cohort.trainer.workloads.data import Data
from cohort.trainer.workloads.models import DataInfo


class ByteWindows(Dataset):
    """Sample i: bytes [i*L, i*L + L) as input and the same window shifted by one as target."""

    def __init__(self, data: np.ndarray, seq_len: int):
        self.data, self.seq_len = data, seq_len

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.from_numpy(self.data[i * self.seq_len:(i + 1) * self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


def make_data(root: str, pattern: str = "*.txt", seq_len: int = 64, eval_every: int = 10) -> Data:
    # Hidden paths are left out: .git and caches, and the ..<timestamp> copies a ConfigMap volume keeps.
    files = sorted(f for f in Path(root).rglob(pattern) if not any(p.startswith(".") for p in f.relative_to(root).parts))
    if not files:
        raise ValueError(f"no files match {pattern!r} under {root}")
    # Every eval_every-th file is held out, so no file is in both splits.
    train = [f for i, f in enumerate(files) if i % eval_every]
    held = [f for i, f in enumerate(files) if not i % eval_every] or files[:1]

    def read(fs: list[Path]) -> np.ndarray:
        # np.memmap instead, for corpora larger than memory
        return np.frombuffer(b"".join(f.read_bytes() for f in fs), dtype=np.uint8)

    return Data(ByteWindows(read(train), seq_len), ByteWindows(read(held), seq_len),
                DataInfo((seq_len,), vocab_size=256, seq_len=seq_len), task="lm")
