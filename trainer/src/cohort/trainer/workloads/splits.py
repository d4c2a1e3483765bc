"""A split of a dataset (train or eval) as the trainer reads it: samples by index, a batch at a time.

A :class:`Split` has a length and ``fetch(indices) -> (inputs, targets)``, one
batch of stacked tensors. The trainer's data order (``sampler.ElasticSampler``)
decides the indices, so a split holds no position of its own, and resuming,
even at another world size, needs nothing from it. Three kinds:

- :class:`TensorPairs`: two tensors in memory (the small built-ins);
- :class:`MapDataset`: any map-style ``torch.utils.data.Dataset`` whose items are
  ``(input, target)`` pairs (user entry points), collated by torch's
  ``default_collate``;
- ``tokens.TokenWindows``: token shards on disk or behind an fsspec URL.

``IterableDataset`` is refused: its position lives inside the iterator, so it
cannot be re-split exactly when the number of ranks changes.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate


@runtime_checkable
class Split(Protocol):
    def __len__(self) -> int: ...

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class TensorPairs:
    """Inputs and targets held in memory; sample i is ``(x[i], y[i])``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        if len(x) != len(y):
            raise ValueError(f"inputs and targets differ in length ({len(x)} and {len(y)})")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[indices], self.y[indices]


class MapDataset:
    """A user's map-style Dataset whose items are (input, target) pairs."""

    def __init__(self, dataset: Dataset[Any], field_name: str):
        if isinstance(dataset, IterableDataset):
            raise TypeError(f"{field_name}: an IterableDataset cannot be resumed exactly when the number of ranks "
                            "changes; return a map-style Dataset (__len__ and __getitem__)")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(f"{field_name}: {type(dataset).__name__} needs __len__ and __getitem__")
        self.dataset, self.field_name = dataset, field_name

    def __len__(self) -> int:
        return len(self.dataset)

    def fetch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        many = getattr(self.dataset, "__getitems__", None)
        items = many(indices.tolist()) if many is not None else [self.dataset[i] for i in indices.tolist()]
        batch = default_collate(items)
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise TypeError(f"{self.field_name}: items must be (input, target) pairs")
        return batch[0], batch[1]


def as_split(obj: Any, field_name: str) -> Split:
    """A Split from what a user's dataset function returned for one split."""
    if isinstance(obj, Split):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and all(isinstance(t, torch.Tensor) for t in obj):
        return TensorPairs(obj[0], obj[1])
    return MapDataset(obj, field_name)
