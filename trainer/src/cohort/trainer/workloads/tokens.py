"""Token shards: the built-in file-backed format, read from a directory or an fsspec URL.

The layout is nanoGPT's (one flat binary file of token ids per split, read by
memory map) plus a ``meta.json`` that names the dtype, the vocabulary and each
split's length::

    <path>/meta.json   {"format": "cohort-tokens/1", "dtype": "uint16", "vocab_size": 4096,
                        "splits": {"train": {"file": "train.bin", "tokens": N}, "eval": {...}}}
    <path>/train.bin   N little-endian token ids
    <path>/eval.bin

Why this format: a language model reads fixed windows of tokens, so a sample
is an offset, random access costs one read, and the files need no library to
write (``numpy.ndarray.tofile``). A local path is memory-mapped, so a worker's
memory does not grow with the corpus and DataLoader workers share the page
cache. Any other fsspec URL (``s3://``, ``gs://``, ``memory://``, ...) is read
with one ranged read per sample.

Sample ``i`` is the window ``tokens[i*L : i*L + L + 1]`` (L = seq_len): the
input is its first L tokens and the target the last L.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data import Data
from .models import DataInfo

FORMAT = "cohort-tokens/1"
DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


class TokenWindows:
    """One split of a token-shard directory as a Split: windows of seq_len + 1 tokens."""

    def __init__(self, url: str, n_tokens: int, dtype: str, seq_len: int):
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.url, self.n_tokens, self.dtype, self.seq_len = url, n_tokens, np.dtype(DTYPES[dtype]), seq_len
        self._mm: np.ndarray | None = None
        self._file: Any = None

    def __len__(self) -> int:
        return max(0, (self.n_tokens - 1) // self.seq_len)

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers open their own map or file
        return {**self.__dict__, "_mm": None, "_file": None}

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = indices.numpy().astype(np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"sample index out of range [0, {len(self)})")
        width = self.seq_len + 1
        if _is_local(self.url):
            if self._mm is None:
                self._mm = np.memmap(_local_path(self.url), dtype=self.dtype, mode="r", shape=(self.n_tokens,))
            rows = self._mm[idx[:, None] * self.seq_len + np.arange(width)]
        else:
            rows = np.stack([self._read(int(i) * self.seq_len, width) for i in idx]) if len(idx) \
                else np.empty((0, width), self.dtype)
        windows = torch.from_numpy(rows.astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def _read(self, start: int, count: int) -> np.ndarray:
        if self._file is None:
            import fsspec

            self._file = fsspec.open(self.url, "rb").open()
        self._file.seek(start * self.dtype.itemsize)
        raw = self._file.read(count * self.dtype.itemsize)
        return np.frombuffer(raw, dtype=self.dtype)


def load_token_data(path: str, seq_len: int) -> Data:
    meta = read_meta(path)
    splits = meta["splits"]
    for name in ("train", "eval"):
        if name not in splits:
            raise ValueError(f"{_join(path, 'meta.json')} has no {name!r} split")
    windows = {name: TokenWindows(_join(path, splits[name]["file"]), int(splits[name]["tokens"]), meta["dtype"],
                                  seq_len) for name in ("train", "eval")}
    if len(windows["train"]) == 0:
        raise ValueError(f"the train split of {path} has {splits['train']['tokens']} tokens, "
                         f"fewer than one window of seq_len + 1 = {seq_len + 1}")
    info = DataInfo((seq_len,), vocab_size=int(meta["vocab_size"]), seq_len=seq_len)
    return Data(windows["train"], windows["eval"], info, "lm")


def read_meta(path: str) -> dict[str, Any]:
    url = _join(path, "meta.json")
    try:
        if _is_local(url):
            text = Path(_local_path(url)).read_text()
        else:
            import fsspec

            with fsspec.open(url, "r") as f:
                text = f.read()
    except FileNotFoundError:
        raise ValueError(f"path {path!r} holds no token shards ({url} not found)") from None
    meta = json.loads(text)
    if meta.get("format") != FORMAT or meta.get("dtype") not in DTYPES:
        raise ValueError(f"{url} is not {FORMAT} with a dtype in {sorted(DTYPES)}")
    return meta


def write_shards(out_dir: Path, splits: dict[str, np.ndarray], vocab_size: int,
                 extra: dict[str, Any] | None = None, files: dict[str, Path] | None = None) -> Path:
    """Write token-shard splits to ``out_dir`` atomically (a temporary directory, renamed at the end).

    ``files`` are copied in beside them (for example the tokenizer). Returns ``out_dir``.
    """
    dtype = "uint16" if vocab_size <= 1 << 16 else "uint32"
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        meta: dict[str, Any] = {"format": FORMAT, "dtype": dtype, "vocab_size": vocab_size, "splits": {},
                                **(extra or {})}
        for name, ids in splits.items():
            if len(ids) and int(ids.max()) >= vocab_size:
                raise ValueError(f"split {name!r} has token {int(ids.max())} >= vocab_size {vocab_size}")
            ids.astype(DTYPES[dtype]).tofile(tmp / f"{name}.bin")
            meta["splits"][name] = {"file": f"{name}.bin", "tokens": int(len(ids))}
        for name, src in (files or {}).items():
            shutil.copyfile(src, tmp / name)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the shards from other users (an image's, prepared as root)
        os.replace(tmp, out_dir) if not out_dir.exists() else shutil.rmtree(tmp)  # first writer wins
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _local_path(url: str) -> str:
    return url[len("file://"):] if url.startswith("file://") else url


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name
