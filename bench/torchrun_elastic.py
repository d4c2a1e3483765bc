"""The torchrun elastic baseline: its command line and what its workers' events say of a restart.

bench/recovery.py, bench/goodput.py and the GPU proof (hack/gpu_proof.py) run the same plain DDP loop
(bench/torchrun_worker.py) under ``torch.distributed.run`` with a c10d rendezvous on loopback. Standard
library only: the GPU machine has no more than torch and the project's pure-Python wheels.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parent / "torchrun_worker.py"


def command(workers: int, port: int, max_restarts: int, *worker_args: str) -> list[str]:
    """torchrun with ``workers`` local ranks, restarting them all up to ``max_restarts`` times.
    ``--monitor-interval 0.1``: the agent polls its workers every 0.1 s (torch 2.13's default, set here so
    that the comparison does not depend on the torch a machine has)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(workers),
            "--max-restarts", str(max_restarts), "--monitor-interval", "0.1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", str(WORKER), *worker_args]


def events(ckpt_dir: Path) -> list[dict[str, Any]]:
    """Every rank's timestamped events (torchrun_worker.py writes events-RANK-INCARNATION.jsonl)."""
    return [json.loads(line) for f in sorted(ckpt_dir.glob("events-*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def restart_phases(evts: list[dict[str, Any]], workers: int) -> dict[str, float]:
    """One kill and torchrun's restart of every worker, in seconds to the slowest rank: detect (the kill
    to the first restarted process), process start and imports, rendezvous, data/model/checkpoint load, the
    first step; total (the kill to the slowest rank's first step) and lost (steps computed again)."""
    kill = next(e for e in evts if e["event"] == "kill")

    def last(name: str) -> float:
        times = [e["t"] for e in evts if e["event"] == name and e.get("incarnation") == 1]
        if len(times) != workers:
            raise ValueError(f"{len(times)} of {workers} restarted ranks logged {name!r}")
        return max(times)

    started = min(e["t"] for e in evts if e["event"] == "start" and e.get("incarnation") == 1)
    imported, formed, loaded, first = last("imported"), last("rendezvous"), last("loaded"), last("first_step")
    resumed = next(e["step"] for e in evts if e["event"] == "loaded" and e.get("incarnation") == 1)
    return {"detect": started - kill["t"], "start+imports": imported - started, "rendezvous": formed - imported,
            "data, model, state": loaded - formed, "first step": first - loaded, "total": first - kill["t"],
            "lost": kill["step"] - resumed}
