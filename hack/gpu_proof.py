"""The GPU proof: what Cohort's trainer does on one NVIDIA GPU, phase by phase (run it with hack/gpu-proof.sh).

    hack/gpu-proof.sh [--smoke] OUTDIR
    python3 hack/gpu_proof.py [--smoke] [--deadline S] [--phases a,b] OUTDIR   # what that runs

Phases, most valuable first, each in a process of its own under a time budget of its own (cut to
what is left of the whole run's deadline; a --deadline above the default raises every phase's cap by
the same factor, for slower machines); one that fails or runs out of time is recorded with its
error and the next one still runs:

- environment: the GPU, driver, memory, torch, CUDA, NCCL, cores, the packages the trainer imports,
  and one large bf16 matrix product (the ceiling MFU is read against).
- plain: a plain torch loop (no Cohort trainer; Cohort's Transformer class, so both measure one
  model) of a GPT-2-small shape, 12 layers, dim 768, 12 heads, seq 1024, vocab 50304, batch 16, bf16
  autocast, torch.compile per block, AdamW: tokens/s and MFU over timed steps after warm-up (the
  FLOPs of throughput.py's Throughput.of), step-time median and spread, peak memory, and a profiler
  table of the top 15 kernels (OUTDIR/plain_kernels.txt); then each workload.activationCheckpointing
  mode on a fresh eager copy of the model: its peak allocated memory and median step.
- cohort: the same model and batch through ``cohort run --local --workers 1`` (synthetic-lm, bf16,
  compile), maxSteps sized from the plain loop's step time to train about 65 s: tokens/s, MFU and
  the ratio to the plain loop of this invocation.
- recovery: 3 workers and a spare sharing the GPU over NCCL (the launcher gives them NCCL's sharing
  settings), a small model, checkpoints, one worker SIGKILLed at a known step (COHORT_FAULT_KILL):
  recovered in place, from the checkpoint, or hung; the time from the kill to the slowest rank's first
  step at full size, with that rank's timeline (its collective failing, the old group torn down, the
  launcher's world, the new group formed, the state agreed and handed over, the first step); the steps
  lost; then a new run that restores from that checkpoint directory.
- torchrun: the same kill under torchrun elastic (bench/torchrun_worker.py: a plain DDP loop of the same
  model over NCCL, torch.save every as many steps, every worker restarted and reloading the newest
  checkpoint): its restart in phases, the steps lost, and Cohort's recovery over it (the ratio).
- features: a compressor (powersgd), gossip, fsdp, top-k and Streaming DiLoCo, 2 workers sharing the GPU, a
  few dozen steps each (gossip and DiLoCo also evaluate and checkpoint their replicas' average mid-run):
  finished or not, loss, time.

OUTDIR gets four files: results.jsonl, one JSON line per phase as each ends (flushed), then a
summary line; proof.log, the human log; plain_kernels.txt, the profiler's table; and logs.tar.gz,
the work directory's logs (each phase's output, its runs' manifests, launcher and worker logs,
summaries; no checkpoints), packed again after every phase. The work directory holds the rest: --workdir
names one to keep, else a new one under /tmp is made and removed at the end. ``--smoke`` runs the same phases with a tiny model on the CPU over gloo
(about 3 minutes on a 2-core machine), to exercise this script where there is no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import torchrun_elastic  # noqa: E402  (standard library only)

# name, time cap in seconds (full run, smoke run)
PHASES: list[tuple[str, int, int]] = [
    ("environment", 60, 40),
    ("plain", 150, 50),
    ("cohort", 170, 60),
    ("recovery", 170, 80),
    ("torchrun", 90, 60),
    ("features", 160, 80),
]
# A CPU whose bf16 matrix products have no instructions of their own (an AMD EPYC of Zen 3: about 5,000 tokens/s
# in the smoke's plain loop, against 23,000-27,000 on the other 2-core machines) trains every later phase that much
# slower, and ran out of their caps at the default deadline (docs/benchmarks.md#gpu-proof). Without a deadline
# given, a smoke whose plain loop makes fewer tokens/s than this gives the later phases proportionally more time.
SMOKE_REFERENCE_TPS = 12_000.0
SMOKE_MAX_STRETCH = 2.5
H200_BF16_PEAK = 989e12  # NVIDIA's dense bf16 figure; throughput.py's table has it too
TARGET_MFU = 0.40
TARGET_RATIO = 0.95


# --- the driver ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU over gloo (no GPU needed)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds for the whole run (default 460, smoke 240, which a CPU slow at bf16 stretches up "
                        "to 2.5x after the plain phase); more raises each phase's cap alike")
    p.add_argument("--phases", default="", help="comma-separated subset of: " + ",".join(n for n, _, _ in PHASES))
    p.add_argument("--workdir", help="runs, logs and checkpoints (default: a new directory under /tmp)")
    p.add_argument("--phase", help=argparse.SUPPRESS)      # internal: run one phase in this process
    p.add_argument("--budget", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--pair-rank", type=int, help=argparse.SUPPRESS)  # internal: one rank of the NCCL pair
    p.add_argument("--pair-store", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.pair_rank is not None:
        return pair_rank(args.pair_rank, args.pair_store, args.smoke, Path(args.outdir))
    out = Path(args.outdir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="cohort-proof-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.phase:
        run_phase(args.phase, out, work, args.smoke, args.budget)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the result is on disk: no interpreter finalisation (CUDA, NCCL and compile workers' teardown)
    default = 240.0 if args.smoke else 460.0
    rc = drive(out, work, args.smoke, args.deadline or default, [s for s in args.phases.split(",") if s],
               cap_scale=max(1.0, (args.deadline or default) / default),
               may_stretch=args.smoke and args.deadline is None)
    if not args.workdir:  # one made here: its logs are in logs.tar.gz, the rest (checkpoints) is not wanted
        shutil.rmtree(work, ignore_errors=True)
    return rc


class Log:
    def __init__(self, path: Path):
        self.f = open(path, "w")  # noqa: SIM115 - open for the run
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        line = f"[proof {time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def smoke_stretch(plain_tokens_per_s: float | None) -> float:
    """How much more time a smoke's later phases get after its plain loop made ``plain_tokens_per_s``: 1 at
    :data:`SMOKE_REFERENCE_TPS` or more (or unknown), else the ratio, up to :data:`SMOKE_MAX_STRETCH`."""
    if not plain_tokens_per_s or plain_tokens_per_s <= 0:
        return 1.0
    return min(SMOKE_MAX_STRETCH, max(1.0, SMOKE_REFERENCE_TPS / plain_tokens_per_s))


def drive(out: Path, work: Path, smoke: bool, deadline_s: float, only: list[str], cap_scale: float = 1.0,
          may_stretch: bool = False) -> int:
    t0 = time.monotonic()
    results = open(out / "results.jsonl", "w")  # noqa: SIM115 - written as the phases end
    say = Log(out / "proof.log")
    say(f"GPU proof{' (smoke: CPU, gloo, tiny model)' if smoke else ''} into {out}; work directory {work}; "
        f"deadline {deadline_s:.0f}s; python {sys.executable}")
    done: dict[str, dict[str, Any]] = {}
    for name, cap_full, cap_smoke in PHASES:
        if only and name not in only:
            continue
        left = deadline_s - (time.monotonic() - t0) - 5
        budget = min((cap_smoke if smoke else cap_full) * cap_scale, left)
        if budget < 15:
            rec: dict[str, Any] = {"phase": name, "ok": False, "skipped": True,
                                   "error": f"no time left ({left:.0f}s of the {deadline_s:.0f}s deadline)"}
        else:
            say(f"phase {name}: budget {budget:.0f}s")
            rec = run_phase_process(name, out, work, smoke, budget)
        rec["smoke"] = smoke
        done[name] = rec
        results.write(json.dumps(rec, default=str) + "\n")
        results.flush()
        os.fsync(results.fileno())
        say(f"phase {name}: {'ok' if rec.get('ok') else 'FAILED'} in {rec.get('seconds', 0)}s | {headline(rec)}")
        if rec.get("log_tail"):
            say(f"phase {name}: the end of its log:\n{rec['log_tail']}")
        if name == "plain" and may_stretch and (stretch := smoke_stretch(rec.get("tokens_per_s"))) > 1.0:
            deadline_s, cap_scale = deadline_s * stretch, cap_scale * stretch
            say(f"smoke: the plain loop made {rec['tokens_per_s']:.0f} tokens/s, under {SMOKE_REFERENCE_TPS:.0f} (a "
                f"CPU slow at bf16): the later phases get {stretch:.2f}x their caps, deadline {deadline_s:.0f}s")
        pack_logs(work, out / "logs.tar.gz")
    summary = summarize(done, smoke, time.monotonic() - t0)
    results.write(json.dumps(summary, default=str) + "\n")
    results.flush()
    say("summary: " + json.dumps(summary, default=str))
    return 0 if all(r.get("ok") for r in done.values()) else 1


def run_phase_process(name: str, out: Path, work: Path, smoke: bool, budget: float) -> dict[str, Any]:
    """One phase in a child process, killed (with everything it started) past its budget."""
    partial = work / f"{name}.json"
    partial.unlink(missing_ok=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--phase", name, "--budget", f"{budget:.1f}",
           "--workdir", str(work), str(out)]
    if smoke:
        cmd.insert(2, "--smoke")
    rc, seconds = run_logged(cmd, work / f"{name}.log", budget + 5)
    rec = {"phase": name, "ok": False}
    with contextlib.suppress(OSError, ValueError):
        rec.update(json.loads(partial.read_text()))
    rec["phase"], rec["seconds"], rec["budget_s"] = name, seconds, round(budget)
    if rc is None:
        rec["ok"] = False
        rec["error"] = f"timeout: the phase ran past its {budget:.0f}s budget and was killed" + (
            f"; before that: {rec['error']}" if rec.get("error") else "")
    elif rc != 0 and rec.get("ok"):  # its figures stand; the exit is worth knowing about
        rec["exit_code"] = rc
    if not rec.get("ok"):
        rec.setdefault("error", f"the phase exited {rc} without recording a result")
        rec["log_tail"] = tail(work / f"{name}.log", 25)
    return rec


def run_logged(cmd: list[str], log_path: Path, timeout: float,
               env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` in a session of its own with its output in ``log_path``; past ``timeout`` it is killed with
    everything it started. (Its exit code, None when cut; seconds.)"""
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
            rc = None
    return rc, round(time.monotonic() - start, 1)


def pack_logs(work: Path, dest: Path) -> None:
    """The work directory's text (logs, manifests, summaries), not its checkpoints, as one archive."""
    def small_text(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if info.isdir():
            return None if "checkpoints" in Path(info.name).parts else info
        return info if info.name.endswith((".log", ".json", ".yaml", ".txt", ".termination")) else None

    tmp = dest.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(work, arcname="proof", filter=small_text)
    tmp.replace(dest)


def headline(r: dict[str, Any]) -> str:
    keys = ["gpu", "torch", "nccl", "tokens_per_s", "mfu", "ratio_to_plain", "outcome", "recovery_s",
            "back_to_full_size_s", "steps_lost", "restart_s", "cohort_over_torchrun", "finished", "error"]
    return ", ".join(f"{k}={str(r[k])[:300]}" for k in keys if r.get(k) is not None)


def summarize(done: dict[str, dict[str, Any]], smoke: bool, seconds: float) -> dict[str, Any]:
    plain, cohort = done.get("plain", {}), done.get("cohort", {})
    rec, feats, trun = done.get("recovery", {}), done.get("features", {}), done.get("torchrun", {})
    env = done.get("environment", {})
    s: dict[str, Any] = {"phase": "summary", "smoke": smoke, "seconds": round(seconds, 1),
                         "gpu": env.get("gpu"), "torch": env.get("torch"), "nccl": env.get("nccl"),
                         "phases_ok": [n for n, r in done.items() if r.get("ok")],
                         "phases_failed": [n for n, r in done.items() if not r.get("ok")],
                         "plain_tokens_per_s": plain.get("tokens_per_s"), "plain_mfu": plain.get("mfu"),
                         "cohort_tokens_per_s": cohort.get("tokens_per_s"), "cohort_mfu": cohort.get("mfu"),
                         "ratio_to_plain": cohort.get("ratio_to_plain"),
                         "recovery_outcome": rec.get("outcome"), "recovery_s": rec.get("recovery_s"),
                         "back_to_full_size_s": rec.get("back_to_full_size_s"), "steps_lost": rec.get("steps_lost"),
                         "torchrun_restart_s": trun.get("restart_s"), "torchrun_steps_lost": trun.get("steps_lost"),
                         "cohort_over_torchrun": trun.get("cohort_over_torchrun"),
                         "restore_ok": (rec.get("restore") or {}).get("ok"),
                         "features_finished": {k: v.get("finished") for k, v in (feats.get("runs") or {}).items()}}
    if not smoke:
        s["target_mfu_met"] = None if plain.get("mfu") is None else plain["mfu"] >= TARGET_MFU
        s["target_ratio_met"] = None if cohort.get("ratio_to_plain") is None else \
            cohort["ratio_to_plain"] >= TARGET_RATIO
    return s


# --- processes ---------------------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) for every process."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(d)] = (int(fields[1]), fields[19])
    return table


def descendants(pid: int) -> dict[int, str]:
    """pid and every process below it: pid -> start time (to tell a reused pid)."""
    table = _proc_table()
    found = {pid: table[pid][1]} if pid in table else {}
    grew = True
    while grew:
        grew = False
        for p, (ppid, start) in table.items():
            if ppid in found and p not in found:
                found[p] = start
                grew = True
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything it started (workers run in sessions of their own, so a process
    group would miss them): the tree is frozen (SIGSTOP) as it is gathered, so nothing in it starts
    another process meanwhile, then killed, each process checked by its start time."""
    tree: dict[int, str] = {}
    for _ in range(10):
        new = {p: s for p, s in descendants(pid).items() if p not in tree}
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        tree.update(new)
    table = _proc_table()
    for p, start in tree.items():
        if p in table and table[p][1] == start:
            _signal(p, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# --- one phase, in its own process -----------------------------------------------------------
class Phase:
    def __init__(self, name: str, out: Path, work: Path, smoke: bool, budget: float):
        self.name, self.out, self.work, self.smoke, self.budget = name, out, work, smoke, budget
        self.t0 = time.monotonic()
        self.result: dict[str, Any] = {"ok": False}
        self.dir = work / name
        self.dir.mkdir(exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def record(self, **kv: Any) -> None:
        """Merge into the result and write it at once (a later timeout keeps what got here)."""
        self.result.update(kv)
        tmp = self.work / f"{self.name}.json.tmp"
        tmp.write_text(json.dumps(self.result, default=str))
        tmp.replace(self.work / f"{self.name}.json")

    def say(self, text: str) -> None:
        print(f"[{self.name} {time.monotonic() - self.t0:6.1f}s] {text}", flush=True)


def run_phase(name: str, out: Path, work: Path, smoke: bool, budget: float) -> None:
    ph = Phase(name, out, work, smoke, budget)
    try:
        {"environment": phase_environment, "plain": phase_plain, "cohort": phase_cohort,
         "recovery": phase_recovery, "torchrun": phase_torchrun, "features": phase_features}[name](ph)
        ph.record()
    except Exception as e:  # recorded; the driver goes on with the next phase
        import traceback

        traceback.print_exc()
        ph.record(ok=False, error=f"{type(e).__name__}: {e}"[:2000], traceback=traceback.format_exc()[-4000:])


def model_shape(smoke: bool) -> dict[str, int]:
    if smoke:
        return {"dim": 64, "n_layers": 2, "n_heads": 4, "ffn_mult": 4, "seq_len": 64, "vocab": 512, "batch": 8}
    return {"dim": 768, "n_layers": 12, "n_heads": 12, "ffn_mult": 4, "seq_len": 1024, "vocab": 50304, "batch": 16}


def the_device(smoke: bool) -> Any:
    import torch

    if smoke:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible to torch (run with --smoke on a machine without a GPU)")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


def nccl_version() -> tuple[int, ...] | None:
    import torch

    from cohort.trainer.launcher import nccl_version_tuple

    try:
        return nccl_version_tuple(torch.cuda.nccl.version()) if torch.distributed.is_nccl_available() else None
    except Exception:
        return None


def phase_environment(ph: Phase) -> None:
    import platform

    import torch

    r: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable, "cores": os.cpu_count(),
                         "torch": torch.__version__, "cuda": torch.version.cuda,
                         "cuda_available": torch.cuda.is_available()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        r["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        r["nvidia_smi"] = f"unavailable: {e}"
    nv = nccl_version()
    r["nccl"] = ".".join(map(str, nv)) if nv else None
    r["nccl_available"] = torch.distributed.is_nccl_available()
    from cohort.trainer.launcher import nccl_sharing_env

    r["launcher_sharing_env_3_workers"] = nccl_sharing_env(3, 1, nv, "<worker name>", {}) if r["cuda_available"] \
        else {}
    import importlib.metadata

    versions = {}
    for mod, dist in (("yaml", "pyyaml"), ("prometheus_client", "prometheus-client"), ("fsspec", "fsspec"),
                      ("numpy", "numpy"), ("sklearn", "scikit-learn"), ("triton", "triton")):
        try:
            m = __import__(mod)
            versions[dist] = f"{importlib.metadata.version(dist)} ({os.path.dirname(m.__file__ or '')})"
        except Exception as e:
            versions[dist] = f"missing: {type(e).__name__}: {e}"
    r["packages"] = versions
    ph.record(**r)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        r.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                 capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count)
        from cohort.trainer.throughput import peak_flops

        peak = peak_flops(torch.device("cuda", 0), "bf16")
        r["peak_bf16_tflops_table"] = peak / 1e12 if peak else None
        ph.record(**r)
    if not ph.smoke and torch.cuda.is_available():
        dev, n, dtype = torch.device("cuda", 0), 8192, torch.bfloat16
    else:
        dev, n, dtype = torch.device("cpu"), 512, torch.float32
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(dev)
    t = time.perf_counter()
    reps = 10
    for _ in range(reps):
        a @ b
    sync(dev)
    r["matmul"] = {"n": n, "dtype": str(dtype), "tflops": round(2 * n**3 * reps / (time.perf_counter() - t) / 1e12, 2)}
    ph.record(ok=True, **r)


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(shape: dict[str, int], device: Any) -> Any:
    import torch

    from cohort.trainer.workloads.models import DataInfo, Transformer

    torch.manual_seed(0)
    info = DataInfo((shape["seq_len"],), vocab_size=shape["vocab"], seq_len=shape["seq_len"])
    model = Transformer(info, dim=shape["dim"], n_layers=shape["n_layers"], n_heads=shape["n_heads"],
                        ffn_mult=shape["ffn_mult"])
    return model.to(device)


def phase_plain(ph: Phase) -> None:
    import torch

    from cohort.trainer.throughput import Throughput
    from cohort.trainer.workloads.workload import cross_entropy  # the trainer's loss for lm

    shape, device = model_shape(ph.smoke), the_device(ph.smoke)
    if device.type == "cpu":  # as many threads as a `cohort run --local` worker gets (the launcher's default)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = build_model(shape, device)
    tp = Throughput.of(SimpleNamespace(model=model), device, "bf16")  # type: ignore[arg-type]
    for block in model.layers.values():  # as Cohort's workload.compile does (parallel/compile.py)
        block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)  # Cohort's "auto": torch's default kernel
    g = torch.Generator().manual_seed(0)
    b, t, v = shape["batch"], shape["seq_len"], shape["vocab"]
    x = torch.randint(0, v, (b, t), generator=g).to(device)
    y = torch.randint(0, v, (b, t), generator=g).to(device)
    params = sum(p.numel() for p in model.parameters())
    ph.record(device=str(device), shape=shape, params=params, flops_per_token=tp.flops_per_sample / t,
              peak_tflops=tp.peak_flops / 1e12 if tp.peak_flops else None, precision="bf16", compiled=True)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    warm, warm_s = (3 if ph.smoke else 5), []
    for _ in range(warm):
        s = time.perf_counter()
        loss = step()
        sync(device)
        warm_s.append(round(time.perf_counter() - s, 3))
    first_loss = float(loss)
    ph.say(f"warm-up steps (s): {warm_s}")
    ph.record(warmup_steps_s=warm_s, compile_s=warm_s[0])
    per_step = max(statistics.median(warm_s[1:]), 1e-4)
    target = 3.0 if ph.smoke else 10.0
    n = int(min(max(target / per_step, 10), 300))
    ph.say(f"timing {n} steps")
    events: list[tuple[Any, Any]] = []
    walls: list[float] = []
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        if device.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            loss = step()
            e1.record()
            events.append((e0, e1))
        else:
            s = time.perf_counter()
            loss = step()
            walls.append(time.perf_counter() - s)
    sync(device)
    wall = time.perf_counter() - start
    steps_s = [e0.elapsed_time(e1) / 1e3 for e0, e1 in events] if events else walls
    tps = n * b * t / wall
    q = statistics.quantiles(steps_s, n=10) if len(steps_s) >= 10 else [min(steps_s), max(steps_s)]
    r: dict[str, Any] = {
        "timed_steps": n, "timed_wall_s": round(wall, 3), "tokens_per_s": round(tps, 1),
        "tokens_per_s_step_median": round(b * t / statistics.median(steps_s), 1),
        "mfu": round(tp.mfu(tps / t, 1), 4) if tp.peak_flops else None,
        "step_s_median": round(statistics.median(steps_s), 5), "step_s_p10": round(q[0], 5),
        "step_s_p90": round(q[-1], 5), "step_s_min": round(min(steps_s), 5), "step_s_max": round(max(steps_s), 5),
        "loss_after_warmup": round(first_loss, 4), "loss_last": round(float(loss), 4),
    }
    if not ph.smoke:  # against the H200's peak whatever the card (the table's figure is in "mfu")
        r["mfu_h200_bf16"] = round(tps * tp.flops_per_sample / t / H200_BF16_PEAK, 4)
    if device.type == "cuda":
        r["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        r["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    ph.record(ok=True, **r)
    ph.say(f"{tps:.0f} tokens/s, mfu {r['mfu']}, median step {r['step_s_median']}s")
    if ph.left() < 20:
        ph.record(profile={"error": "skipped: too little time left"})
        return
    try:  # the figures above stand whatever the profiler does
        ph.record(profile=profile_kernels(step, device, ph.out / "plain_kernels.txt"))
    except Exception as e:
        ph.record(profile={"error": f"{type(e).__name__}: {e}"[:1000]})
    if ph.left() < 25:
        ph.record(activation_checkpointing={"error": "skipped: too little time left"})
        return
    try:
        ph.record(activation_checkpointing=checkpointing_memory(shape, device, x, y))
    except Exception as e:
        ph.record(activation_checkpointing={"error": f"{type(e).__name__}: {e}"[:1000]})


def checkpointing_memory(shape: dict[str, int], device: Any, x: Any, y: Any) -> dict[str, Any]:
    """Each workload.activationCheckpointing mode on the same model and batch, eager, bf16 autocast: the device's
    peak allocated memory over 4 steps (torch.cuda.max_memory_allocated; on the CPU none), what was allocated
    before the mode's model was built (the phase's compiled model is still resident), and the median step; beside
    them what activationCheckpointing auto would plan for: the memory model's bytes (parameters, gradients, AdamW's
    state, activations) with the activations measured on this device (parallel/activation_probe.py), to hold
    against the peak less what was resident."""
    import torch

    from cohort.trainer.parallel.activation_checkpoint import apply_activation_checkpointing
    from cohort.trainer.parallel.activation_probe import MODES, ProbeBatch, measure_activations
    from cohort.trainer.planner.dims import ParallelDims
    from cohort.trainer.planner.memory import memory_per_device
    from cohort.trainer.planner.profile import transformer_profile, with_measured_activations
    from cohort.trainer.workloads.workload import cross_entropy

    probe_start = time.perf_counter()
    acts = measure_activations(build_model(shape, device), ProbeBatch(x[:2], y[:2], cross_entropy), device, "bf16")
    profile = with_measured_activations(
        transformer_profile(shape["dim"], shape["n_layers"], shape["n_heads"], shape["ffn_mult"], shape["vocab"],
                            shape["seq_len"]),
        {m: acts.block[m].per_sample for m in MODES}, {m: acts.block[m].fixed for m in MODES},
        (acts.rest.per_sample, acts.rest.fixed))
    out: dict[str, Any] = {"probe_s": round(time.perf_counter() - probe_start, 3),
                           "probe": {m: vars(acts.block[m]) for m in MODES} | {"rest": vars(acts.rest)}}
    for mode in ("none", "full", "selective"):
        resident = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            resident = torch.cuda.memory_allocated(device)
        model = apply_activation_checkpointing(build_model(shape, device), mode)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        times = []
        for _ in range(4):
            s = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            sync(device)
            times.append(time.perf_counter() - s)
        out[mode] = {"step_s_median_of_last_3": round(statistics.median(times[1:]), 5), "loss": round(float(loss), 4),
                     "resident_before_bytes": resident,
                     "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                     "planned_bytes": round(memory_per_device(profile, ParallelDims(dp=1, dp_mode="ddp", ac=mode),
                                                              len(x), "adamw").total)}
        del model, opt, loss
    return out


def profile_kernels(step: Any, device: Any, path: Path) -> dict[str, Any]:
    """torch.profiler over 3 steps: the top 15 kernels (CPU ops on a CPU run), table to ``path``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            step()
            sync(device)
            prof.step()
    avgs = prof.key_averages()
    if not len(avgs):
        return {"error": "the profiler recorded nothing"}

    def dev_time(e: Any) -> float:
        for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
            if hasattr(e, attr):
                return float(getattr(e, attr))
        return 0.0

    if device.type == "cuda":
        rows = [(e.key, dev_time(e), e.count) for e in avgs if getattr(e, "device_type", None) == DeviceType.CUDA]
        sort = "self_device_time_total" if hasattr(avgs[0], "self_device_time_total") else "self_cuda_time_total"
    else:
        rows = [(e.key, float(e.self_cpu_time_total), e.count) for e in avgs]
        sort = "self_cpu_time_total"
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows) or 1.0
    table = avgs.table(sort_by=sort, row_limit=15, max_name_column_width=90)
    kind = "CUDA kernels" if device.type == "cuda" else "CPU ops (smoke: no GPU)"
    path.write_text(f"top 15 {kind} over 3 steps, sorted by {sort}\n\n{table}\n\n"
                    + "\n".join(f"{us / 3 / 1e3:10.3f} ms/step {100 * us / total:5.1f}% x{c // 3:<5} {name}"
                                for name, us, c in rows[:15]) + "\n")
    return {"file": path.name, "kind": kind, "per_step_ms_total": round(total / 3 / 1e3, 3),
            "top": [{"name": name[:120], "ms_per_step": round(us / 3 / 1e3, 3), "share": round(us / total, 4),
                     "calls_per_step": c // 3} for name, us, c in rows[:15]]}


# --- the trainer's runs ----------------------------------------------------------------------
def manifest(name: str, workload: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"workload": workload, **spec}}


def small_lm(smoke: bool, steps: int, **extra: Any) -> dict[str, Any]:
    """The small model of the recovery and feature runs (bf16 like a GPU user's, no compile)."""
    return {"model": "transformer", "modelArgs": {"dim": 128, "n_layers": 2, "n_heads": 4},
            "dataset": "synthetic-lm", "datasetArgs": {"sequences": 2048, "seq_len": 64 if smoke else 128,
                                                        "vocab": 256},
            "epochs": 0, "maxSteps": steps, "batchSize": 16, "precision": "bf16", "evalEveryEpochs": 0,
            "optimizer": {"name": "adamw", "lr": 0.003}, **extra}


def run_cohort(ph: Phase, tag: str, doc: dict[str, Any], workers: int, timeout: float,
               env: dict[str, str] | None = None, checkpoint_dir: Path | None = None) -> dict[str, Any]:
    """``cohort run <doc> --local --workers N`` under a hard timeout; its summary, logs and times."""
    run_dir = ph.dir / tag
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "manifest.yaml"
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML
    summary_path = run_dir / "summary.json"
    ck = checkpoint_dir or run_dir / "checkpoints"
    cmd = [sys.executable, "-m", "cohort.trainer.cli", "run", str(path), "--local", "--workers", str(workers),
           "--summary-json", str(summary_path), "--run-dir", str(run_dir / "run"), "--checkpoint-dir", str(ck)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if ph.smoke:
        full_env["COHORT_DEVICE"] = "cpu"
    wall_start = time.time()
    ph.say(f"{tag}: cohort run --workers {workers} (timeout {timeout:.0f}s)")
    rc, seconds = run_logged(cmd, run_dir / "launcher.log", max(timeout, 5), full_env)
    res: dict[str, Any] = {"rc": rc, "timed_out": rc is None, "seconds": seconds, "started_at": wall_start,
                           "run_dir": str(run_dir)}
    try:
        res["summary"] = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        res["summary"] = None
    launcher = (run_dir / "launcher.log").read_text(errors="replace") if (run_dir / "launcher.log").exists() else ""
    share = [ln for ln in launcher.splitlines() if "share one GPU" in ln]
    res["launcher_sharing"] = share[0].split("] ", 1)[-1] if share else None
    if rc != 0:
        res["launcher_tail"] = "\n".join(launcher.splitlines()[-12:])
        res["worker_errors"] = worker_errors(run_dir / "run")
    ph.say(f"{tag}: rc {rc} in {res['seconds']}s")
    return res


def worker_logs(run_dir: Path) -> dict[str, list[str]]:
    return {p.stem: p.read_text(errors="replace").splitlines() for p in sorted(run_dir.glob("*-worker-*.log"))}


def records(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for ln in lines:
        if ln.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(ln))
    return out


def worker_errors(run_dir: Path, n: int = 12) -> dict[str, str]:
    """Each worker log's last non-JSON lines (tracebacks, NCCL) and error records."""
    errs = {}
    for name, lines in worker_logs(run_dir).items():
        keep = [ln for ln in lines if not ln.startswith("{") or '"level": "error"' in ln
                or '"level": "warning"' in ln]
        if keep:
            errs[name] = "\n".join(keep[-n:])[-3000:]
    return errs


def phase_cohort(ph: Phase) -> None:
    shape = model_shape(ph.smoke)
    plain = {}
    with contextlib.suppress(OSError, ValueError):
        plain = json.loads((ph.work / "plain.json").read_text())
    target = 10.0 if ph.smoke else 65.0
    step_s = plain.get("step_s_median")
    steps = int(min(max(target / step_s, 30), 5000)) if step_s else (60 if ph.smoke else 1000)
    b, t = shape["batch"], shape["seq_len"]
    workload = {"model": "transformer",
                "modelArgs": {k: shape[k] for k in ("dim", "n_layers", "n_heads", "ffn_mult")},
                "dataset": "synthetic-lm",
                # 2 eval sequences: the final evaluation (compiled again, for no_grad) stays short
                "datasetArgs": {"sequences": 1024, "seq_len": t, "vocab": shape["vocab"], "branching": 4,
                                "test_fraction": 0.002},
                "epochs": 0, "maxSteps": steps, "batchSize": b, "precision": "bf16", "compile": True,
                "deterministic": False, "evalEveryEpochs": 0,
                "optimizer": {"name": "adamw", "lr": 3e-4, "weightDecay": 0.0}}
    doc = manifest("proof-gpt2", workload, replicas={"min": 1, "max": 1, "target": 1},
                   checkpoint={"everySteps": 0})
    ph.record(max_steps=steps, shape=shape, manifest=doc["spec"])
    res = run_cohort(ph, "run", doc, 1, ph.left() - 5)
    s = res.pop("summary") or {}
    last = progress_lines(ph.dir / "run" / "launcher.log")
    if last:  # the launcher's last progress line: a figure even when the run is cut short
        ph.record(last_progress={"launcher_s": last[-1][0], "step": last[-1][1], "samples_per_s": last[-1][2],
                                 "tokens_per_s": round(last[-1][2] * t, 1)})
    r: dict[str, Any] = {"run": res, "summary": {k: s.get(k) for k in (
        "step", "loss", "device", "precision", "compiled", "tokensPerSecond", "mfu", "samplesPerSecond",
        "stepSecondsMedian", "loopSecondsMean", "peakMemoryBytes", "seconds", "wallSeconds", "plan")}}
    if res["rc"] != 0 or not s:
        ph.record(ok=False, error=f"cohort run {'timed out' if res['timed_out'] else 'exited ' + str(res['rc'])}",
                  **r)
        return
    tokens = b * t
    tps = s.get("tokensPerSecond")
    loop = s.get("loopSecondsMean")
    med = s.get("stepSecondsMedian")
    r["tokens_per_s"] = round(tps, 1) if tps else None                       # the trainer's (EMA of steps)
    r["tokens_per_s_loop"] = round(tokens / loop, 1) if loop else None       # what the whole loop delivers
    r["tokens_per_s_step_median"] = round(tokens / med, 1) if med else None
    r["mfu"] = s.get("mfu")
    if plain.get("tokens_per_s"):
        base = plain["tokens_per_s"]
        r["plain_tokens_per_s"] = base
        r["ratio_to_plain"] = round(tps / base, 4) if tps else None
        r["ratio_loop_to_plain"] = round(tokens / loop / base, 4) if loop else None
        if med and plain.get("step_s_median"):
            r["ratio_step_median"] = round(plain["step_s_median"] / med, 4)
    r["timeline"] = timeline(ph.dir / "run" / "run", res["started_at"])
    ph.record(ok=True, **r)


def timeline(run_dir: Path, started_at: float) -> dict[str, Any]:
    """Seconds from the launcher's start to the worker's milestones (rank 0's log)."""
    marks = {"trainer started": "trainer_started", "process group formed": "process_group",
             "joined world": "joined", "first step in world": "first_step", "training complete": "complete"}
    out: dict[str, Any] = {}
    for _name, lines in worker_logs(run_dir).items():
        for rec in records(lines):
            key = marks.get(rec.get("msg", ""))
            if key and key not in out:
                out[key] = round(_ts(rec) - started_at, 2)
        break
    return out


def _ts(rec: dict[str, Any]) -> float:
    if isinstance(rec.get("t"), (int, float)):
        return float(rec["t"])
    import calendar

    ts = rec.get("ts", "")
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z", ts)
    if not m:
        return 0.0
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + int(m.group(2)) / 1e3


def kill_plan(smoke: bool) -> SimpleNamespace:
    """The kill of the recovery and torchrun phases: the same workers, rank, step and checkpoint interval.
    Smoke: about 12 steps/s on 2 cores. GPU: a kill after two committed checkpoints (the saves are
    asynchronous), and enough steps for the replacement to start (imports, CUDA, NCCL) and join."""
    if smoke:
        return SimpleNamespace(workers=2, rank=1, step=37, every=25, steps=150)
    return SimpleNamespace(workers=3, rank=1, step=137, every=50, steps=1500)


def phase_recovery(ph: Phase) -> None:
    plan = kill_plan(ph.smoke)
    workers, kill_step, every, steps = plan.workers, plan.step, plan.every, plan.steps
    env = {"COHORT_FAULT_KILL": f"rank={plan.rank},step={kill_step}"}
    ph.record(workers=workers, kill=env["COHORT_FAULT_KILL"], checkpoint_every=every, max_steps=steps,
              env=env, nccl_env_user={k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
    ph.record(nccl_pair=nccl_pair(ph, min(45.0, ph.left() / 4)))
    # NCCL's kernels spin on a dead peer: the survivors' collective fails when the job's collective
    # timeout runs out (calm steps only; TORCH_NCCL_ASYNC_ERROR_HANDLING=2 keeps their processes).
    # A spare: the killed rank's place is taken at once, so the new world is at full size, as torchrun's
    # restarted one is (the torchrun phase), and the spare gets its state from a live peer over NCCL.
    doc = manifest("proof-recovery", small_lm(ph.smoke, steps),
                   replicas={"min": 1, "max": workers, "target": workers, "spares": 1},
                   checkpoint={"everySteps": every, "keep": 3},
                   # a collective stuck on the dead peer outside calm steps is torn down after 30 s, not 60
                   faultTolerance={"collectiveTimeoutSeconds": 2,
                                   "processGroupTimeoutSeconds": 60 if ph.smoke else 30})
    ck = ph.dir / "checkpoints"
    restore_reserve = 30 if ph.smoke else 45
    # All but the restore's reserve: a fixed 120 s here was not stretched with a slow CPU's caps, and cut the
    # smoke's kill run at step 145 of 150 on the AMD EPYC (2026-12-07).
    res = run_cohort(ph, "kill", doc, workers, ph.left() - restore_reserve, env=env, checkpoint_dir=ck)
    s = res.pop("summary") or {}
    r: dict[str, Any] = {"kill_run": res, "finished": res["rc"] == 0 and bool(s), "final_step": s.get("step"),
                         "restarts": s.get("restarts"), "world_versions": s.get("worldVersions"),
                         "loss": s.get("loss")}
    r.update(read_recovery(ph.dir / "kill" / "run", kill_step, workers, s.get("worlds") or []))
    progress = progress_lines(ph.dir / "kill" / "launcher.log")
    if progress:
        r["last_progress"] = {"launcher_s": progress[-1][0], "step": progress[-1][1]}
    if res["timed_out"]:
        # cut while still training (steps in its last 20 s) is not a hang: the outcome stays the logs'
        recent = [st for t, st, _ in progress if t >= res["seconds"] - 20]
        moving = len(recent) >= 2 and recent[-1] > recent[0]
        r["cut_at_timeout"] = True
        if not moving:
            r["outcome"] = "hung"
    elif res["rc"] != 0:
        r["outcome"] = "failed"
    recovered = r.get("outcome") in ("in place", "checkpoint")
    ph.record(**r)
    ph.say(f"outcome {r.get('outcome')}, recovery {r.get('recovery_s')}s, steps lost {r.get('steps_lost')}")
    if not recovered:
        ph.record(error=f"the killed run's outcome: {r.get('outcome')}")
    # The restore: a new run over the same checkpoints, a few steps further than the newest.
    if ph.left() < 15:
        ph.record(ok=False, restore={"ok": False, "error": "no time left"})
        return
    saved = checkpoint_steps(ck)
    target = (max(saved) if saved else 0) + 40
    doc2 = manifest("proof-recovery", small_lm(ph.smoke, target), replicas={"min": 1, "max": 2, "target": 2},
                    checkpoint={"everySteps": every, "keep": 3})
    res2 = run_cohort(ph, "restore", doc2, 2, ph.left() - 3, checkpoint_dir=ck)
    s2 = res2.pop("summary") or {}
    resumed = [rec.get("step") for lines in worker_logs(ph.dir / "restore" / "run").values()
               for rec in records(lines) if rec.get("msg") == "resumed from checkpoint"]
    restore: dict[str, Any] = {"run": res2, "checkpoints_before": saved,
                               "resumed_from_step": resumed[0] if resumed else None, "final_step": s2.get("step"),
                               "max_steps": target, "loss": s2.get("loss")}
    restore["ok"] = res2["rc"] == 0 and bool(saved) and bool(resumed) and resumed[0] == max(saved) \
        and s2.get("step") == target
    if not restore["ok"]:
        restore["error"] = "no committed checkpoint to restore" if not saved else \
            "did not resume from the newest checkpoint" if resumed[:1] != [max(saved)] else \
            f"the restored run {'timed out' if res2['timed_out'] else 'exited ' + str(res2['rc'])}"
        ph.record(error="; ".join(filter(None, [ph.result.get("error"), "restore: " + restore["error"]])))
    ph.record(ok=recovered and restore["ok"], restore=restore)


def progress_lines(path: Path) -> list[tuple[float, int, float]]:
    """(launcher seconds, step, samples/s) of the launcher's progress lines:
    "[cohort   7.1s] step 42/300 epoch 0 loss 2.1342 357 samples/s world v2x1 eta 12s"."""
    out: list[tuple[float, int, float]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for m in re.finditer(r"^\[cohort +([\d.]+)s\] step (\d+)/.*? ([\d.]+) samples/s", text, re.M):
        out.append((float(m.group(1)), int(m.group(2)), float(m.group(3))))
    return out


def nccl_pair(ph: Phase, timeout: float) -> dict[str, Any]:
    """Two bare processes on the one GPU (no trainer), with the launcher's sharing settings: does an
    NCCL allreduce between them work at all, and at what bus bandwidth? (Smoke: gloo on the CPU.)"""
    from cohort.trainer.launcher import nccl_sharing_env

    nv = None if ph.smoke else nccl_version()
    store = ph.dir / "nccl_pair.store"
    store.unlink(missing_ok=True)
    procs, outs = [], []
    for rank in range(2):
        env = {**os.environ, **nccl_sharing_env(2, 1, nv, f"proof-pair-{rank}", os.environ)}
        outs.append(ph.dir / f"nccl_pair_{rank}.json")
        outs[-1].unlink(missing_ok=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--pair-rank", str(rank), "--pair-store", str(store),
               *(["--smoke"] if ph.smoke else []), str(outs[-1])]
        log = open(ph.dir / f"nccl_pair_{rank}.log", "w")  # noqa: SIM115 - the child's
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    deadline, timed_out = time.monotonic() + timeout, False
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            proc.wait()
    res: dict[str, Any] = {"env_rank0": nccl_sharing_env(2, 1, nv, "proof-pair-0", os.environ), "timed_out": timed_out}
    for rank, path in enumerate(outs):
        try:
            res[f"rank{rank}"] = json.loads(path.read_text())
        except (OSError, ValueError):
            res[f"rank{rank}"] = {"error": tail(ph.dir / f"nccl_pair_{rank}.log", 8)}
    res["ok"] = not timed_out and all(res[f"rank{r}"].get("ok") for r in range(2))
    ph.say(f"nccl pair: {res}")
    return res


def pair_rank(rank: int, store: str, smoke: bool, out: Path) -> NoReturn:
    import datetime

    import torch
    import torch.distributed as dist

    device = the_device(smoke)
    backend = "gloo" if device.type == "cpu" else "nccl"
    kw = {"device_id": device} if device.type == "cuda" else {}
    t0 = time.perf_counter()
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30), **kw)
    x = torch.ones(1, device=device)
    dist.all_reduce(x)
    sync(device)
    res: dict[str, Any] = {"backend": backend, "init_and_first_allreduce_s": round(time.perf_counter() - t0, 3),
                           "sum_ok": float(x) == 2.0}
    n = (1 << 24) if device.type == "cuda" else (1 << 20)  # 64 MiB (GPU) or 4 MiB of fp32
    buf = torch.ones(n, device=device)
    for _ in range(2):
        dist.all_reduce(buf)
    sync(device)
    reps, t = 10, time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(buf)
    sync(device)
    sec = (time.perf_counter() - t) / reps
    res.update(bytes=n * 4, allreduce_ms=round(sec * 1e3, 3), bus_gb_s=round(n * 4 / sec / 1e9, 3),  # 2(P-1)/P = 1
               ok=res["sum_ok"])
    out.write_text(json.dumps(res))
    sys.stdout.flush()
    os._exit(0)  # no teardown of the group: its result is written, and a hang there would only cost time


def checkpoint_steps(root: Path) -> list[int]:
    """Steps of the committed checkpoints under ``root`` (<job>/step-<8 digits>/COMMITTED, checkpoint.py)."""
    return sorted(int(p.parent.name[5:]) for p in root.glob("*/step-*/COMMITTED")
                  if re.fullmatch(r"step-\d{8}", p.parent.name))


def read_recovery(run_dir: Path, kill_step: int, workers: int,
                  worlds: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """From the workers' logs (and the launcher's ``worlds``): how the kill was survived, how long it took,
    the slowest rank's timeline, how many steps were lost."""
    logs = {name: records(lines) for name, lines in worker_logs(run_dir).items()}
    kill = [(name, rec) for name, recs in logs.items() for rec in recs
            if rec.get("msg") == "fault injection: SIGKILL self"]
    out: dict[str, Any] = {"killed": kill[0][0] if kill else None}
    if not kill:
        out["outcome"] = "no kill seen"
        return out
    t_kill = _ts(kill[0][1])
    out["checkpoints_before_kill"] = sorted({rec.get("step") for recs in logs.values() for rec in recs
                                             if rec.get("msg") == "checkpoint committed" and _ts(rec) < t_kill})
    after = [(name, rec) for name, recs in logs.items() for rec in recs if _ts(rec) >= t_kill]
    failed = [rec for _, rec in after if rec.get("msg") == "collective failed; waiting for the next world"]
    out["survivor_errors"] = sorted({str(rec.get("error", ""))[:300] for rec in failed})
    joined = [rec for _, rec in after if rec.get("msg") == "joined world"]
    resumed = [rec for _, rec in after if rec.get("msg") == "resumed from checkpoint"]
    recovered = [rec for _, rec in after if rec.get("msg") == "recovered"]
    first = sorted(_ts(rec) for _, rec in after if rec.get("msg") == "first step in world")
    sizes = {rec.get("world_version"): rec.get("size") for rec in joined}
    full = sorted(_ts(rec) for _, rec in after if rec.get("msg") == "first step in world"
                  and sizes.get(rec.get("world_version")) == workers)
    out["sources"] = sorted({str(rec.get("source")) for rec in joined})
    if resumed:
        out["outcome"] = "checkpoint"
    elif recovered or any(rec.get("source") == "peer" for rec in joined):
        out["outcome"] = "in place"
    else:
        out["outcome"] = "not recovered"
    if first:
        out["recovery_s"] = round(first[0] - t_kill, 3)       # kill -> the first step of any rank after it
    if full:
        out["back_to_full_size_s"] = round(full[-1] - t_kill, 3)  # the slowest rank's first step at full size
        out["timeline_s"] = rank_timeline(logs, t_kill, sizes, workers, worlds or [])
    if recovered:
        out["recovered_seconds_logged"] = [rec.get("seconds") for rec in recovered]
    steps_after = [int(rec["step"]) for rec in joined if isinstance(rec.get("step"), int)]
    if steps_after:
        out["resumed_at_step"] = min(steps_after)
        out["steps_lost"] = kill_step - min(steps_after)
    out["worker_errors"] = worker_errors(run_dir, 6)
    return out


MILESTONES = {"collective failed; waiting for the next world": "collective_failed",
              "process group torn down": "group_torn_down", "process group formed": "group_formed",
              "joined world": "state_agreed", "first step in world": "first_step"}


def rank_timeline(logs: dict[str, list[dict[str, Any]]], t_kill: float, sizes: dict[Any, Any], workers: int,
                  worlds: list[dict[str, Any]]) -> dict[str, Any]:
    """The way back after the kill, in seconds since it, from every rank's milestones (MILESTONES) and the
    launcher's first world after the kill: per rank, then as spans. Detection: the first sign, a survivor's
    collective failing or the launcher's world (it sees the process end); abort: the longest teardown of a
    survivor's old group (NCCL: aborted); re-form, state (agreed, and handed over to a newcomer) and first
    step: the slowest rank's, the last to take its first step in the first world at full size."""
    full_versions = {v for v, n in sizes.items() if n == workers}
    ranks: dict[str, dict[str, float]] = {}
    teardown: list[float] = []
    for pod, recs in logs.items():
        marks: dict[str, float] = {}
        for rec in recs:
            key = MILESTONES.get(rec.get("msg", ""))
            if not key or key in marks or _ts(rec) < t_kill:
                continue
            if key == "first_step" and rec.get("world_version") not in full_versions:
                continue  # a first step in a smaller world on the way back
            marks[key] = round(_ts(rec) - t_kill, 3)
            if key == "group_torn_down" and isinstance(rec.get("seconds"), (int, float)):
                teardown.append(float(rec["seconds"]))
        if marks:
            ranks[pod] = marks
    out: dict[str, Any] = {"ranks": ranks}
    published = [w["t"] for w in worlds if w.get("t", 0) >= t_kill]
    if published:
        out["world_published"] = round(published[0] - t_kill, 3)
    back = [pod for pod, m in ranks.items() if "first_step" in m and "group_formed" in m]
    if not back:
        return out
    out["slowest"] = max(back, key=lambda pod: ranks[pod]["first_step"])
    slowest = ranks[out["slowest"]]
    failed = [m["collective_failed"] for m in ranks.values() if "collective_failed" in m]
    signs = failed + ([out["world_published"]] if "world_published" in out else [])
    formed, agreed = slowest["group_formed"], slowest.get("state_agreed", slowest["group_formed"])
    out["spans"] = {"detection": round(min(signs), 3) if signs else None,
                    "abort": round(max(teardown), 4) if teardown else None,
                    "re-form": round(formed - max([out.get("world_published", 0.0)] +
                                                  [m.get("group_torn_down", 0.0) for m in ranks.values()]), 3),
                    "state": round(agreed - formed, 3), "first_step": round(slowest["first_step"] - agreed, 3)}
    return out


def phase_torchrun(ph: Phase) -> None:
    """The recovery phase's kill under torchrun elastic, for the ratio (bench/torchrun_elastic.py)."""
    from cohort.trainer.runtime.ports import free_port

    plan = kill_plan(ph.smoke)
    steps = plan.step + 30  # the restart, its reload and a few steps after it: enough for the figures
    doc = manifest("proof-torchrun", small_lm(ph.smoke, steps))
    path = ph.dir / "manifest.yaml"
    path.write_text(json.dumps(doc, indent=1))
    ck = ph.dir / "checkpoints"
    ck.mkdir(exist_ok=True)
    for old in ck.iterdir():
        old.unlink()
    cmd = torchrun_elastic.command(plan.workers, free_port(), 3, "--device", "cpu" if ph.smoke else "cuda",
                                   "--manifest", str(path), "--ckpt-dir", str(ck), "--every", str(plan.every),
                                   "--kill-step", str(plan.step), "--kill-rank", str(plan.rank), "--steps", str(steps))
    ph.record(workers=plan.workers, kill_step=plan.step, checkpoint_every=plan.every, max_steps=steps, command=cmd)
    timeout = ph.left() - 3
    ph.say(f"torchrun: {' '.join(cmd[3:])} (timeout {timeout:.0f}s)")
    rc, seconds = run_logged(cmd, ph.dir / "torchrun.log", max(timeout, 5),
                             {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    r: dict[str, Any] = {"rc": rc, "timed_out": rc is None, "seconds": seconds}
    ended = f"torchrun {'timed out' if rc is None else 'exited ' + str(rc)}"
    try:
        phases = torchrun_elastic.restart_phases(torchrun_elastic.events(ck), plan.workers)
    except (StopIteration, ValueError, OSError) as e:
        ph.record(ok=False, error=f"{ended}; no restart in its events ({type(e).__name__}: {e})",
                  log_tail=tail(ph.dir / "torchrun.log", 25), **r)
        return
    r.update(restart_phases_s={k: round(v, 3) for k, v in phases.items()}, restart_s=round(phases["total"], 3),
             steps_lost=int(phases["lost"]))
    cohort: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        cohort = json.loads((ph.work / "recovery.json").read_text())
    if cohort.get("back_to_full_size_s") is not None and phases["total"] > 0:
        # both at full size again: Cohort's slowest rank's first step with the spare, torchrun's restarted ranks'
        r["cohort_back_to_full_size_s"] = cohort["back_to_full_size_s"]
        r["cohort_over_torchrun"] = round(cohort["back_to_full_size_s"] / phases["total"], 4)
    ph.record(ok=rc == 0, **r, **({} if rc == 0 else {"error": ended}))


def phase_features(ph: Phase) -> None:
    steps = 20 if ph.smoke else 40
    between_rounds = {"workload": {"evalEverySteps": steps // 2 + 1},
                      "checkpoint": {"everySteps": steps // 2 - 1, "keep": 1}}
    runs: list[tuple[str, dict[str, Any]]] = [
        ("powersgd", {"sync": {"algorithm": "allreduce"}, "compression": {"method": "powersgd", "rank": 2}}),
        # gossip and DiLoCo evaluate and checkpoint the replicas' average mid-run (an allreduce on NCCL, then the
        # average held in the parameters or written into rank 0's state dict), then end as one model
        ("gossip", {"sync": {"algorithm": "gossip", "topology": "ring", "period": 1}, **between_rounds}),
        ("fsdp", {"parallelism": {"strategy": "fsdp"}}),
        ("topk", {"sync": {"algorithm": "allreduce"}, "compression": {"method": "topk", "ratio": 0.01}}),
        # Streaming DiLoCo with its overlap and fp8 outer gradients: each round's all-to-all of e4m3 codes left
        # running on NCCL's stream for a step, then its all-gather; the warm-up's buckets go the same way
        ("diloco-overlap", {"sync": {"algorithm": "localsgd", "period": 8, "warmupSteps": 4, "fragments": 2,
                                     "overlapSteps": 1, "outerOptimizer": {"name": "nesterov"}},
                            "compression": {"method": "fp8"}, **between_rounds}),
    ]
    out: dict[str, Any] = {}
    for i, (tag, spec) in enumerate(runs):  # spec: TrainingJob spec sections; "workload": fields over small_lm's
        left = ph.left()
        if left < 12:
            out[tag] = {"finished": False, "error": "skipped: no time left"}
            continue
        cap = left / (len(runs) - i) if i < len(runs) - 1 else left  # share what is left fairly
        spec = {"checkpoint": {"everySteps": 0}, **spec}
        workload = small_lm(ph.smoke, steps, **spec.pop("workload", {}))
        doc = manifest(f"proof-{tag}", workload, replicas={"min": 1, "max": 2, "target": 2}, **spec)
        res = run_cohort(ph, tag, doc, 2, max(min(cap, 75.0), 10.0) - 2)
        s = res.pop("summary") or {}
        out[tag] = {"finished": res["rc"] == 0 and s.get("step") == steps, "step": s.get("step"),
                    "loss": s.get("loss"), "perplexity": s.get("perplexity"), "seconds": res["seconds"],
                    "step_s_median": s.get("stepSecondsMedian"), "device": s.get("device"), "plan": s.get("plan"),
                    "launcher_sharing": res.get("launcher_sharing")}
        drift = [rec["replica_drift"] for lines in worker_logs(Path(res["run_dir"]) / "run").values()
                 for rec in records(lines) if rec.get("msg") == "evaluated" and "replica_drift" in rec]
        if drift:  # the replicas' average evaluated mid-run: how far each worker's replica was from it
            out[tag]["replica_drift"] = drift
        if not out[tag]["finished"]:
            out[tag]["error"] = ("timed out" if res["timed_out"] else f"exited {res['rc']}")
            out[tag]["launcher_tail"] = res.get("launcher_tail")
            out[tag]["worker_errors"] = res.get("worker_errors")
        ph.record(runs=out)
    unfinished = [f"{k} ({v.get('error')})" for k, v in out.items() if not v.get("finished")]
    ph.record(ok=not unfinished, runs=out, finished={k: v.get("finished") for k, v in out.items()},
              **({"error": "not finished: " + ", ".join(unfinished)} if unfinished else {}))


if __name__ == "__main__":
    sys.exit(main())
