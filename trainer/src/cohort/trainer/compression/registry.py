"""METHODS: every ``spec.compression.method`` of the CRD enum -> its class (base.py says what a class holds)."""

from __future__ import annotations

from typing import Any

from .base import Method
from .cast import BF16, FP16, FP32
from .dgc import DGC
from .fp8 import FP8
from .powersgd import PowerSGD
from .quantize import QSGD, Natural, TernGrad
from .sign import OneBit, ScaledSign, Signum
from .sparsify import RandomK, Threshold, TopK

METHODS: dict[str, type[Method]] = {
    "none": FP32,
    "fp16": FP16,
    "bf16": BF16,
    "fp8": FP8,
    "powersgd": PowerSGD,
    "topk": TopK,
    "randomk": RandomK,
    "qsgd": QSGD,
    "terngrad": TernGrad,
    "signsgd": ScaledSign,
    "dgc": DGC,
    "threshold": Threshold,
    "natural": Natural,
    "onebit": OneBit,
    "signum": Signum,
}


def build_method(compression: Any, contractive: bool = False) -> Method:
    """The method ``spec.compression`` names; ``contractive`` for CHOCO-gossip (where the Config has it)."""
    return METHODS[compression.method].from_spec(compression, contractive=contractive)
