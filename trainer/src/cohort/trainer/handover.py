"""The live-peer hand-over: one rank's training state broadcast to the others, tensors through the group.

A newcomer (or a survivor that fell behind) takes the state of a peer that
holds the newest step. The state's structure, with its tensors left out, is
small host metadata and goes as one pickled object over gloo; the tensors go
as tensors: those on the sender's device are packed into one flat buffer per
dtype and broadcast on the device (NCCL on a GPU), those on the host (RNG
states, step counters) the same way over gloo. Each receiver allocates the
buffers on its own device, so a device tensor is never pickled and nothing is
loaded onto a device the receiver does not have.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten


class _Slot:
    """Where the ``index``-th tensor goes back into the state's structure."""

    def __init__(self, index: int):
        self.index = index


def broadcast_state(state: Any, src: int, rank: int, device: torch.device,
                    group: dist.ProcessGroup | None = None) -> tuple[Any, int]:
    """Every rank returns rank ``src``'s ``state`` (its own on ``src``) and the bytes handed over."""
    header: list[Any] = [None]
    leaves: list[Any] = []
    if rank == src:
        leaves, spec = tree_flatten(state)
        layout = [(i, tuple(v.shape), v.dtype, v.device.type != "cpu")
                  for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        # The structure with a slot per tensor (a plain nested object: torch's TreeSpec is not for pickling).
        skeleton = tree_unflatten([_Slot(i) if isinstance(v, torch.Tensor) else v for i, v in enumerate(leaves)],
                                  spec)
        header = [pickle.dumps((skeleton, layout))]
    dist.broadcast_object_list(header, src=src, group=group)
    skeleton, layout = pickle.loads(header[0])
    nbytes = len(header[0])
    received: dict[int, torch.Tensor] = {}
    groups: dict[tuple[bool, torch.dtype], list[tuple[int, tuple[int, ...]]]] = {}
    for i, shape, dtype, on_device in layout:
        groups.setdefault((on_device, dtype), []).append((i, shape))
    for (on_device, dtype), members in groups.items():
        where = device if on_device else torch.device("cpu")
        if rank == src:
            flat = torch.cat([leaves[i].detach().reshape(-1).to(where) for i, _ in members])
        else:
            flat = torch.empty(sum(_numel(s) for _, s in members), dtype=dtype, device=where)
        dist.broadcast(flat, src=src, group=group)
        nbytes += flat.numel() * flat.element_size()
        offset = 0
        for i, shape in members:
            n = _numel(shape)
            received[i] = flat[offset:offset + n].view(shape).clone()
            offset += n
    if rank == src:
        return state, nbytes
    slots, spec = tree_flatten(skeleton)
    return tree_unflatten([received[v.index] if isinstance(v, _Slot) else v for v in slots], spec), nbytes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
