"""The Data a dataset function returns: train and eval splits, what the model needs to know, the task."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .models import DataInfo
from .splits import Split, TensorPairs, as_split


@dataclass
class Data:
    """The train and eval splits plus what the model needs to know.

    ``train`` and ``eval`` are :class:`~.splits.Split` objects, or what
    :func:`~.splits.as_split` turns into one: a map-style
    ``torch.utils.data.Dataset`` of (input, target) pairs, or an
    ``(inputs, targets)`` tuple of tensors.
    """

    train: Split
    eval: Split
    info: DataInfo
    task: str  # "classification" or "lm"

    def __post_init__(self) -> None:
        self.train = as_split(self.train, "spec.workload.dataset (train split)")
        self.eval = as_split(self.eval, "spec.workload.dataset (eval split)")

    @classmethod
    def from_tensors(cls, train_x: torch.Tensor, train_y: torch.Tensor, eval_x: torch.Tensor,
                     eval_y: torch.Tensor, info: DataInfo, task: str) -> Data:
        return cls(TensorPairs(train_x, train_y), TensorPairs(eval_x, eval_y), info, task)
