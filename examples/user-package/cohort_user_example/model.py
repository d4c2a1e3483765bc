"""A user's model: a small GRU language model. ``make_model(info, **modelArgs)`` gets the dataset's DataInfo."""

from __future__ import annotations

import torch
from torch import nn

from cohort.trainer.workloads.models import DataInfo


class GRULM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.rnn = nn.GRU(dim, dim, num_layers=layers, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.head(out)  # logits (batch, seq, vocab): the trainer's lm loss and perplexity apply


def make_model(info: DataInfo, dim: int = 64, layers: int = 1) -> nn.Module:
    return GRULM(info.vocab_size, dim, layers)
