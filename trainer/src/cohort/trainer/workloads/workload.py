"""The Workload a trainer runs, and how a spec's model/dataset names resolve to one.

User code plugs in through ``"pkg.module:function"`` strings:

- ``workload.dataset: "pkg.mod:make_data"`` is called as ``make_data(**datasetArgs)``
  and returns a :class:`~cohort.trainer.workloads.data.Data`: train and
  eval splits (map-style ``torch.utils.data.Dataset`` objects of (input,
  target) pairs, or tensor pairs), a :class:`DataInfo`, and ``task`` =
  "classification" or "lm".
- ``workload.model: "pkg.mod:make_model"`` is called as
  ``make_model(info, **modelArgs)`` with the dataset's :class:`DataInfo`, and
  returns an ``nn.Module`` (trained with the task's loss), or a whole
  :class:`Workload` (model, data, loss and metrics of its own).

That is entry-point contract :data:`~cohort.trainer.workloads.ENTRY_POINT_CONTRACT`
(docs/workloads.md). An entry point that cannot be called so, or returns another
type, fails the worker with a :class:`WorkloadError` naming the field and the
expected type: ``cohort-train`` exits 2 with it.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cohort.api.models import TrainingJobSpec

from . import ENTRY_POINT_CONTRACT
from .data import Data
from .datasets import DATASETS
from .models import MODELS, DataInfo


class WorkloadError(ValueError):
    """A model or dataset cannot be built; the message names the field or module."""


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def classification_metrics(output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Sums over a batch; the trainer adds them up across batches and ranks."""
    return {"correct": float((output.argmax(-1) == target).sum()), "count": float(target.numel()),
            "loss_sum": float(F.cross_entropy(output, target, reduction="sum"))}


def lm_metrics(output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    loss = F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1), reduction="sum")
    return {"count": float(target.numel()), "loss_sum": float(loss)}


def summarize(task: str, sums: dict[str, float]) -> dict[str, float]:
    """Turn summed batch metrics into accuracy / perplexity."""
    n = max(sums.get("count", 0.0), 1.0)
    out = {"eval_loss": sums.get("loss_sum", 0.0) / n}
    if task == "classification":
        out["accuracy"] = sums.get("correct", 0.0) / n
    else:
        out["perplexity"] = math.exp(min(out["eval_loss"], 50.0))
    return out


@dataclass
class Workload:
    """A model with its data, loss and metrics."""

    model: nn.Module
    data: Data
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = cross_entropy
    metrics_fn: Callable[[torch.Tensor, torch.Tensor], dict[str, float]] | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return self.data.task

    def batch_metrics(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
        fn = self.metrics_fn or (classification_metrics if self.task == "classification" else lm_metrics)
        return fn(output, target)


def load_entry_point(ref: str, field_name: str) -> Callable[..., Any]:
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import-time failure of user code
        raise WorkloadError(f"{field_name}: cannot import module {module_name!r} ({type(e).__name__}: {e})") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise WorkloadError(f"{field_name}: module {module_name!r} has no callable {attr!r}")
    return fn


CONTRACT = f"entry-point contract {ENTRY_POINT_CONTRACT}, docs/workloads.md"


def build_data(name: str, args: dict[str, Any]) -> Data:
    if ":" in name:
        fn = load_entry_point(name, "spec.workload.dataset")
        data = _call_entry(fn, name, "spec.workload.dataset", "f(**datasetArgs)", **args)
        if not isinstance(data, Data):
            raise WorkloadError(f"spec.workload.dataset: {name} returned a {type(data).__name__}, expected a "
                                f"cohort.trainer.workloads.data.Data ({CONTRACT})")
        try:
            data.check()  # fields changed after it was built
        except (TypeError, ValueError) as e:
            raise WorkloadError(f"{e} ({CONTRACT})") from e
        return data
    if name not in DATASETS:
        raise WorkloadError(f"spec.workload.dataset: unknown dataset {name!r}; built-in: {', '.join(DATASETS)}")
    return _call(DATASETS[name], "spec.workload.datasetArgs", **args)


def build_workload(spec: TrainingJobSpec, seed: int | None = None) -> Workload:
    """Build the workload of a spec (typed, from cohort.api); parameters seeded from workload.seed."""
    w = spec.workload
    data = build_data(w.dataset, w.dataset_args)
    torch.manual_seed(w.seed if seed is None else seed)
    if ":" in w.model:
        fn = load_entry_point(w.model, "spec.workload.model")
        made = _call_entry(fn, w.model, "spec.workload.model", "f(info, **modelArgs)", data.info, **w.model_args)
        if isinstance(made, Workload):
            if not isinstance(made.model, nn.Module) or not isinstance(made.data, Data):
                wrong = "model" if not isinstance(made.model, nn.Module) else "data"
                raise WorkloadError(f"spec.workload.model: {w.model} returned a Workload whose {wrong} is a "
                                    f"{type(getattr(made, wrong)).__name__}, expected a "
                                    f"{'torch.nn.Module' if wrong == 'model' else 'cohort.trainer.workloads.data.Data'}"
                                    f" ({CONTRACT})")
            return made
        if not isinstance(made, nn.Module):
            raise WorkloadError(f"spec.workload.model: {w.model} returned a {type(made).__name__}, expected a "
                                f"torch.nn.Module or a cohort.trainer.workloads.workload.Workload ({CONTRACT})")
        return Workload(made, data)
    if w.model not in MODELS:
        raise WorkloadError(f"spec.workload.model: unknown model {w.model!r}; built-in: {', '.join(MODELS)}")
    if w.model == "transformer" and data.task != "lm":
        raise WorkloadError("spec.workload.model: transformer needs a language-modelling dataset (e.g. synthetic-lm)")
    if w.model != "transformer" and data.task != "classification":
        raise WorkloadError(f"spec.workload.model: {w.model} needs a classification dataset, got {w.dataset}")
    return Workload(_call(MODELS[w.model], "spec.workload.modelArgs", data.info, **w.model_args), data)


def _call_entry(fn: Callable[..., Any], ref: str, field_name: str, expected: str, *args: Any, **kwargs: Any) -> Any:
    """Call a user's entry point; one that cannot take the contract's arguments is named as such."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise WorkloadError(f"{field_name}: {ref} cannot be called as {expected} ({CONTRACT}): {e}") from e
    except ValueError:
        pass  # no signature to read (a builtin): let the call say what is wrong
    return _call(fn, field_name, *args, **kwargs)


def _call(fn: Callable[..., Any], field_name: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except WorkloadError:
        raise
    except (TypeError, ValueError, OSError) as e:  # bad arguments, bad files
        message = str(e)
        raise WorkloadError(message if message.startswith(field_name) else f"{field_name}: {message}") from e


__all__ = ["DataInfo", "Workload", "WorkloadError", "build_workload", "summarize"]
