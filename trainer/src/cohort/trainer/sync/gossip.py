"""``sync.algorithm: gossip``: decentralised parallel SGD (Lian et al. 2017, D-PSGD).

No DDP and no global collective while training: each rank steps on its own
gradient, then every ``sync.period`` steps moves its parameters towards its
neighbours' (sync/topology.py) by one gossip round. Evaluations and checkpoints
measure and hold the consensus, the average of all replicas (``consensus``),
which every replica takes at the end (``finish``).

Every exchange follows CHOCO-Gossip (Koloskova et al. 2019; the machinery is in
gossip_exchange.py): peers keep public copies of each other, messages carry the
compressed difference between a rank's parameters and its public copy, and the
consensus step is x += gamma * w * (theirs - mine). Uncompressed (fp32), this is
exactly plain gossip averaging with gamma = 1; fp16/bf16 cast the difference
(never the parameters, so rounding errors do not pile up); the sparsifiers and
quantisers (topk, randomk, qsgd, terngrad, signsgd) need gamma < 1 and the
contractive scaling of the unbiased ones. Error feedback is not used: the
difference x - mine already carries what earlier messages left out.

A round waits for its neighbours' messages (rounds stay in step, as in
synchronous gossip) except from a straggler: a neighbour whose reported compute
time per step exceeds ``straggler_threshold`` times this rank's. Exchanges with
a straggler happen at its pace, and its neighbours keep theirs. The Sync is rebuilt at every world change: links start
afresh (one dense exchange), at any world size; at size 1 it does nothing.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from cohort.api import ValidationError
from cohort.api.models import SUPPORTED_COMPRESSION

from ..compression.base import Compressor, derive_seed
from ..compression.registry import build_method
from ..log import get_logger
from . import topology
from .base import Sync, SyncContext
from .flat import write_flat
from .gossip_exchange import Link, PeerExchange
from .mean import average

log = get_logger(__name__)


@dataclass(frozen=True)
class GossipConfig:
    consensus_step: float = 1.0
    """gamma in x += gamma * w * (theirs - mine): the compression method's consensus_step()."""
    straggler_threshold: float = 2.0
    """A neighbour computing this many times slower than this rank (plus straggler_margin_s) is not waited for."""
    straggler_margin_s: float = 0.002
    """Slack on top of the ratio: millisecond steps on shared cores jitter by more than 2x."""
    patience: float = 20.0
    """Most a round waits for one message, in units of this rank's typical compute time per step."""
    min_patience_s: float = 1.0
    """...and at least this long: on shared cores a healthy peer can be descheduled for a while."""
    first_round_patience_s: float = 30.0
    """The first round waits this long (links are being set up; no step time is known yet)."""


class GossipSync(Sync):
    def __init__(self, ctx: SyncContext, config: GossipConfig | None = None):
        super().__init__(ctx)
        spec = ctx.spec
        self.topology, self.period = spec.sync.topology, max(1, int(spec.sync.period))
        codec = build_method(spec.compression, contractive=True)
        if not isinstance(codec, Compressor):
            raise ValidationError(f"spec.compression.method: {codec.name} is not supported with "
                                  f"spec.sync.algorithm gossip (supported: {', '.join(SUPPORTED_COMPRESSION['gossip'])})")
        self.codec = codec
        self.config = config or GossipConfig(consensus_step=codec.consensus_step())
        self.seed = derive_seed(spec.workload.seed, 0x605)
        self.weight = topology.edge_weight(self.topology, ctx.world_size)
        self.exchange: PeerExchange | None = None
        self.rounds = 0
        self._left_at: float | None = None      # when after_step last returned
        self._computes: deque[float] = deque(maxlen=9)  # recent compute seconds per step
        self._compute_s: float | None = None            # their median

    def wrap(self, model: nn.Module) -> nn.Module:
        return model  # each rank trains on its own gradients; no DDP

    # --- training ----------------------------------------------------------------
    def after_step(self, model: nn.Module, step: int) -> None:
        entered = time.perf_counter()
        if self._left_at is not None:  # time outside the Sync: this rank's compute
            self._computes.append(entered - self._left_at)
            # The median, not a mean: a rank descheduled once on a shared core is not a straggler.
            self._compute_s = statistics.median(self._computes)
        if self.ctx.world_size > 1 and step % self.period == 0:
            x = parameters_to_vector(model.parameters()).detach()
            self._round(self._exchange([p.numel() for p in model.parameters()], x.device), x, step)
            self.ctx.check_gate()  # refused (a failed exchange, perhaps half written): the parameters stay
            write_flat(list(model.parameters()), x)
            self.rounds += 1
        self._left_at = time.perf_counter()

    def _exchange(self, sizes: list[int], device: torch.device) -> PeerExchange:
        if self.exchange is None:
            peers = topology.peers(self.topology, self.ctx.rank, self.ctx.world_size)
            self.exchange = PeerExchange(self.ctx.rank, peers, sum(sizes), self.codec.layout(sizes), self.ctx.stats,
                                         self.seed, self.ctx.group, device)
        return self.exchange

    def _round(self, ex: PeerExchange, x: torch.Tensor, step: int) -> None:
        now = [ex.links[p] for p in topology.neighbours(self.topology, self.ctx.rank, self.ctx.world_size,
                                                        self.rounds, self.seed)]
        for link in ex.links.values():
            if link in now or link.awaiting:
                ex.post(link)
        # A rank starts at most one exchange per link per round, and none on a link where it
        # answered one this round: a rank that is behind would otherwise start a second exchange
        # each round, and its neighbours, waiting once per round, would run at twice its pace.
        # Answers are never held back: a peer waiting for one may be what we are waiting for.
        sent: set[int] = set()
        self._take_arrivals(ex, x, step, sent)  # first: what arrived restores credit to send
        for link in now:
            if link.peer not in sent and ex.may_send(link):
                self._send(ex, link, x, step, sent)
        deadline = time.perf_counter() + self._patience_s()
        while True:
            expected = [lk for lk in now if lk.awaiting and self._keeping_up(lk, step)]
            if not expected or time.perf_counter() >= deadline:
                break
            for link in expected:
                ex.post(link)  # the receive posted at the start may have taken an earlier message
            ex.wait_any(expected, deadline)
            self._take_arrivals(ex, x, step, sent)
        for link in now:
            if link.awaiting and self._keeping_up(link, step):
                link.waited_for = link.sent  # gave up on this one: do not wait for it again
                log.warning("gossip: gave up waiting for a neighbour", extra={
                    "peer": link.peer, "step": step, "patience_s": round(self._patience_s(), 3),
                    "sent": link.sent, "received": link.received, "peer_step": link.peer_step,
                    "peer_compute_s": round(link.peer_compute_s, 5), "compute_s": round(self._compute_s or 0.0, 5)})

    def _send(self, ex: PeerExchange, link: Link, x: torch.Tensor, step: int, sent: set[int]) -> None:
        sent.add(link.peer)
        if ex.send(link, x, step, self._compute_s or 0.0):
            self._consensus(x, link)

    def _take_arrivals(self, ex: PeerExchange, x: torch.Tensor, step: int, sent: set[int]) -> None:
        for link in ex.links.values():
            while ex.arrived(link):
                if ex.receive(link):
                    self._consensus(x, link)
                if link.sent < link.received:  # answer: completes the exchange the peer started
                    self._send(ex, link, x, step, sent)
                if link.awaiting:  # otherwise the next round posts it: a receive left open at an
                    ex.post(link)      # evaluation costs a dummy message to cancel

    def _keeping_up(self, link: Link, step: int) -> bool:
        """Worth waiting for: a neighbour at or behind this step that is not a straggler.

        A neighbour already past this step owes us nothing yet (its next
        message comes from its next round) or is busy elsewhere (e.g. waiting
        at an evaluation for us to arrive): waiting would only stall.
        """
        if link.received == 0:
            return True  # a world's first round: set every link up
        if link.waited_for == link.sent or link.peer_step >= step:
            return False
        c = self.config
        return link.peer_compute_s <= c.straggler_threshold * (self._compute_s or 0.0) + c.straggler_margin_s

    def _consensus(self, x: torch.Tensor, link: Link) -> None:
        assert link.mine is not None and link.theirs is not None
        x.add_(link.theirs - link.mine, alpha=self.config.consensus_step * self.weight)

    def _patience_s(self) -> float:
        if self._compute_s is None:
            return self.config.first_round_patience_s
        return max(self.config.min_patience_s, self.config.patience * self._compute_s)

    # --- evaluation ----------------------------------------------------------------
    def settle(self, model: nn.Module) -> None:
        """Collective: finish every exchange in flight (all ranks call it at the same point)."""
        if self.exchange is None or self.ctx.world_size <= 1:
            return
        x = parameters_to_vector(model.parameters()).detach()
        for link in self.exchange.drain(self.ctx.world_size):
            self._consensus(x, link)
        write_flat(list(model.parameters()), x)
        self._left_at = None  # evaluation time is not compute time

    def consensus(self, model: nn.Module, step: int) -> torch.Tensor | None:
        """The replicas' average, once every exchange in flight has settled."""
        if self.ctx.world_size <= 1 or self.agreed:
            return None
        self.settle(model)
        return average(self.ctx, parameters_to_vector(model.parameters()).detach())

    def finish(self, model: nn.Module, step: int) -> None:
        """Every replica takes the average, so the job ends with the model its evaluations measured."""
        avg = self.consensus(model, step)
        if avg is not None:
            write_flat(list(model.parameters()), avg)
            self.agreed = True
