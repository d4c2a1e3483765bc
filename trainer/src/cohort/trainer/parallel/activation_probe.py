"""What a model keeps for backward, measured on the job's device, in its precision, for each checkpointing mode.

``activationCheckpointing: auto`` needs to know how many bytes of activations a plan keeps. The planner counts
them by hand for the built-in transformer in fp32 (planner/profile.py); under bf16 autocast most of them are
half that, autocast keeps a low-precision copy of each weight until backward, and a user's model is not counted
at all. So the trainer measures them, the way the tests check the planner's count: it runs the model's first
block on the job's device under the job's autocast, inside a dispatch mode that notes each storage an operation
creates, and after the forward sums those that are still alive (what autograd, and selective checkpointing's
cache, hold). The model's parameters and the block's input were not created under it and are not counted.

- **One block's share**: two copies of the block in a chain, less one, so that the share is a block's own
  storages plus its input if it keeps it (the previous block created it); the same at one sample and two gives
  the bytes per sample and the bytes that do not grow with the batch (autocast's weight copies). Each mode runs
  the block as ``apply_activation_checkpointing`` would (torch's non-reentrant checkpoint).
- **The rest** (embeddings, the final layers, the output and the loss's own saved tensors): the whole model with
  each block's forward passing its input through, at one sample and two, on the device: in place when the model
  is there (a replicated plan's), else a copy of the model without its blocks (a sharded plan's model is on the
  host: only its embeddings and head go to the device).
- Under FSDP with bf16 (``MixedPrecisionPolicy``) the block computes with bf16 parameters and casts its input to
  bf16: measured so (``param_dtype``).

The block's input comes from a forward of the model (no gradients) that stops at the first block. Blocks are taken
as alike (the first stands for all). A block whose output is neither a tensor shaped like its input nor a tuple
starting with one cannot be chained: :class:`ProbeError`, and auto falls back.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from ..planner.dims import CHECKPOINTING_ORDER
from ..runtime.device import autocast
from .activation_checkpoint import _checkpointed
from .fsdp import shard_units

MODES = CHECKPOINTING_ORDER  # what is measured: every activation checkpointing mode


class ProbeError(RuntimeError):
    """The model's activations cannot be measured (the message says why)."""


@dataclass(frozen=True)
class Kept:
    """Bytes kept for backward: per sample, and whatever the batch."""

    per_sample: float
    fixed: float


@dataclass(frozen=True)
class Activations:
    """What the model keeps: one block's share under each checkpointing mode, and the rest's."""

    block: dict[str, Kept]
    rest: Kept


@dataclass(frozen=True)
class ProbeBatch:
    """Two samples of the job's data (inputs, targets) and its loss, for the measurement."""

    inputs: torch.Tensor
    targets: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    @classmethod
    def of(cls, workload: Any) -> ProbeBatch:
        train = workload.data.train
        inputs, targets = train.fetch(torch.tensor([0, min(1, len(train) - 1)]))
        return cls(inputs, targets, workload.loss_fn)


class _Created(TorchDispatchMode):
    """Notes the storages operations create on ``device_type`` (views and in-place results are not new)."""

    def __init__(self, device_type: str, before: set[int]):
        super().__init__()
        self.device_type, self.before = device_type, before
        self.refs: list[tuple[int, int, int]] = []  # (weak reference, bytes, address)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                    s = t.untyped_storage()
                    if s.data_ptr() not in self.before:
                        self.refs.append((cast(int, s._weak_ref()), s.nbytes(), s.data_ptr()))
        return out

    def alive(self) -> int:
        """Bytes of the noted storages still alive; releases the weak references."""
        alive = {ptr: n for ref, n, ptr in self.refs if not torch.UntypedStorage._expired(ref)}
        for ref, _n, _ptr in self.refs:
            torch.UntypedStorage._free_weak_ref(ref)
        self.refs.clear()
        return sum(alive.values())


def _storages(*things: Any) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tree_leaves(things) if isinstance(t, torch.Tensor)}


class _Stop(Exception):
    pass


def _first_block_call(model: nn.Module, block: nn.Module, inputs: torch.Tensor, device: torch.device,
                      precision: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments the model passes its first block for ``inputs`` (the forward stops there)."""
    call: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def stop(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        call.append((args, kwargs))
        raise _Stop

    handle = block.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad(), autocast(device, precision):
            model(inputs.to(device))
    except _Stop:
        pass
    finally:
        handle.remove()
    if not call or not call[0][0] or not isinstance(call[0][0][0], torch.Tensor):
        raise ProbeError(f"{type(model).__name__}'s forward does not pass a tensor to its first block")
    return call[0]


def _block_input(call: tuple[tuple[Any, ...], dict[str, Any]], device: torch.device,
                 param_dtype: torch.dtype) -> tuple[torch.Tensor, tuple[Any, ...], dict[str, Any]]:
    """The first block's call on ``device``: its input (detached, floating point in ``param_dtype``, as the
    previous block would answer under FSDP's MixedPrecisionPolicy), its other arguments and keywords."""
    args, kwargs = tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, call)
    x = args[0].detach()
    return (x.to(param_dtype) if x.is_floating_point() else x), args, kwargs


def _block_share(blocks: tuple[nn.Module, nn.Module], call: tuple[tuple[Any, ...], dict[str, Any]], mode: str,
                 device: torch.device, precision: str, param_dtype: torch.dtype) -> int:
    """Bytes the second of two chained blocks adds to what the first keeps (the share of one block in a chain)."""
    def kept(depth: int) -> int:
        x, args, kwargs = _block_input(call, device, param_dtype)
        x.requires_grad_(x.is_floating_point())
        before = _storages(x, args, kwargs, *(b.parameters() for b in blocks), *(b.buffers() for b in blocks))
        outputs = []  # each block's whole output stays referenced, as the model's forward may keep it
        with _Created(device.type, before) as created, autocast(device, precision):
            h = x
            for block in blocks[:depth]:
                out = block(h, *args[1:], **kwargs) if mode == "none" else \
                    _checkpointed(block.forward, mode, h, *args[1:], **kwargs)
                outputs.append(out)
                h = out[0] if isinstance(out, (tuple, list)) and out else out  # (hidden, ...) as Hugging Face's
                if not isinstance(h, torch.Tensor) or h.shape != x.shape:
                    raise ProbeError(f"{type(block).__name__} returns no tensor shaped like its input (nor a tuple "
                                     "starting with one): its blocks cannot be measured in a chain")
        n = created.alive()
        del outputs, out, h
        return n

    return kept(2) - kept(1)


def _pass_through(x: Any, *args: Any, answers: int = 0, **kwargs: Any) -> Any:
    """A block's stand-in: its input, in a tuple of ``answers`` elements when the block answers one."""
    return (x, *[None] * (answers - 1)) if answers else x


@contextmanager
def _blocks_pass_through(blocks: list[nn.Module], answers: int) -> Iterator[None]:
    """Each block's forward returns its input, for the time being."""
    own = [block.__dict__.get("forward") for block in blocks]
    for block in blocks:
        block.forward = functools.partial(_pass_through, answers=answers)
    try:
        yield
    finally:
        for block, forward in zip(blocks, own, strict=True):
            if forward is None:
                del block.forward
            else:
                block.forward = forward


class _PassThrough(nn.Module):
    def __init__(self, answers: int):
        super().__init__()
        self.answers = answers

    def forward(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return _pass_through(x, answers=self.answers)


def without_blocks(model: nn.Module, blocks: list[nn.Module], answers: int = 0) -> nn.Module:
    """A copy of ``model`` whose blocks pass their input through: only its own tensors (embeddings, head) are
    copied, for measuring the rest on a device the model is not on."""
    memo: dict[int, Any] = {id(block): _PassThrough(answers) for block in blocks}
    return copy.deepcopy(model, memo)


@contextmanager
def _rest_on(model: nn.Module, blocks: list[nn.Module], answers: int, device: torch.device) -> Iterator[nn.Module]:
    """The model with its blocks passed through, on ``device``: itself if it is there, else a copy of the rest."""
    if next(model.parameters()).device == device:
        with _blocks_pass_through(blocks, answers):
            yield model
    else:
        rest = without_blocks(model, blocks, answers).to(device)
        yield rest
        del rest


def _rest_kept(rest: nn.Module, batch: ProbeBatch, samples: int, device: torch.device, precision: str) -> int:
    x, y = batch.inputs[:samples].to(device), batch.targets[:samples].to(device)
    before = _storages(x, y, list(rest.parameters()), list(rest.buffers()))
    with _Created(device.type, before) as created, autocast(device, precision):
        out = rest(x)
        loss = batch.loss_fn(out, y)
    n = created.alive()
    del out, loss
    return n


def _per_sample(one: int, two: int) -> Kept:
    per = float(two - one)
    return Kept(per_sample=per, fixed=max(float(one) - per, 0.0))


def measure_activations(model: nn.Module, batch: ProbeBatch, device: torch.device, precision: str = "fp32",
                        param_dtype: torch.dtype = torch.float32) -> Activations:
    """What ``model`` (with ``layers``) keeps for backward on ``device`` under ``precision``, per mode."""
    blocks = shard_units(model)
    if not blocks:
        raise ProbeError(f"{type(model).__name__} has no blocks (a `layers` ModuleList or ModuleDict)")
    model_device = next(model.parameters()).device
    calls = [_first_block_call(model, blocks[0], batch.inputs[:n], model_device, precision) for n in (1, 2)]
    pair = tuple(copy.deepcopy(blocks[0]).to(device=device, dtype=param_dtype) for _ in range(2))
    share = {mode: _per_sample(*(_block_share(pair, call, mode, device, precision, param_dtype)  # type: ignore[arg-type]
                                 for call in calls)) for mode in MODES}
    answers = _answers(pair[0], calls[0], device, precision, param_dtype)
    del pair
    with _rest_on(model, blocks, answers, device) as rest_model:
        rest = _per_sample(*(_rest_kept(rest_model, batch, n, device, precision) for n in (1, 2)))
    return Activations(block=share, rest=rest)


def _answers(block: nn.Module, call: tuple[tuple[Any, ...], dict[str, Any]], device: torch.device, precision: str,
             param_dtype: torch.dtype) -> int:
    """How many elements the block's answer has when it is a tuple (0: a tensor)."""
    x, args, kwargs = _block_input(call, device, param_dtype)
    with torch.no_grad(), autocast(device, precision):
        out = block(x, *args[1:], **kwargs)
    return len(out) if isinstance(out, (tuple, list)) else 0

