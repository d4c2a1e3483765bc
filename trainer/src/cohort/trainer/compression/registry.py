"""COMPRESSORS: ``spec.compression.method`` -> Compressor class.

``none`` and ``powersgd`` are not payload compressors: ``none`` is DDP's dense
allreduce, and PowerSGD is torch's own DDP hook (see hooks.py), so neither
appears here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import Compressor
from .cast import BF16, FP16
from .quantize import QSGD, TernGrad
from .sign import ScaledSign
from .sparsify import RandomK, TopK

COMPRESSORS: dict[str, type[Compressor]] = {
    "fp16": FP16,
    "bf16": BF16,
    "topk": TopK,
    "randomk": RandomK,
    "qsgd": QSGD,
    "terngrad": TernGrad,
    "signsgd": ScaledSign,
}


def build_compressor(compression: Any, contractive: bool = False) -> Compressor:
    """The compressor ``spec.compression`` names; ``contractive`` for CHOCO-gossip (where the Config has it)."""
    cls = COMPRESSORS[compression.method]
    names = {f.name for f in dataclasses.fields(cls.Config)}
    overrides = {"contractive": True} if contractive and "contractive" in names else {}
    return cls.from_spec(compression, **overrides)


def uses_error_feedback(compressor: Compressor, compression: Any) -> bool:
    """Error feedback applies to the biased compressors, unless compression.errorFeedback turns it off."""
    return compressor.biased and bool(compression.error_feedback)
