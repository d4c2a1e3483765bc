"""The commit gate (commit.py): a step whose collective failed after writing part of its result is not applied.

NCCL reports such a failure asynchronously, after ``backward()`` returned and
with the gradients half written; gloo raises instead, so on the CPU the
failure is injected (faults.py, ``COHORT_FAULT_PARTIAL``): the gradients of
one rank are corrupted as a half-written allreduce would leave them, and the
failure is reported to the gate. Two gloo ranks train 2 steps, then the faulty
third: with the gate, every rank's parameters and optimizer state are the
second step's bit for bit and the step raises StepDiscarded; without it, the
faulty rank applies the corrupted gradients.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from gloo_ranks import data_plan, job_spec, run_ranks

from cohort.trainer.commit import CommitGate, StepDiscarded
from cohort.trainer.faults import Fault, Faults
from cohort.trainer.step import MicroBatching

pytestmark = [pytest.mark.dist]

FAULTY_RANK, FAULTY_STEP = 1, 2  # the third step (0-based)


def _train(rank: int, world: int, gated: bool) -> dict[str, Any]:
    gate = CommitGate(torch.device("cpu")) if gated else None
    w, plan, _, optimizer, runner = data_plan(job_spec(), rank, world, gate)
    faults = Faults(partial=Fault(FAULTY_RANK, FAULTY_STEP))
    reports: list[str] = []
    snapshot: dict[str, torch.Tensor] = {}
    discarded = None
    for step in range(3):
        if step == FAULTY_STEP:
            snapshot = {k: v.clone() for k, v in w.model.state_dict().items()}
            snapshot.update({f"opt.{i}": s["momentum_buffer"].clone()
                             for i, s in enumerate(optimizer.state.values())})
        idx = torch.arange((step * world + rank) * 16, (step * world + rank + 1) * 16)

        def report(why: str) -> None:
            reports.append(why)
            if gate is not None:
                gate.fail(why)
        try:
            runner.run(plan, optimizer, lambda idx=idx: w.data.train.fetch(idx), w.loss_fn, MicroBatching(1, world),
                       lambda: None, step + 1,
                       after_backward=lambda step=step: faults.after_backward(rank, step, w.model.parameters(), report))
        except StepDiscarded as e:
            discarded = str(e)
    after = {k: v.clone() for k, v in w.model.state_dict().items()}
    after.update({f"opt.{i}": s["momentum_buffer"].clone() for i, s in enumerate(optimizer.state.values())})
    return {"unchanged": all(torch.equal(snapshot[k], after[k]) for k in snapshot), "discarded": discarded,
            "reports": reports}


def test_a_step_whose_collective_failed_part_way_is_not_applied():
    ranks = run_ranks(_train, 2, True)
    faulty = ranks[FAULTY_RANK]
    assert faulty["reports"] and faulty["discarded"] and "failed part-way" in faulty["discarded"]
    assert faulty["unchanged"], "the faulty rank's parameters or optimizer state moved past the last committed step"


def test_without_the_gate_the_half_written_gradients_reach_the_parameters():
    """The control: the same fault, no gate. This is what the gate prevents (on NCCL, silently)."""
    ranks = run_ranks(_train, 2, False)
    faulty = ranks[FAULTY_RANK]
    assert faulty["reports"] and faulty["discarded"] is None
    assert not faulty["unchanged"]


def test_the_gate_needs_a_reported_failure_and_forgets_it_at_the_next_step():
    gate = CommitGate(torch.device("cpu"))
    gate.begin()
    gate.check()  # nothing reported, no backend error: the step counts
    gate.fail("the allreduce failed")
    with pytest.raises(StepDiscarded, match="the allreduce failed"):
        gate.check()
    gate.begin()
    gate.check()  # a new step starts clean


def test_a_step_whose_exchange_after_the_update_failed_still_counts():
    """Local SGD's round and gossip's mixing run after the optimizer step (``plan.after_step``). When that
    exchange fails (here: fault-injected, as a dead peer's round fails on gloo), the update is already in the
    model, so StepRunner has run ``applied`` first: the trainer counts the step there (step counter and data
    position), and the state is never one update ahead of its step. Counted after the exchange, as before,
    a failed round left the step to run again in the next world, its batch applied twice."""
    w, plan, _, optimizer, runner = data_plan(job_spec(sync="localsgd", period=2), gate=CommitGate(torch.device("cpu")))
    events: list[str] = []

    def round_fails(step: int) -> None:
        events.append(f"round {step}")
        raise RuntimeError("the round's allreduce failed: Connection closed by peer")

    plan.after_step = round_fails  # type: ignore[method-assign]
    before = {k: v.clone() for k, v in w.model.state_dict().items()}
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        runner.run(plan, optimizer, lambda: w.data.train.fetch(torch.arange(16)), w.loss_fn, MicroBatching(1, 1),
                   lambda: None, 1, applied=lambda: events.append("counted"))
    assert events == ["counted", "round 1"], events
    assert any(not torch.equal(before[k], v) for k, v in w.model.state_dict().items())  # the update is in
