"""The Data a dataset function returns: train and eval splits, what the model needs to know, the task.

Part of the user entry-point contract (:data:`cohort.trainer.workloads.ENTRY_POINT_CONTRACT`,
docs/workloads.md "The entry-point contract"): ``Data(train, eval, info, task)``.
Contract 1's form, ``Data(train_x, train_y, eval_x, eval_y, info, task)`` with four
tensors, is still accepted with a :class:`DeprecationWarning` (and a warning in the
worker's log) until :data:`~cohort.trainer.workloads.CONTRACT_1_REMOVED_IN`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from . import CONTRACT_1_REMOVED_IN, ENTRY_POINT_CONTRACT
from .models import DataInfo
from .splits import Split, TensorPairs, as_split

TASKS = ("classification", "lm")
_V1_FIELDS = ("train_x", "train_y", "eval_x", "eval_y", "info", "task")
_V2_FIELDS = ("train", "eval", "info", "task")
FIELD = "spec.workload.dataset"
log = logging.getLogger(__name__)


class Contract1DeprecationWarning(DeprecationWarning):
    """A dataset entry point built its Data in entry-point contract 1's form."""


@dataclass(init=False)
class Data:
    """The train and eval splits plus what the model needs to know (entry-point contract 2).

    ``train`` and ``eval`` are :class:`~.splits.Split` objects, or what
    :func:`~.splits.as_split` turns into one: a map-style
    ``torch.utils.data.Dataset`` of (input, target) pairs, or an
    ``(inputs, targets)`` tuple of tensors. ``info`` is a :class:`DataInfo`;
    ``task`` is ``"classification"`` or ``"lm"``.
    """

    train: Split
    eval: Split
    info: DataInfo
    task: str  # "classification" or "lm"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        values = _bind(_V2_FIELDS, args, kwargs)
        if values is None:
            old = _bind(_V1_FIELDS, args, kwargs)
            if old is None:
                raise TypeError(f"Data takes (train, eval, info, task) (entry-point contract {ENTRY_POINT_CONTRACT}, "
                                f"docs/workloads.md), got {_described(args, kwargs)}")
            values = _from_contract_1(old)
        self.info, self.task = values["info"], values["task"]
        self.train = as_split(values["train"], f"{FIELD} (Data.train)")
        self.eval = as_split(values["eval"], f"{FIELD} (Data.eval)")
        self.check()

    def check(self, field_name: str = FIELD) -> None:
        """Raise TypeError/ValueError naming the field of the Data that breaks the contract."""
        if not isinstance(self.info, DataInfo):
            raise TypeError(f"{field_name}: Data.info is a {type(self.info).__name__}, expected a "
                            "cohort.trainer.workloads.models.DataInfo")
        if self.task not in TASKS:
            raise ValueError(f"{field_name}: Data.task is {self.task!r}, expected one of {', '.join(TASKS)}")
        for name in ("train", "eval"):
            if not isinstance(getattr(self, name), Split):
                raise TypeError(f"{field_name}: Data.{name} is a {type(getattr(self, name)).__name__}, expected a "
                                "map-style torch Dataset of (input, target) pairs or an (inputs, targets) pair "
                                "of tensors")

    @classmethod
    def from_tensors(cls, train_x: torch.Tensor, train_y: torch.Tensor, eval_x: torch.Tensor,
                     eval_y: torch.Tensor, info: DataInfo, task: str) -> Data:
        return cls(TensorPairs(train_x, train_y), TensorPairs(eval_x, eval_y), info, task)


def _bind(fields: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The arguments by name, as a function of ``fields`` would take them, or None if it would not."""
    if len(args) > len(fields):
        return None
    values = dict(zip(fields, args, strict=False))
    if set(kwargs) - set(fields) or set(kwargs) & set(values) or len(values) + len(kwargs) != len(fields):
        return None
    return {**values, **kwargs}


def _described(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return ", ".join([f"{len(args)} positional arguments"] + [f"{k}=" for k in kwargs])


_warned = False


def _from_contract_1(values: dict[str, Any]) -> dict[str, Any]:
    """Contract 1's Data(train_x, train_y, eval_x, eval_y, info, task) as contract 2's arguments."""
    global _warned
    message = (f"Data(train_x, train_y, eval_x, eval_y, info, task) is entry-point contract 1, deprecated and "
               f"removed in cohort {CONTRACT_1_REMOVED_IN}: write Data(train, eval, info, task) with "
               "(inputs, targets) tensor pairs or Datasets, or Data.from_tensors(train_x, train_y, eval_x, "
               "eval_y, info, task) (docs/workloads.md)")
    warnings.warn(message, Contract1DeprecationWarning, stacklevel=3)
    if not _warned:  # Python hides a DeprecationWarning raised in a user's module: say it in the log too
        _warned = True
        log.warning("%s: %s", FIELD, message)
    return {"train": TensorPairs(values["train_x"], values["train_y"]),
            "eval": TensorPairs(values["eval_x"], values["eval_y"]), "info": values["info"], "task": values["task"]}
