"""Background staging for async checkpoints: copy the state while the next step computes.

DCP's ``async_save`` writes from a *staged* copy of the state, so training may
change the live tensors while the write goes on. This stager makes that copy
in its own thread, into CPU buffers it keeps between saves (no allocation
after the first save), and returns at once: the trainer waits for the copy
only right before its next optimizer update (``Checkpointer.before_update``).
Large tensor copies release the GIL, so the copy overlaps forward and
backward. It implements torch's ``AsyncStager`` protocol; sharded (DTensor)
states use torch's ``DefaultStager`` instead, since copying a DTensor may
need collectives that must not run on a background thread.

One ``DefaultStager`` serves every save where torch allows it (its pinned buffers are kept between saves).
torch 2.11's cannot stage twice: it clears its copier's dispatch table at the end of each stage, and the next
save through it fails with ``KeyError(<class 'type'>)`` (pytorch/pytorch issue 183413, a regression of 2.11.0,
fixed by pull request 183424; torch 2.13's stages again). The GPU machines lent so far run 2.11.
:func:`default_stager_reusable` finds out which, once per process, by staging a one-element dict twice.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class BackgroundStager:
    _synchronize_after_execute = False  # async_save must not wait for staging before returning

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cohort-staging")

    def stage(self, state_dict: dict[str, Any], **kwargs: Any) -> Future[dict[str, Any]]:
        return self._pool.submit(self._copy, state_dict, ())

    def _copy(self, obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, torch.Tensor):
            buf = self._buffers.get(path)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = self._buffers[path] = torch.empty_like(obj, device="cpu", pin_memory=obj.is_cuda)
            buf.copy_(obj)
            return buf
        if isinstance(obj, dict):
            return {k: self._copy(v, (*path, k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._copy(v, (*path, i)) for i, v in enumerate(obj))
        return obj

    def synchronize_staging(self) -> None:
        pass  # staging_completion (a Future) is what callers wait on

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def first_dtensor(state: Any) -> Any:
    """The first DTensor among a (nested) state's leaves, or None."""
    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_leaves

    return next((leaf for leaf in tree_leaves(state) if isinstance(leaf, DTensor)), None)


def propagate_in_this_thread(dtensor: Any) -> None:
    """Run the DTensor op that ``DefaultStager`` runs first on each tensor (``new_empty`` on the CPU) here, in
    the saving thread, before its staging thread does.

    A DTensor op's first sharding propagation enters a ``FakeTensorMode``. torch 2.11 built with CUDA, on a
    machine without a GPU, crashes the process (SIGSEGV in ``FakeTensorMode.__enter__``, at its
    ``torch._C._ensureCUDADeviceGuardSet()``) when that first entry happens on the staging thread while the main
    thread goes on with the save; after one entry on the main thread it does not (5 of 5 runs, against 3 of 3
    crashes without). torch 2.13 does not crash either way. The trainer has usually run DTensor ops in its
    optimizer step before its first save; this makes a save safe without one. Cheap: one empty tensor."""
    dtensor.new_empty([], device="cpu")


def default_stager(cuda: bool, *, asynchronous: bool = True) -> Any:
    """torch's stager for sharded states: staged in its own thread (unless not ``asynchronous``), into pinned
    memory on a GPU worker."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    return DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                        use_async_staging=asynchronous, use_non_blocking_copy=cuda))


@functools.cache
def default_stager_reusable() -> bool:
    """Whether one ``DefaultStager`` can stage more than one save with this torch (the module's docstring)."""
    stager = default_stager(False, asynchronous=False)
    try:
        for _ in range(2):
            stager.stage({"probe": torch.zeros(1)})
        return True
    except KeyError:
        return False
    finally:
        stager.close()
