"""The DeviceMesh of one world: ``("pp", "dp", "tp")``, built from ParallelDims.

Rebuilt after every membership change (the old one's groups die with the old
default group). tp is the innermost dimension so tensor-parallel peers, which
talk every layer, are neighbours in rank order (on one host or node when ranks
are packed); pp is outermost, so rank 0 holds the first stage. The mesh's
device type is the worker's device (runtime/device.py), so DTensors and FSDP's
buffers live there and its subgroups take the default group's backends.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ..planner.dims import ParallelDims
from ..runtime.process_group import gloo_options_bound_to

MESH_DIMS = ("pp", "dp", "tp")


def build_mesh(dims: ParallelDims, device: torch.device) -> DeviceMesh:
    """Collective: every rank of the world calls this with the same dims."""
    override: dict[int | str, Any] | None = None
    ip = os.environ.get("COHORT_POD_IP")
    if ip and device.type == "cpu":
        # Pods bind gloo to their own IP (runtime/process_group.py); the mesh's subgroups must too,
        # or they listen on whatever the host name resolves to.
        override = {name: ("gloo", gloo_options_bound_to(ip)) for name in MESH_DIMS}
    return init_device_mesh(device.type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=MESH_DIMS,
                            backend_override=override)
