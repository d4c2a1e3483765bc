"""Recovery after a worker is killed: Cohort in place vs torchrun elastic restart (a benchmark).

    python bench/recovery.py [--workers 4] [--every 50] [--kill-steps 110,125,140]

The same model (MLP on digits, 4 ranks, gloo on CPU) is killed at the same
step under both systems:
- Cohort: `cohort run --local`; the launcher (the membership authority, as the
  operator is on Kubernetes) publishes a world without the dead rank and the
  survivors re-form their process group in place, continuing from the step
  they hold.
- torchrun elastic (c10d rendezvous, --max-restarts): every worker is
  restarted, re-imports torch, re-rendezvouses and reloads the newest
  checkpoint, taken every K steps.
Recovery time is from the kill to the first completed step of the new world;
steps lost are the completed steps that must be computed again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=None).timestamp() - time.timezone


def cohort_once(tmp: Path, workers: int, kill_step: int, steps: int) -> tuple[float, int]:
    manifest = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    manifest["metadata"]["name"] = "recovery"
    manifest["spec"]["workload"].update({"epochs": 0, "maxSteps": steps})
    manifest["spec"]["checkpoint"] = {"everySteps": 0}
    mf = tmp / "job.yaml"
    mf.write_text(yaml.safe_dump(manifest))
    subprocess.run([sys.executable, "-m", "cohort.trainer.cli", "run", str(mf), "--local", "--workers",
                    str(workers), "--run-dir", str(tmp / "run"), "--no-replace"], check=True,
                   env={**os.environ, "COHORT_FAULT_KILL": f"rank=2,step={kill_step}"},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_kill, recovered, resumed = None, [], []
    for log in (tmp / "run").glob("*.log"):
        for line in log.read_text().splitlines():
            if not line.startswith("{"):
                continue
            rec = json.loads(line)
            if rec["msg"] == "fault injection: SIGKILL self":
                t_kill = rec["t"]
            elif rec["msg"] == "recovered":
                recovered.append(rec["t"])
            elif rec["msg"] == "joined world" and rec.get("world_version") == 2:
                resumed.append(rec["step"])
    assert t_kill is not None and recovered and resumed, f"no recovery seen in {tmp / 'run'}"
    return max(recovered) - t_kill, kill_step - min(resumed)


def torchrun_once(tmp: Path, workers: int, kill_step: int, steps: int, every: int, port: int) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(workers),
           "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--monitor-interval", "0.1", str(REPO / "bench/torchrun_worker.py"), "--ckpt-dir", str(tmp),
           "--every", str(every), "--kill-step", str(kill_step), "--steps", str(steps)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    kill = next(e for e in events if e["event"] == "kill")
    first = next(e for e in events if e["event"] == "first_step")
    resumed = next((e["step"] for e in events if e["event"] == "resumed" and e["incarnation"] > 0), 0)
    return first["t"] - kill["t"], kill["step"] - resumed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--every", type=int, default=50, help="torchrun checkpoint interval K (steps)")
    ap.add_argument("--kill-steps", default="110,125,140")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for i, s in enumerate(int(x) for x in args.kill_steps.split(",")):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            c_time, c_lost = cohort_once(Path(a), args.workers, s, args.steps)
            t_time, t_lost = torchrun_once(Path(b), args.workers, s, args.steps, args.every, 29850 + i)
        rows.append((s, c_time, c_lost, t_time, t_lost))
    print(f"{args.workers} ranks, MLP on digits, gloo/CPU; torchrun checkpoints every K={args.every} steps")
    print("| kill at step | Cohort recovery (s) | Cohort steps lost | torchrun recovery (s) | torchrun steps lost |"
          " Cohort / torchrun time |")
    print("|---|---|---|---|---|---|")
    for s, ct, cl, tt, tl in rows:
        print(f"| {s} | {ct:.3f} | {cl} | {tt:.3f} | {tl} | {ct / tt:.3f} |")
    ct = statistics.mean(r[1] for r in rows)
    tt = statistics.mean(r[3] for r in rows)
    print(f"| mean | {ct:.3f} | {statistics.mean(r[2] for r in rows):.1f} | {tt:.3f} | "
          f"{statistics.mean(r[4] for r in rows):.1f} | **{ct / tt:.3f}** |")


if __name__ == "__main__":
    main()
