"""Training state: what a checkpoint holds and what a live peer hands over.

The state is model + optimizer + the trainer's own position (step, data
sampler, learning-rate schedule, RNG). Checkpoints go through DCP's
``get_state_dict``/``set_state_dict`` (so wrapped and sharded models save
with plain FQNs and reload at another world size); peer hand-over broadcasts
the same state from one live member to all others.
"""

from __future__ import annotations

import io
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .sampler import ElasticSampler


class TrainState:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: ElasticSampler):
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.step = 0
        self.has_state = False  # False until this process trains or receives state

    def trainer_state(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "rng": torch.get_rng_state()}

    def load_trainer_state(self, s: dict[str, Any]) -> None:
        self.step = int(s["step"])
        self.sampler.load_state_dict(s["sampler"])
        torch.set_rng_state(s["rng"])
        self.has_state = True

    def rebind(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Hold a newly built model and optimizer (a sharded plan's new world); back to step 0 until loaded."""
        self.model, self.optimizer = model, optimizer
        self.step = 0
        self.sampler.load_state_dict({"epoch": 0, "offset": 0, "num_samples": self.sampler.num_samples})
        self.has_state = False

    # --- checkpoint form -------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd, "trainer": self.trainer_state()}

    def after_checkpoint_load(self, loaded: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optim"])
        self.load_trainer_state(loaded["trainer"])

    # --- peer hand-over --------------------------------------------------------
    def broadcast(self, src: int, rank: int, group: dist.ProcessGroup | None = None) -> int:
        """Make every rank's state equal to rank ``src``'s; returns the bytes handed over."""
        payload: list[bytes | None] = [None]
        if rank == src:
            buf = io.BytesIO()
            torch.save({"model": self.model.state_dict(), "optim": self.optimizer.state_dict(),
                        "trainer": self.trainer_state()}, buf)
            payload = [buf.getvalue()]
        dist.broadcast_object_list(payload, src=src, group=group)
        data = payload[0]
        assert isinstance(data, bytes)
        if rank != src:
            state = torch.load(io.BytesIO(data), weights_only=False)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optim"])
            self.load_trainer_state(state["trainer"])
        return len(data)
