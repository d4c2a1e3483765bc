"""Hugging Face transformers' GPT-2, built from a config with random weights (nothing is downloaded).

    model: "cohort_user_example.hf_gpt2:make_model"
    modelArgs: {n_layer: 2, n_embd: 64, n_head: 2}
"""

from __future__ import annotations

import torch
from torch import nn

from cohort.trainer.workloads.models import DataInfo


class GPT2Logits(nn.Module):
    """Cohort's trainer calls model(inputs) and expects logits; GPT2LMHeadModel returns an output object."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens).logits


def make_model(info: DataInfo, n_layer: int = 2, n_embd: int = 64, n_head: int = 2) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=info.vocab_size, n_positions=info.seq_len, n_layer=n_layer, n_embd=n_embd,
                        n_head=n_head)
    return GPT2Logits(GPT2LMHeadModel(config))
