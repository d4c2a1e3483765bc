"""The commit gate: one place, between backward and the optimizer, that decides whether a step counts.

On gloo a collective whose peer died raises inside backward, so a failed step
never reached the optimizer. NCCL does not work so: its collectives are
queued on the GPU, ``backward()`` returns once they are enqueued, and a
failure surfaces later, as the communicator's error state (or a watchdog
timeout), possibly after part of a result was written into the gradients.
Applying such gradients would silently corrupt the model on some ranks.

So, as torchft's ``Manager.should_commit`` does, the trainer asks the gate
before ``optimizer.step()``. The gate waits for the step's device work,
collectives included, then refuses the step if any of these holds:

- a failure was reported to it during the step (``fail``: fault injection,
  or code that learns of an asynchronous failure);
- a backend of the default group reports an error (``Backend.get_error``:
  NCCL's timeouts and communicator errors; gloo raises instead and has none);
A newer world published while the step ran is **not** a reason: if the step's
collectives completed, every member of this world contributed and the update
is the same on every rank. Refusing it would split the ranks (one sees the new
world before its gate, another after) and lose the step on the ranks that
refused it; a preempted job's rank 0 would then checkpoint one step behind
a peer (tests/e2e/test_kueue.py caught exactly that). The trainer checks the
world between steps instead.

An exchange after the optimizer step asks the gate again before applying its
result (``SyncContext.check_gate``): refused, local SGD's round leaves the
parameters and the outer state as they were, gossip's mixing the parameters,
and the step still counts (its update was applied).

A refused step raises :class:`StepDiscarded` with the gradients dropped and
the parameters, optimizer state and step counter untouched: the state is the
last committed step's, bit for bit, and the next world agrees on the highest
committed step among its members (trainer.py ``_agree_on_state``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .runtime.device import synchronize


class StepDiscarded(RuntimeError):
    """The step's update was not applied: its collectives failed."""


def group_errors(device: torch.device) -> list[str]:
    """Errors the default group's backends report (those that can: NCCL)."""
    if not dist.is_initialized():
        return []
    group = dist.distributed_c10d._get_default_group()
    errors = []
    for kind in {"cpu", device.type}:
        try:
            state = group._get_backend(torch.device(kind)).get_error()
        except (AttributeError, RuntimeError):  # no backend for that type, or one without an error state
            continue
        if state != dist.ErrorType.SUCCESS:  # type: ignore[attr-defined]
            errors.append(f"the {kind} backend reports {state}")
    return errors


class CommitGate:
    def __init__(self, device: torch.device):
        self.device = device
        self._failures: list[str] = []

    def begin(self) -> None:
        """A new step: forget the previous step's reports."""
        self._failures = []

    def fail(self, why: str) -> None:
        """Report a failure of this step's communication (from any thread)."""
        self._failures.append(why)

    def check(self) -> None:
        """Raise StepDiscarded unless this step may be applied (waits for the step's device work)."""
        synchronize(self.device)
        reasons = list(self._failures) + group_errors(self.device)
        if reasons:
            raise StepDiscarded("step discarded: " + "; ".join(reasons))
