"""The GPU proof's reading of a recovery (hack/gpu_proof.py, bench/torchrun_elastic.py), checked on the CPU.

The proof runs only where a GPU is lent, for a few minutes: a log message renamed in the trainer, or a
timeline read wrong, would cost that run its figures. So: every message the proof reads is one the trainer
logs, and the spans come out of a known timeline as worked out by hand.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from bench.torchrun_elastic import restart_phases

REPO = Path(__file__).resolve().parents[2]


def _proof():
    spec = importlib.util.spec_from_file_location("gpu_proof", REPO / "hack/gpu_proof.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_message_the_proof_reads_is_one_the_trainer_logs():
    source = "\n".join(p.read_text() for p in (REPO / "trainer/src").rglob("*.py"))
    logged = set(re.findall(r'log\.(?:info|warning|error)\(\s*"([^"]+)"', source))
    proof = (REPO / "hack/gpu_proof.py").read_text()
    read = set(_proof().MILESTONES) | set(re.findall(r'rec\.get\("msg"\) == "([^"]+)"', proof))
    assert len(read) >= 8, read
    assert read <= logged, f"the proof reads messages the trainer never logs: {sorted(read - logged)}"


def _rec(msg: str, t: float, **kv: object) -> dict[str, object]:
    return {"msg": msg, "t": 1000.0 + t, **kv}


def test_the_recovery_timeline_splits_into_detection_abort_re_form_state_and_first_step():
    proof = _proof()
    logs = {  # the kill at t = 0; worker-1 died, worker-0 survived, worker-3 was the spare
        "w-0": [_rec("first step in world", -5.0, world_version=1),
                _rec("collective failed; waiting for the next world", 0.30, world_version=1),
                _rec("process group torn down", 0.32, world_version=1, seconds=0.02),
                _rec("process group formed", 0.50, world_version=2),
                _rec("joined world", 0.60, world_version=2, size=2, source="peer", step=137),
                _rec("first step in world", 0.70, world_version=2)],
        "w-3": [_rec("process group formed", 0.52, world_version=2),
                _rec("joined world", 0.65, world_version=2, size=2, source="peer", step=137),
                _rec("first step in world", 0.90, world_version=2)],
    }
    worlds = [{"version": 1, "size": 2, "t": 1000.0 - 9}, {"version": 2, "size": 2, "t": 1000.0 + 0.40}]
    out = proof.rank_timeline(logs, 1000.0, {2: 2}, 2, worlds)
    assert out["slowest"] == "w-3" and out["world_published"] == pytest.approx(0.40)
    assert out["ranks"]["w-0"]["first_step"] == pytest.approx(0.70)  # the step before the kill is not one
    assert out["spans"] == pytest.approx({"detection": 0.30, "abort": 0.02, "re-form": 0.12, "state": 0.13,
                                          "first_step": 0.25})


def test_torchrun_restart_phases_are_read_to_the_slowest_rank():
    events = [{"event": "kill", "t": 10.0, "step": 137}]
    for rank, lag in ((0, 0.0), (1, 0.5)):
        events += [{"event": "start", "t": 11.0 + lag, "rank": rank, "incarnation": 1},
                   {"event": "imported", "t": 14.0 + lag, "rank": rank, "incarnation": 1},
                   {"event": "rendezvous", "t": 14.5 + lag, "rank": rank, "incarnation": 1},
                   {"event": "loaded", "t": 15.0 + lag, "rank": rank, "incarnation": 1, "step": 100},
                   {"event": "first_step", "t": 15.2 + lag, "rank": rank, "incarnation": 1, "step": 101}]
    phases = restart_phases(events, 2)
    assert phases == pytest.approx({"detect": 1.0, "start+imports": 3.5, "rendezvous": 0.5, "data, model, state": 0.5,
                                    "first step": 0.2, "total": 5.7, "lost": 37})
    with pytest.raises(ValueError, match="1 of 2 restarted ranks"):
        restart_phases([e for e in events if not (e["event"] == "first_step" and e["rank"] == 1)], 2)


def test_a_smoke_on_a_cpu_slow_at_bf16_gives_its_later_phases_more_time():
    """12,000 tokens/s or more (or no figure): the caps as they are; 5,000 (the AMD EPYC whose smoke ran out of its
    caps): 2.4x; slower still: at most 2.5x."""
    stretch = _proof().smoke_stretch
    assert stretch(27_000.0) == stretch(12_000.0) == stretch(None) == stretch(0.0) == 1.0
    assert stretch(5_000.0) == pytest.approx(2.4)
    assert stretch(1_000.0) == 2.5
