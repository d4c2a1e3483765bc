"""PARALLELISMS: ``spec.parallelism.strategy`` -> Plan class."""

from __future__ import annotations

from .auto import AutoPlan
from .base import Plan
from .data import DataParallel
from .strategies import FSDPPlan, HybridPlan, PipelinePlan, TensorPlan

PARALLELISMS: dict[str, type[Plan]] = {
    "data": DataParallel,
    "fsdp": FSDPPlan,
    "tensor": TensorPlan,
    "pipeline": PipelinePlan,
    "hybrid": HybridPlan,
    "auto": AutoPlan,
}

# The strategies whose every world is sharded (their plans are MeshPlans): their model never trains unsharded.
SHARDED_STRATEGIES = frozenset({"fsdp", "tensor", "pipeline", "hybrid"})
