"""Goodput under periodic worker kills: Cohort against torchrun elastic and torchft, the same work (a benchmark).

    python bench/goodput.py [--steps 300] [--repeats 3] [--periods 60,15] [--systems cohort,torchrun,torchft]

The job is examples/gpt-text.yaml (a 4-layer transformer on tokenised Python
sources, 4 ranks, global batch 64, AdamW) for ``--steps`` optimizer steps, on
CPU/gloo. Every system trains the manifest's own model and data, built by the
same code (bench/job_workload.py for the baselines), and ends at the same step
count. In one invocation, interleaved per repeat, each system runs without
failures and with one worker SIGKILLed every P seconds of wall time from its
launch (``--periods``), never rank 0 (whose process holds Cohort's ledger and
torchrun's checkpoints):

- **Cohort**: ``cohort run --local`` with ``replicas.spares: 1``: the launcher
  (the operator's part) swaps the ready spare in and starts a new spare; the
  survivors keep their state in memory (docs/recovery.md). The victim is the
  highest rank of the current world (the launcher's world.json).
- **torchrun elastic** (c10d rendezvous, ``--max-restarts`` high enough):
  every worker restarts and resumes from rank 0's newest ``torch.save``
  checkpoint. Its interval K is Young's optimum, sqrt(2 x C x P) seconds of
  steps, with C the save time and the step time measured in its failure-free
  run of the same repeat (stated in the output).
- **torchft 0.2.0** (``hack/torchft.sh``): its fault-tolerant DDP, one replica
  group per process, its lighthouse with ``min_replicas`` 3; this script
  restarts a killed replica at once (torchft leaves that to the scheduler) and
  it heals from a peer.

Goodput = a system's failure-free wall time (median of its repeats) / its wall
time with failures. Cells are median [min-max] over the repeats. CPU seconds
are the kernel's: ``getrusage(RUSAGE_CHILDREN)`` around each run (the system's
whole process tree, reaped). For Cohort, rank 0's time ledger (trainer/ledger.py,
the trainer's half of status.goodput) is checked against that clock: its
training share relative to the failure-free run's (training seconds over wall
seconds, each run's own) should equal the measured goodput (issue 31, item 5).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import torchrun_elastic  # noqa: E402
from bench.recovery import LIGHTHOUSE, TORCHFT  # noqa: E402
from bench.stats import host  # noqa: E402

WORKERS = 4
MANIFEST = REPO / "examples/gpt-text.yaml"


@dataclass
class Run:
    wall: float
    cpu: float
    kills: int
    steps: int
    ledger: dict[str, float] = field(default_factory=dict)  # Cohort: rank 0's, seconds by category
    ckpt_s: float = 0.0  # torchrun: mean save time
    step_s: float = 0.0  # torchrun: mean step time of the failure-free run
    crashes: int = 0  # torchft: replicas that exited non-zero without being killed (restarted too)
    finished: bool = True  # False: stopped at --timeout (wall is then the limit, steps what it had reached)


def manifest(tmp: Path, steps: int, spares: int) -> Path:
    m = yaml.safe_load(MANIFEST.read_text())
    m["metadata"]["name"] = "goodput"
    m["spec"]["workload"].update({"maxSteps": steps, "epochs": 0})
    m["spec"]["replicas"] = {"min": 2, "max": WORKERS + spares, "target": WORKERS, "spares": spares}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    return path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _pids(match: str) -> dict[int, dict[str, str]]:
    """Live processes whose command line contains ``match``: pid -> environment."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if match not in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        out[int(d.name)] = dict(e.decode(errors="replace").split("=", 1) for e in env if b"=" in e)
    return out


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


class Killer:
    """SIGKILLs one worker every ``period`` seconds from ``t0`` (0: never); ``victim()`` names its pid."""

    def __init__(self, period: float, victim):
        self.period, self.victim = period, victim
        self.t0 = time.monotonic()
        self.kills = 0

    def tick(self) -> None:
        if self.period and time.monotonic() - self.t0 >= self.period * (self.kills + 1):
            pid = self.victim()
            if pid is not None and _kill(pid):
                self.kills += 1
                print(f"    kill {self.kills} at {time.monotonic() - self.t0:.1f} s (pid {pid})", file=sys.stderr)


def _wait(proc: subprocess.Popen, killer: Killer, timeout_s: float) -> bool:
    """Until the system's process exits (True), or until ``timeout_s``: then its process group is killed (False)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        killer.tick()
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return False
        time.sleep(0.1)
    return True


def _supervise(cmd: list[str], period: float, victim, timeout_s: float,
               env: dict[str, str] | None = None) -> tuple[subprocess.Popen, bool, float, float, int]:
    """Run a system's command with a Killer beside it: (process, finished, wall s, CPU s, kills)."""
    cpu, t0 = _cpu(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=env)
    killer = Killer(period, victim)
    finished = _wait(proc, killer, timeout_s)
    return proc, finished, time.monotonic() - t0, _cpu() - cpu, killer.kills


def cohort_once(tmp: Path, steps: int, period: float, timeout_s: float) -> Run:
    run_dir = tmp / "run"

    def victim() -> int | None:
        try:
            members = json.loads((run_dir / "world.json").read_text())["members"]
        except (OSError, ValueError, KeyError):
            return None
        if len(members) < 2:
            return None
        name = members[-1]["pod"]
        return next((pid for pid, env in _pids("cohort.trainer.cli train").items()
                     if env.get("COHORT_POD_NAME") == name), None)

    summary = tmp / "summary.json"
    proc, finished, wall, cpu, kills = _supervise(
        [sys.executable, "-m", "cohort.trainer.cli", "run", str(manifest(tmp, steps, 1)), "--local", "--workers",
         str(WORKERS), "--run-dir", str(run_dir), "--checkpoint-dir", str(tmp / "ck"), "--summary-json", str(summary)],
        period, victim, timeout_s)
    if not finished:
        return Run(wall, cpu, kills, -1, finished=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cohort run exited {proc.returncode}; logs in {run_dir}")
    s = json.loads(summary.read_text())
    return Run(wall, cpu, kills, int(s["step"]), ledger=(s.get("ledger") or {}).get("seconds", {}))


def torchrun_once(tmp: Path, steps: int, period: float, every: int, port: int, timeout_s: float) -> Run:
    def victim() -> int | None:
        ranks = {int(env.get("RANK", "0")): pid for pid, env in _pids("torchrun_worker.py").items()
                 if "RANK" in env}
        return ranks.get(max(ranks)) if ranks and max(ranks) > 0 else None

    cmd = torchrun_elastic.command(WORKERS, port, 1000, "--ckpt-dir", str(tmp), "--every", str(every),
                                   "--steps", str(steps), "--manifest", str(MANIFEST))
    proc, finished, wall, cpu, kills = _supervise(cmd, period, victim, timeout_s,
                                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
    if not finished:
        return Run(wall, cpu, kills, -1, finished=False)
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}; events in {tmp}")
    events = torchrun_elastic.events(tmp)
    saves = [e["seconds"] for e in events if e["event"] == "saved"]
    first = [e for e in events if e["event"] == "first_step" and e.get("incarnation") == 0]
    step_s = (wall - (max(e["t"] for e in first) - min(e["t"] for e in events if e["event"] == "start"))) / steps \
        if first else 0.0
    return Run(wall, cpu, kills, steps, ckpt_s=statistics.fmean(saves) if saves else 0.0, step_s=step_s)


def torchft_once(tmp: Path, steps: int, period: float, port: int, timeout_s: float) -> Run:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TORCHFT), str(TORCHFT / "deps"), os.environ.get("PYTHONPATH", "")])}
    cpu, t0 = _cpu(), time.monotonic()
    lighthouse = subprocess.Popen([sys.executable, "-c", LIGHTHOUSE, str(WORKERS - 1)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs: dict[int, subprocess.Popen] = {}
    incarnation = dict.fromkeys(range(WORKERS), 0)
    try:
        assert lighthouse.stdout is not None
        address = lighthouse.stdout.readline().strip()

        def spawn(replica: int) -> None:
            out = open(tmp / f"r{replica}-{incarnation[replica]}.log", "w")  # noqa: SIM115 - the child's stdout
            procs[replica] = subprocess.Popen(
                [sys.executable, str(REPO / "bench/torchft_worker.py"), "--replica", str(replica), "--incarnation",
                 str(incarnation[replica]), "--lighthouse", address,
                 "--store-port", str(port + 10 * incarnation[replica] + replica), "--replicas", str(WORKERS),
                 "--steps", str(steps), "--manifest", str(MANIFEST)], env=env, stdout=out, stderr=subprocess.STDOUT)
            out.close()

        for r in range(WORKERS):
            spawn(r)
        turn = [0]

        def victim() -> int | None:
            replica = 1 + turn[0] % (WORKERS - 1)
            turn[0] += 1
            return procs[replica].pid

        killer = Killer(period, victim)
        deadline = time.monotonic() + timeout_s
        crashes = 0  # replicas that failed on their own (torchft 0.2's DDP hook asserts when a peer dies mid-backward)
        finished = True
        # The job is done when a replica has committed the last step and exits 0. The others may still be
        # waiting for a quorum that the finished replicas no longer join: they are stopped then.
        while not any(p.poll() == 0 for p in procs.values()):
            killer.tick()
            for r, p in list(procs.items()):
                if p.poll() is not None:  # killed, or failed after a peer's death: the scheduler restarts it
                    crashes += p.returncode > 0
                    incarnation[r] += 1
                    spawn(r)
            if time.monotonic() > deadline:
                finished = False
                break
            time.sleep(0.1)
        wall = time.monotonic() - t0
    finally:
        for p in [*procs.values(), lighthouse]:
            if p.poll() is None:
                p.kill()
            p.wait()
    cpu = _cpu() - cpu
    events = [json.loads(line) for log in tmp.glob("r*.log") for line in log.read_text().splitlines()
              if line.startswith("{") and ('"done"' in line or '"step"' in line)]
    reached = max((e["step"] for e in events if e["event"] == "done" or e.get("committed")), default=0)
    return Run(wall, cpu, killer.kills, reached, crashes=crashes, finished=finished)


def young_interval(save_s: float, step_s: float, period: float) -> int:
    """Young's optimal checkpoint interval, sqrt(2 x C x MTBF), in steps (at least 1)."""
    return max(1, round(math.sqrt(2 * save_s * period) / step_s)) if step_s > 0 else 10


def cell(values: list[float], fmt: str = ".1f") -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--periods", default="60,15", help="seconds between kills (comma list)")
    ap.add_argument("--systems", default="cohort,torchrun,torchft")
    ap.add_argument("--timeout", type=float, default=600,
                    help="per run, seconds: a run still going then is stopped and shown as not finished")
    args = ap.parse_args()
    systems = args.systems.split(",")
    if "torchft" in systems and not (TORCHFT / "torchft").is_dir():
        sys.exit(f"torchft not installed in {TORCHFT}: run hack/torchft.sh (or leave it out of --systems)")
    periods = [0.0] + [float(p) for p in args.periods.split(",")]
    started = host()
    runs: dict[tuple[str, float], list[Run]] = {(s, p): [] for s in systems for p in periods}
    every: dict[float, list[int]] = {p: [] for p in periods}
    for i in range(args.repeats):
        for period in periods:
            for system in systems:
                tmp = Path(tempfile.mkdtemp(prefix=f"goodput-{system}-"))  # kept if the run fails
                if system == "cohort":
                    r = cohort_once(tmp, args.steps, period, args.timeout)
                elif system == "torchrun":
                    free = runs[("torchrun", 0.0)][-1] if period else None
                    k = young_interval(free.ckpt_s, free.step_s, period) if free else 10
                    every[period].append(k)
                    r = torchrun_once(tmp, args.steps, period, k, 29850 + i, args.timeout)
                else:
                    r = torchft_once(tmp, args.steps, period, 29700 + 40 * i, args.timeout)
                shutil.rmtree(tmp)
                runs[(system, period)].append(r)
                print(f"repeat {i + 1}/{args.repeats}, {'no kills' if not period else f'a kill every {period:g} s'}: "
                      f"{system}: {r.wall:.1f} s, {r.kills} kills, {r.steps} steps, {r.cpu:.0f} CPU s"
                      f"{'' if r.finished else f' (stopped at the {args.timeout:g} s limit)'}",
                      file=sys.stderr, flush=True)
    print(f"{WORKERS} ranks, examples/gpt-text.yaml for {args.steps} steps, gloo/CPU; {args.repeats} repeats, "
          f"interleaved; started {started}; ended {host()}")
    print("Goodput = failure-free wall time (median) / wall time with kills. Cells: median [min-max].\n")
    print("| system | kills every | wall (s) | kills | goodput | CPU (s, kernel) | notes |")
    print("|---|---|---|---|---|---|---|")
    for system in systems:
        base = statistics.median(r.wall for r in runs[(system, 0.0)])
        for period in periods:
            rs = runs[(system, period)]
            note = ""
            if system == "torchrun":
                note = f"checkpoint every {cell([float(k) for k in every[period]], '.0f')} steps" + \
                    (" (Young's interval)" if period else "")
            if system == "torchft" and any(r.crashes for r in rs):
                note = f"{cell([float(r.crashes) for r in rs], '.0f')} replicas also failed on their own, restarted"
            unfinished = [r for r in rs if not r.finished]
            if unfinished:
                note += (f"; {len(unfinished)} of {len(rs)} runs stopped at the {args.timeout:g} s limit "
                         f"(steps reached: {', '.join(str(r.steps) for r in unfinished)}): their goodput is at most "
                         "the figure")
            if system == "cohort" and rs and all(r.ledger for r in rs):
                shares = [r.ledger.get("training", 0.0) / r.wall for r in rs]
                note = f"ledger: training {cell([100 * s for s in shares])} % of wall"
                if period:
                    free = statistics.median(r.ledger.get("training", 0.0) / r.wall for r in runs[(system, 0.0)])
                    note += f"; relative to no kills {cell([s / free for s in shares], '.3f')}"
            print(f"| {system} | {'never' if not period else f'{period:g} s'} | {cell([r.wall for r in rs])} | "
                  f"{cell([float(r.kills) for r in rs], '.0f')} | **{cell([base / r.wall for r in rs], '.3f')}** | "
                  f"{cell([r.cpu for r in rs], '.0f')} | {note} |")


if __name__ == "__main__":
    main()
