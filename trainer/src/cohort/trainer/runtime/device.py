"""The worker's device: chosen once, before the process group forms; everything else asks here.

One trainer process drives one device (DESIGN.md, Devices). ``select_device``
picks it the way torchtitan does: ``cuda:0`` when the process sees one GPU (a
pod given one ``nvidia.com/gpu``), ``cuda:<LOCAL_RANK>`` when it sees several
(``cohort run --local`` on a multi-GPU machine), else the CPU. It sets the
current device before any CUDA work, so NCCL's communicator, the caching
allocator and every kernel land there. ``COHORT_DEVICE`` forces a device type
(``cpu``, ``cuda``, or any device type registered with torch: the test suite
registers a simulated accelerator this way, trainer/tests/simulated_device.py).

After this, code allocates like its input (``zeros_like``, ``new_empty``,
``device=x.device``) and never asks "am I on a GPU?" except through the few
helpers below: the process group's backends, the device's RNG state for exact
resume, a synchronisation point for timing, and the peak memory.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def select_device(env: dict[str, str] | None = None) -> torch.device:
    """This process's device; sets it as the current device of its type (call before the process group)."""
    env = dict(os.environ if env is None else env)
    kind = env.get("COHORT_DEVICE", "") or ("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cpu":
        return torch.device("cpu")
    module = torch.get_device_module(kind)
    count = module.device_count()
    if count < 1:
        raise RuntimeError(f"COHORT_DEVICE={kind}: no {kind} device is visible to this process")
    index = 0 if count == 1 else int(env.get("LOCAL_RANK", "0")) % count
    device = torch.device(kind, index)
    module.set_device(index)
    return device


NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def keep_process_on_nccl_errors(device: torch.device, elastic: bool, env: MutableMapping[str, str]) -> bool:
    """An elastic GPU worker survives a failed NCCL collective: set ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``.

    torch's default (3) ends the process when its watchdog finds a collective failed or timed out
    (``faultTolerance.collectiveTimeoutSeconds``), and the survivors of a lost peer would die with it.
    2 aborts the communicators and keeps the process: the failure reaches the trainer as an error, the
    commit gate discards the step (commit.py), and the next world forms in place. Unset only; a job's
    own value wins. A static (torchrun-style) world has nothing to re-form into and keeps torch's default.
    Returns whether it set the variable.
    """
    if device.type != "cuda" or not elastic or NCCL_ERROR_HANDLING in env:
        return False
    env[NCCL_ERROR_HANDLING] = "2"
    return True


def backend_for(device: torch.device, env: dict[str, str] | None = None) -> str:
    """The process group's backends: NCCL for CUDA tensors, gloo for host tensors (metadata, objects).

    ``COHORT_PG_BACKEND`` overrides it with torch's ``device:backend`` list (e.g. ``cpu:gloo,cuda:gloo``
    to take NCCL out of a suspected hang; the device tests give their simulated device gloo this way).
    """
    override = (os.environ if env is None else env).get("COHORT_PG_BACKEND", "")
    if override:
        return override
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def autocast(device: torch.device, precision: str) -> AbstractContextManager[Any]:
    """Forward (and the backward it records) in the spec's precision, on this device's type."""
    dtype = PRECISIONS[precision]
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timing reads the clock after this; a no-op on the CPU)."""
    if device.type != "cpu":
        torch.get_device_module(device.type).synchronize(device)


def rng_state(device: torch.device) -> torch.Tensor | None:
    """The device's generator state (dropout on a GPU draws from it), for exact resume; None on the CPU."""
    if device.type == "cpu":
        return None
    return torch.get_device_module(device.type).get_rng_state(device)


def set_rng_state(device: torch.device, state: torch.Tensor | None) -> None:
    if device.type != "cpu" and state is not None:
        torch.get_device_module(device.type).set_rng_state(state.cpu(), device)


def peak_memory_bytes(device: torch.device) -> int | None:
    """Most memory the caching allocator held since the start (CUDA only; None elsewhere)."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch onto the device: through pinned memory and a non-blocking copy on CUDA."""
    if t.device == device:
        return t
    if device.type == "cuda":
        return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)
    return t.to(device)
