"""How long one collective may wait for its peers: ``faultTolerance.collectiveTimeoutSeconds``.

A peer that dies without closing its connections (a lost node, or any peer under NCCL, whose kernels spin
instead of raising) leaves the other ranks waiting inside a collective until the process group's timeout,
a minute here and ten by torch's NCCL default. A short timeout bounds that wait, but a collective also
waits while a peer does work the others do not: rank 0 saving a replicated plan's checkpoint alone (and
staging it during the next step), an evaluation, the first steps of a world (compilation, warm-up). So the
short timeout holds only on *calm* steps, the ones that follow ``CALM_AFTER`` plain steps in this world;
every other step keeps the group's timeout. Every rank decides alike, from what every rank knows: the step
count, the evaluation schedule, and a checkpoint decision the ranks agree on (``Trainer._maybe_checkpoint``).

A step that took over ``NEAR`` of the timeout it had is a warning, once per process and timeout: one a
little slower would fail, so the job should raise the field that set it (:meth:`CollectiveTimeout.near_limit`).

Automatic (0): ``AUTO_MARGIN_S`` plus ``AUTO_FACTOR`` times the median step time, once the step clock has
one (until then, the group's timeout), times the steps between collectives where ranks sync only every
``sync.period`` steps (gossip, local SGD), because their skew grows over that many steps.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO_MARGIN_S = 10.0
AUTO_FACTOR = 3.0
CALM_AFTER = 2  # plain steps after any other work: a save's staging copy can hold rank 0 in the next step
NEAR = 0.5      # of its timeout, a step's time that is worth a warning


@dataclass
class CollectiveTimeout:
    configured_s: float   # the job's collectiveTimeoutSeconds; 0: automatic
    group_s: float        # the process group's own timeout (processGroupTimeoutSeconds)
    steps_per_sync: int = 1
    plain_steps: int = 0  # plain steps in a row, in this world

    @property
    def long_s(self) -> float:
        return max(self.group_s, self.configured_s)

    def new_world(self) -> None:
        self.plain_steps = 0

    def after(self, plain: bool) -> None:
        """A loop iteration ended: ``plain`` if it was a training step and nothing else (no evaluation,
        no checkpoint decision, no end of epoch)."""
        self.plain_steps = self.plain_steps + 1 if plain else 0

    def near_limit(self, step_s: float, timeout_s: float) -> str | None:
        """The field to raise when a step that had ``timeout_s`` took over ``NEAR`` of it, else None."""
        if timeout_s <= 0 or step_s <= NEAR * timeout_s:
            return None
        if timeout_s >= self.long_s and self.configured_s < self.group_s:
            return "faultTolerance.processGroupTimeoutSeconds"
        return "faultTolerance.collectiveTimeoutSeconds"

    def for_next_step(self, median_step_s: float | None) -> float:
        if self.plain_steps < CALM_AFTER:
            return self.long_s
        if self.configured_s > 0:
            return self.configured_s
        if median_step_s is None:
            return self.long_s
        return min(self.long_s, AUTO_MARGIN_S + AUTO_FACTOR * median_step_s * self.steps_per_sync)
