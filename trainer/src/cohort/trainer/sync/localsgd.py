"""``sync.algorithm: localsgd``: post-local SGD (Lin et al. 2020, "Don't Use Large
Mini-Batches, Use Local SGD"; Stich 2019, "Local SGD Converges Fast and
Communicates Little"), with torch's own pieces.

For the first ``sync.warmupSteps`` steps, DDP allreduces gradients (torch's
``post_localSGD_hook``); after that each rank steps on its own gradients and
every ``sync.period`` steps the replicas average their parameters (torch's
``PeriodicModelAverager`` schedule; the average as its ``average_parameters``
computes it, but the parameters take it only once the commit gate's check
passes: on NCCL a failed round's result may be half written). The hook's subgroup, normally the ranks sharing a
machine, is explicit here: a Cohort pod is its own machine, so the subgroup is
the rank alone (torch's default subgroup needs CUDA and fails on CPU).

``sync.outerOptimizer`` turns the average into an outer step (DiLoCo: Douillard et al. 2023,
"DiLoCo: Distributed Low-Communication Training of Language Models"; SlowMo: Wang et al. 2020,
"SlowMo: Improving Communication-Efficient Distributed SGD with Slow Momentum"): the previous
round's parameters minus the new average is an outer gradient, and torch's SGD (with Nesterov
momentum for ``nesterov``) steps the previous round's parameters by it. The previous round's
parameters and the outer momentum are identical on every rank (each computed from the same
averages), so the step needs no communication. Both outlive the world, as torchft's DiLoCo keeps
them through recovery: they are tensors the trainer holds (``TrainState.sync``, made by
:func:`carried_state`), hands to a newcomer with the rest of the state and writes into checkpoints,
so the first round after a world change or a restart is an outer step that goes on with the
momentum. A new world checks that its members hold the same round before using it (else that
round is a plain average and the momentum starts again).

``sync.fragments`` and ``sync.overlapSteps`` are Streaming DiLoCo's (Douillard et al. 2025): each round
averages one of F slices of the flat parameter vector, and its allreduce may run behind the next inner steps
(``async_op``), the parameters taking it ``overlapSteps`` later, mixed with the local slice by ``sync.mixing``.

fp16, bf16 and fp8 apply to both exchanges: the warm-up's gradients go through the method's DDP hook (as under
``sync.algorithm: allreduce``), and the averaging sends the change since the previous average in 16 or 8 bits
(sync/mean.py; every rank holds that previous average bit for bit), so rounding touches the small update, not the
weights. The local steps after the warm-up use their gradients as they are.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as plsgd
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector

from cohort.api.models import OuterOptimizer, TrainingJobSpec

from ..compression.registry import build_method
from ..log import get_logger
from .allreduce import timed_hook
from .base import Sync, SyncContext, ring_allreduce_bytes
from .flat import slice_views, write_flat
from .mean import FP32_MEAN, InFlight, Mean, average

log = get_logger(__name__)


def carried_state(spec: TrainingJobSpec, model: nn.Module) -> dict[str, torch.Tensor]:
    """The outer step's state, which the trainer keeps across worlds; empty for a job without one.

    ``params``: θ, the last round's parameters; ``momentum``: the outer momentum (when it is not 0); ``round``:
    the step of the last round, -1 before the first. Same size, dtype and device as the model's parameters,
    so a checkpoint has the same keys whether it was written before the first round or after."""
    outer = spec.sync.outer_optimizer
    if spec.sync.algorithm != "localsgd" or outer.name == "none":
        return {}
    params = parameters_to_vector(model.parameters()).detach()
    state = {"round": torch.tensor(-1, dtype=torch.int64), "params": torch.zeros_like(params)}
    if outer.momentum > 0:
        state["momentum"] = torch.zeros_like(params)
    return state


class OuterStep:
    """The outer optimizer: torch's SGD on the rounds' parameters θ, whose gradient is how far the average moved.

    Its state is ``carried`` (:func:`carried_state`), tensors it updates in place: a new world's OuterStep
    built on them continues where the last one stopped. A round of one fragment (``part``, a slice of the flat
    parameter vector) steps that slice of θ and of the momentum only: one SGD per slice, on views of them."""

    def __init__(self, config: OuterOptimizer, carried: dict[str, torch.Tensor]):
        self.config, self.carried = config, carried
        self._optimizers: dict[tuple[int, int], torch.optim.SGD] = {}

    @property
    def params(self) -> torch.Tensor | None:
        """θ, the last round's parameters, identical on every rank; None before the first round."""
        return self.carried["params"] if int(self.carried["round"]) >= 0 else None

    def restart(self) -> None:
        """Forget θ and the momentum: the next round is a plain average."""
        self.carried["round"].fill_(-1)
        if "momentum" in self.carried:
            self.carried["momentum"].zero_()

    def _optimizer(self, part: tuple[int, int]) -> torch.optim.SGD:
        if part not in self._optimizers:
            c, theta = self.config, self.carried["params"][part[0]:part[1]]
            opt = torch.optim.SGD([theta], lr=c.lr, momentum=c.momentum,
                                  nesterov=c.name == "nesterov" and c.momentum > 0)
            if "momentum" in self.carried:  # SGD updates its buffer in place; zeros are exactly its first step's clone
                opt.state[theta]["momentum_buffer"] = self.carried["momentum"][part[0]:part[1]]
            self._optimizers[part] = opt
        return self._optimizers[part]

    def __call__(self, average: torch.Tensor, step: int, part: tuple[int, int]) -> torch.Tensor:
        """θ's slice ``part`` after the round that ended at ``step`` (updated in place), from the round's average of
        that slice. Before the first round ``part`` must be the whole vector: θ is then the average."""
        if self.params is None:
            assert part == (0, self.carried["params"].numel()), "a world's first round averages every fragment"
            self.carried["params"].copy_(average)
        else:
            opt = self._optimizer(part)
            theta = opt.param_groups[0]["params"][0]
            theta.grad = theta - average
            opt.step()
            theta.grad = None
        self.carried["round"].fill_(step)
        return self.carried["params"][part[0]:part[1]]


def fragment_bounds(numel: int, fragments: int) -> list[tuple[int, int]]:
    """``fragments`` contiguous slices of a flat vector of ``numel`` entries, equal to within one entry."""
    cuts = [f * numel // fragments for f in range(fragments + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


@dataclass
class _Round:
    """A round sent and not yet applied: its step, its slice of the flat vector, its mean in flight (``delta``:
    of the change since the reference, lossily), and the step at which the parameters take it."""

    step: int
    bounds: tuple[int, int]
    flight: InFlight
    delta: bool
    due: int


class CastPeriodicAverager(PeriodicModelAverager):
    """torch's PeriodicModelAverager, with the averaged quantity optionally sent lossily (``mean``), an outer step, the
    commit gate's check before the parameters take a round's result, fragments (Streaming DiLoCo's schedule:
    fragment f's round at the step f x period / F into each period), and its overlap: a round's allreduce
    sent at its step and applied ``overlap`` steps later, mixed with the local slice by ``mixing``."""

    def __init__(self, period: int, warmup_steps: int, group: dist.ProcessGroup | None, ctx: SyncContext,
                 mean: Mean, outer: OuterStep | None = None, fragments: int = 1,
                 overlap: int = 0, mixing: float = 0.0):
        super().__init__(period=period, warmup_steps=warmup_steps, process_group=group)
        self.ctx, self.mean, self.outer = ctx, mean, outer
        self.last: torch.Tensor | None = None  # without an outer step: the last round's average
        self.offsets = {f * period // fragments: f for f in range(fragments)}  # step into the period -> fragment
        self.fragments, self.overlap, self.mixing = fragments, overlap, mixing
        self.pending: _Round | None = None  # sent, not yet applied (dropped with this world)

    @property
    def reference(self) -> torch.Tensor | None:
        """The last round's parameters, identical on every rank (lossy rounds send the change since them)."""
        return self.outer.params if self.outer is not None else self.last

    def average_parameters(self, params: Any) -> None:
        params = list(params)
        since = self.step - self.warmup_steps
        fragment = self.offsets.get(since % self.period) if since >= 0 else None
        if fragment is not None:
            assert self.pending is None, "admission keeps overlap below period / fragments"
            n = sum(p.numel() for p in params)
            needs_reference = self.outer is not None or self.mean.lossy
            # Without an agreed reference (a world's first round with one in use) every fragment is averaged.
            whole = needs_reference and self.reference is None
            self.pending = self._send(params, (0, n) if whole else fragment_bounds(n, self.fragments)[fragment])
        if self.pending is not None and self.pending.due == self.step:
            self._apply_pending(params)
        elif self.pending is not None and self.pending.step < self.step:  # sent earlier: its next phase may start
            self.pending.flight.advance()
        self.step += 1

    def finish(self, params: Any, step: int) -> None:
        """Training ended after ``step`` on every rank: the replicas become one model. A round in flight is applied
        now; then, past the warm-up (whose allreduced gradients kept the replicas identical), every fragment with
        local steps since its last round takes one more round at once, unmixed: the round the schedule would have
        taken next, with its outer step. A fragment whose round was just applied unmixed is left as it is (with an
        outer step, another round would step θ by the momentum alone)."""
        params = list(params)
        self.step = step
        in_flight = self.pending is not None
        if in_flight:
            self._apply_pending(params)
        moved = self._moved(params) if step > self.warmup_steps else []
        for bounds in moved:
            self._apply(params, self._send(params, bounds), 0.0)
        log.info("replicas made one at the end of training",
                 extra={"step": step, "in_flight_applied": in_flight, "rounds": len(moved)})

    def _apply_pending(self, params: list[torch.Tensor]) -> None:
        round_, self.pending = self.pending, None
        assert round_ is not None
        self._apply(params, round_, self.mixing)

    def _moved(self, params: list[torch.Tensor]) -> list[tuple[int, int]]:
        """The slices some rank trained since their last round: the fragments whose parameters differ from θ on
        any rank (a small allreduce); without θ, the whole vector."""
        n = sum(p.numel() for p in params)
        theta = self.outer.params if self.outer is not None else None
        if theta is None:
            return [(0, n)]
        cuts = fragment_bounds(n, self.fragments)
        moved = torch.tensor([not torch.equal(torch.cat(slice_views(params, a, b)), theta[a:b]) for a, b in cuts],
                             dtype=torch.int64, device=theta.device)
        dist.all_reduce(moved, op=dist.ReduceOp.MAX, group=self.process_group)
        return [cut for cut, m in zip(cuts, moved.tolist(), strict=True) if m]

    def _send(self, params: list[torch.Tensor], bounds: tuple[int, int]) -> _Round:
        """Start this step's round: the mean of the slice ``bounds`` of the parameters, left running. Lossy rounds
        send the change since the reference; without an agreed reference yet the mean is fp32's."""
        (a, b), reference = bounds, self.reference
        x = torch.cat(slice_views(params, a, b))  # a copy: the parameters train on while it travels
        delta = reference is not None and self.mean.lossy
        if reference is not None and delta:
            x = x - reference[a:b]
        flight = (self.mean if delta else FP32_MEAN).start(x, self.process_group, self.ctx.world_size)
        self.ctx.stats.record(flight.wire_bytes, flight.payload_bytes, 4 * (b - a))
        return _Round(self.step, (a, b), flight, delta, self.step + self.overlap)

    def _apply(self, params: list[torch.Tensor], round_: _Round, mixing: float) -> None:
        """The parameters take a finished round, once the commit gate's check passes: a failed round changes
        nothing, neither the parameters nor θ (on NCCL its result may be half written). ``mixing`` of the
        local slice stays in it."""
        mean = round_.flight.wait()
        a, b = round_.bounds
        reference = self.reference  # unchanged since the round was sent: one round in flight at a time
        average = reference[a:b] + mean if round_.delta and reference is not None else mean
        self.ctx.check_gate()
        if self.outer is not None:
            result = self.outer(average, round_.step, (a, b))  # θ's slice, apart from the parameters
        else:
            result = average
            if self.mean.lossy:
                if self.last is None:  # the first round averaged the whole vector
                    self.last = average.clone()
                else:
                    self.last[a:b] = average
        views = slice_views(params, a, b)
        if mixing:
            result = torch.lerp(result, torch.cat(views), mixing)
        write_flat(views, result)


class LocalSGDSync(Sync):
    def __init__(self, ctx: SyncContext):
        super().__init__(ctx)
        self.warmup_steps = ctx.spec.sync.warmup_steps
        self.method = build_method(ctx.spec.compression)
        self.mean = self.method.localsgd_mean()  # admission refuses the methods without one
        self.hook_state: plsgd.PostLocalSGDState | None = None
        self.averager: CastPeriodicAverager | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.ctx.world_size == 1:
            return model
        # One subgroup per rank; every rank must take part in creating all of them.
        subgroup, _ = dist.new_subgroups(group_size=1, group=self.ctx.group)
        self.hook_state = plsgd.PostLocalSGDState(process_group=self.ctx.group, subgroup=subgroup,
                                                  start_localSGD_iter=self.warmup_steps)
        with warnings.catch_warnings():
            # Buffers stay local between averaging rounds (a per-forward broadcast is a global
            # collective every step). torch 2.13 deprecates the argument but says to keep using it
            # for exactly this until its replacement exists.
            warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
            ddp = DDP(model, process_group=self.ctx.group, broadcast_buffers=False)
        ddp.register_comm_hook(self.hook_state, timed_hook(self._hook(), self.ctx.stats))
        self.averager = CastPeriodicAverager(max(1, int(self.ctx.spec.sync.period)), self.warmup_steps,
                                             self.ctx.group, self.ctx, self.mean, self._outer_step(model),
                                             self.ctx.spec.sync.fragments, self.ctx.spec.sync.overlap_steps,
                                             self.ctx.spec.sync.mixing)
        return ddp

    def _outer_step(self, model: nn.Module) -> OuterStep | None:
        """The outer step on the trainer's carried state (else state of its own), checked to agree across ranks."""
        carried = self.ctx.carried or carried_state(self.ctx.spec, model)
        if not carried:
            return None
        outer = OuterStep(self.ctx.spec.sync.outer_optimizer, carried)
        mine = int(carried["round"])
        seen = torch.tensor([mine, -mine], device=carried["params"].device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=self.ctx.group)  # [max, -min] of the members' rounds
        if int(seen[0]) != -int(seen[1]):
            log.warning("the members hold different outer rounds: the next round is a plain average",
                        extra={"round": mine, "newest": int(seen[0]), "oldest": -int(seen[1])})
            outer.restart()
        elif mine >= 0:
            log.info("outer step continues", extra={"round": mine})
        return outer

    def _hook(self) -> Any:
        """Within the warm-up, the method's exchange under ``allreduce`` (none: torch's hook allreduces in fp32);
        afterwards torch's hook, whose allreduce is over a group of one: the local gradients as they are."""
        ctx, warmup = self.ctx, self.method.ddp_hook(self.ctx)

        def run(state: plsgd.PostLocalSGDState, bucket: dist.GradBucket) -> Any:
            if state.iter < state.start_localSGD_iter:
                if warmup is not None:
                    return warmup[1](warmup[0], bucket)
                n = bucket.buffer().numel()
                ctx.stats.record(ring_allreduce_bytes(4 * n, ctx.world_size), 4 * n, 4 * n)
            return plsgd.post_localSGD_hook(state, bucket)
        return run

    def consensus(self, model: nn.Module, step: int) -> torch.Tensor | None:
        """The replicas' average, sent as the rounds are (lossily: the change since θ); None within the warm-up
        (the allreduced gradients keep the replicas identical) and after ``finish``. A round in flight is left to
        its schedule: the average is of the parameters."""
        if self.averager is None or self.agreed or step <= self.warmup_steps:
            return None
        mine = parameters_to_vector(model.parameters()).detach()
        return average(self.ctx, mine, self.averager.reference, self.mean)

    def finish(self, model: nn.Module, step: int) -> None:
        if self.averager is not None:
            self.averager.finish(model.parameters(), step)
            self.agreed = True

    def after_step(self, model: nn.Module, step: int) -> None:
        if self.averager is None or self.hook_state is None:
            return
        # Count in the trainer's steps, which survive world changes (a new Sync starts from 0).
        self.hook_state.iter = step
        self.averager.step = step
        self.averager.average_parameters(model.parameters())
