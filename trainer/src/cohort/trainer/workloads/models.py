"""Built-in models, keyed by the CRD's ``workload.model`` strings.

Module and parameter names are chosen for the parallelism plans: the MLP has
``fc1``/``fc2`` (column-/row-wise tensor parallel), and the transformer
follows torchtitan's layout (``tok_embeddings``, ``layers`` as a ModuleDict so
pipeline stages can drop layers and keep their FQNs, ``norm``, ``output``).
Forward passes tolerate missing parts (``None``) for pipeline stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .defaults import TRANSFORMER


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about its data."""

    input_shape: tuple[int, ...]
    num_classes: int = 0      # classification
    vocab_size: int = 0       # language modelling
    seq_len: int = 0


class MLP(nn.Module):
    def __init__(self, info: DataInfo, hidden: int = 128, depth: int = 1):
        super().__init__()
        d_in = math.prod(info.input_shape)
        self.fc1 = nn.Linear(d_in, hidden)
        self.hidden = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(depth - 1))
        self.fc2 = nn.Linear(hidden, info.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x.flatten(1)))
        for layer in self.hidden:
            h = F.relu(layer(h))
        return self.fc2(h)


class ConvNet(nn.Module):
    def __init__(self, info: DataInfo, channels: int = 16, hidden: int = 64):
        super().__init__()
        c, h, w = info.input_shape if len(info.input_shape) == 3 else (1, *_square(info.input_shape))
        self.shape = (c, h, w)
        self.conv1 = nn.Conv2d(c, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.fc1 = nn.Linear(2 * channels * (h // 2) * (w // 2), hidden)
        self.fc2 = nn.Linear(hidden, info.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(x.shape[0], *self.shape)
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def _square(shape: tuple[int, ...]) -> tuple[int, int]:
    n = math.prod(shape)
    side = int(math.isqrt(n))
    if side * side != n:
        raise ValueError(f"convnet needs image-shaped input, got {shape}")
    return side, side


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a slice of the heads.
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, ffn_mult: int):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim, ffn_mult * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """A small decoder-only language model."""

    def __init__(self, info: DataInfo, dim: int = TRANSFORMER.dim, n_layers: int = TRANSFORMER.n_layers,
                 n_heads: int = TRANSFORMER.n_heads, ffn_mult: int = TRANSFORMER.ffn_mult):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"modelArgs.dim ({dim}) must be divisible by modelArgs.n_heads ({n_heads})")
        self.config = {"dim": dim, "n_layers": n_layers, "n_heads": n_heads, "ffn_mult": ffn_mult,
                       "vocab_size": info.vocab_size, "seq_len": info.seq_len}
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(info.vocab_size, dim)
        self.pos_embeddings: nn.Embedding | None = nn.Embedding(info.seq_len, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim, n_heads, ffn_mult) for i in range(n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(dim)
        self.output: nn.Linear | None = nn.Linear(dim, info.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                h = h + self.pos_embeddings(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


MODELS = {"mlp": MLP, "convnet": ConvNet, "transformer": Transformer}
