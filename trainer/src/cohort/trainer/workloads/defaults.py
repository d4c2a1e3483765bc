"""The built-in models' and datasets' default arguments, importable without torch.

The models and datasets take their defaults from here, and ``cohort plan``
(``profiling.profile_spec``) reads them to count the built-in transformer
without building it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransformerArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    ffn_mult: int = 4


@dataclass(frozen=True)
class SyntheticLMArgs:
    sequences: int = 2048
    seq_len: int = 32
    vocab: int = 64
    branching: int = 4
    seed: int = 0
    test_fraction: float = 0.1


TRANSFORMER = TransformerArgs()
SYNTHETIC_LM = SyntheticLMArgs()
