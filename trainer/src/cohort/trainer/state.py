"""Training state: what a checkpoint holds and what a live peer hands over.

The state is model + optimizer + the trainer's own position (step, data
sampler, learning-rate schedule, RNG) + what the sync algorithm keeps across
worlds (``sync``: local SGD's outer step, sync/localsgd.py ``carried_state``). Checkpoints go through DCP's
``get_state_dict``/``set_state_dict`` (so wrapped and sharded models save
with plain FQNs and reload at another world size); peer hand-over broadcasts
the same state from one live member to all others.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from .handover import broadcast_state
from .runtime.device import rng_state, set_rng_state
from .sampler import ElasticSampler
from .sync.flat import named_slices


class TrainState:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, sampler: ElasticSampler,
                 device: torch.device | None = None, scaler: torch.amp.GradScaler | None = None,
                 sync: dict[str, torch.Tensor] | None = None):
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self.sync = sync if sync is not None else {}  # updated in place by the sync; same keys in every process
        self.device = device or torch.device("cpu")
        self.scaler = scaler  # fp16's loss scale is state too: resuming with another one is not exact
        self.step = 0
        self.has_state = False  # False until this process trains or receives state

    def trainer_state(self) -> dict[str, Any]:
        s: dict[str, Any] = {"step": self.step, "sampler": self.sampler.state_dict(), "rng": torch.get_rng_state()}
        device_rng = rng_state(self.device)
        if device_rng is not None:
            s["device_rng"] = device_rng
        if self.scaler is not None:
            s["scaler"] = self.scaler.state_dict()
        return s

    def load_trainer_state(self, s: dict[str, Any]) -> None:
        self.step = int(s["step"])
        self.sampler.load_state_dict(s["sampler"])
        torch.set_rng_state(s["rng"])
        set_rng_state(self.device, s.get("device_rng"))
        if self.scaler is not None and s.get("scaler"):
            self.scaler.load_state_dict(s["scaler"])
        self.has_state = True

    def rebind(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Hold a newly built model and optimizer (a sharded plan's new world); back to step 0 until loaded."""
        self.model, self.optimizer = model, optimizer
        self.step = 0
        self.sampler.load_state_dict({"epoch": 0, "offset": 0, "num_samples": self.sampler.num_samples})
        self.has_state = False

    # --- checkpoint form -------------------------------------------------------
    OPTIONAL = ("sync",)
    """Keys of the checkpoint form that a checkpoint may lack (written before Cohort kept them)."""

    def checkpoint_state(self, params: torch.Tensor | None = None) -> dict[str, Any]:
        """``params``: the model's parameters to write instead of this process's (flat, in
        ``parameters_to_vector``'s order): the one model replicas that train apart make (``Plan.consensus``)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if params is not None:
            model_sd.update(named_slices(self.model, params))
        state = {"model": model_sd, "optim": optim_sd, "trainer": self.trainer_state()}
        if self.sync:
            state["sync"] = self.sync  # loaded in place
        return state

    def after_checkpoint_load(self, loaded: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=loaded["model"],
                       optim_state_dict=loaded["optim"])
        self.load_trainer_state(loaded["trainer"])

    # --- peer hand-over --------------------------------------------------------
    def broadcast(self, src: int, rank: int, group: dist.ProcessGroup | None = None, sync: bool = True) -> int:
        """Make every rank's state equal to rank ``src``'s (handover.py); returns the bytes handed over. ``sync``
        False leaves the sync's carried state out (at a fresh start every rank built the same)."""
        mine = {"model": self.model.state_dict(), "optim": self.optimizer.state_dict(),
                "trainer": self.trainer_state(), "sync": self.sync if sync else {}} if rank == src else None
        state, nbytes = broadcast_state(mine, src, rank, self.device, group)
        if rank != src:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optim"])
            self.load_trainer_state(state["trainer"])
            for key, value in state["sync"].items():
                self.sync[key].copy_(value)
        return nbytes
