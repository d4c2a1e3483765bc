"""Communication: what each sync x compression pair sends, and what it costs in time (a benchmark).

    python bench/comm.py [--nets loopback,1gbit,100mbit] [--pairs allreduce:topk,gossip:none,...]
    (a pair's sync may name local SGD's outer optimizer, fragments, overlap and mixing: --pairs
    localsgd/nesterov:none, localsgd/nesterov/f4/o1/m0.5:none; --period N sets every gossip and local-SGD
    pair's sync.period)
                         [--worlds 2,4,8] [--skip-bytes] [--skip-train] [--skip-straggler] [--repeats N]

1. Bytes (the same Cohort code on a gloo group, P ranks, the digits MLP of
   examples/digits.yaml), per rank and step, as the kernel counts them: each P
   runs in a network namespace of its own (``unshare --net``; needs root), so
   its loopback's tx_bytes is everything the ranks sent, TCP/IP headers, ACKs
   and gloo's framing included. Beside it, Cohort's own count
   (``cohort_bytes_sent_total``: the payload formula of the collective it uses,
   ring allreduce 2(P-1)/P n, allgather (P-1) k, gossip one message per
   neighbour), and the payload ratio (dense fp32 bytes / payload bytes).
   Steady state: the first steps (PowerSGD's dense warm-up, gossip's dense
   first exchange, local SGD's warm-up) are left out.
2. Training (4 workers, examples/digits.yaml, 30 epochs): time per step and
   time to 95% test accuracy, on loopback, and with every worker in its own
   network namespace behind a veth pair rate-limited by tc (tbf) to 1 Gbit/s
   and 100 Mbit/s each way. Set up and torn down here; needs root. If the
   kernel refuses, the exact error is printed instead of numbers. The kernel's
   own count of bytes each worker sent (veth tx_bytes) is shown beside it.
   Then the same for a communication-bound variant (MLP hidden 2048, 153,610
   parameters, 10 epochs), where the network, not compute, sets the pace.
   ``--gpt``: the same comparison on examples/gpt-text.yaml (a 1.86 M-parameter
   GPT on the Python standard library's source, AdamW, a fixed global batch of
   64), evaluated every 20 steps: time to a validation loss of GPT_TARGET
   nats per token. Compression settings come from TUNED; the optimizer stays
   the example's (pairs whose method needs SGD's momentum at 0 are left out).
3. A straggler (COHORT_FAULT_SLOW: rank 3 computes 3x slower from step 0),
   loopback: aggregate throughput (sum over ranks of samples/s, each rank's
   step time) kept against the same run unslowed, for gossip and allreduce.

Ratios are against dense allreduce (compression none) from the same invocation.
``--repeats N`` runs the training and straggler measurements N times, in rounds
(every pair once per round, each ratio against its own round's baseline), and
gives the median and [min-max]; every table names the host's load at its start
and end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from cohort.api.models import SUPPORTED_COMPRESSION

REPO = Path(__file__).resolve().parents[1]
# Every pair the API supports (SUPPORTED_COMPRESSION: the one declaration of them).
ALL_PAIRS = [(sync, method) for sync, methods in SUPPORTED_COMPRESSION.items() for method in methods]
# The manifest settings trainer/tests/test_convergence.py uses (docs/algorithms.md): one home, there.
sys.path.insert(0, str(REPO / "trainer/tests"))
sys.path.insert(0, str(REPO))
from test_convergence import TUNED  # noqa: E402

from bench.netcount import quiet_tx_bytes  # noqa: E402
from bench.stats import host, spread  # noqa: E402

RATES = {"1gbit": "1gbit", "100mbit": "100mbit"}
WORKERS = 4


PERIOD: int | None = None  # --period: every gossip and local-SGD pair's sync.period, in place of TUNED's


def sync_section(sync: str, method: str) -> dict[str, Any]:
    """``spec.sync`` of a pair, with its TUNED settings. ``localsgd/nesterov`` (or ``/sgd``) is local SGD with
    that outer optimizer (``sync.outerOptimizer``, its defaults otherwise); a further ``/f4`` sets
    ``sync.fragments`` to 4, ``/o1`` ``sync.overlapSteps`` to 1 and ``/m0.5`` ``sync.mixing`` to 0.5."""
    algorithm, *extras = sync.split("/")
    section = {"algorithm": algorithm, **TUNED.get((algorithm, method), {}).get("sync", {})}
    if PERIOD and algorithm != "allreduce":
        section["period"] = PERIOD
    for extra in extras:
        if extra[:1] == "f" and extra[1:].isdigit():
            section["fragments"] = int(extra[1:])
        elif extra[:1] == "o" and extra[1:].isdigit():
            section["overlapSteps"] = int(extra[1:])
        elif extra[:1] == "m" and extra[1:].replace(".", "", 1).isdigit():
            section["mixing"] = float(extra[1:])
        else:
            section["outerOptimizer"] = {"name": extra}
    return section


def manifest(sync: str, method: str, hidden: int | None = None, **workload: Any) -> dict[str, Any]:
    """examples/digits.yaml with this pair (and its TUNED settings); ``hidden`` widens the MLP."""
    m = yaml.safe_load((REPO / "examples/digits.yaml").read_text())
    tuned = TUNED.get((sync, method), {})
    m["metadata"] = {"name": f"bench-{sync.replace('/', '-')}-{method}"}
    m["spec"]["sync"] = sync_section(sync, method)
    m["spec"]["compression"] = {"method": method, **tuned.get("compression", {})}
    m["spec"]["workload"]["optimizer"] = {**m["spec"]["workload"]["optimizer"], **tuned.get("optimizer", {})}
    m["spec"]["checkpoint"] = {"everySteps": 0}
    m["spec"]["workload"].update(workload)
    if hidden:
        m["spec"]["workload"]["modelArgs"] = {"hidden": hidden}
    return m


GPT_TARGET = 5.2  # validation loss (nats/token): dense allreduce reached it at step 110 of 300 (2026-11-27)
GPT_EVAL_EVERY = 20
GPT_SKIP = {"dgc", "signum"}  # their momentum is the optimizer's: admission requires SGD with momentum 0


GPT_DATA = Path(os.environ.get("COHORT_DATA_DIR") or Path.home() / ".cache/cohort/data")


def prepare_gpt_data() -> None:
    """The token shards, prepared before any run is timed (the workers then find them cached)."""
    from cohort.trainer.workloads.python_source import prepare

    args = gpt_manifest("allreduce", "none")["spec"]["workload"]["datasetArgs"]
    prepare(vocab_size=args["vocab_size"], cache_dir=str(GPT_DATA))


def gpt_manifest(sync: str, method: str) -> dict[str, Any]:
    """examples/gpt-text.yaml with this pair's sync and compression settings (TUNED), evaluated often."""
    m = yaml.safe_load((REPO / "examples/gpt-text.yaml").read_text())
    tuned = TUNED.get((sync, method), {})
    m["metadata"] = {"name": f"bench-gpt-{sync.replace('/', '-')}-{method}"}
    m["spec"]["sync"] = sync_section(sync, method)
    m["spec"]["compression"] = {"method": method, **tuned.get("compression", {})}
    m["spec"]["checkpoint"] = {"everySteps": 0}
    m["spec"]["workload"]["evalEverySteps"] = GPT_EVAL_EVERY
    return m


# --- 1. bytes per step: the kernel's count, beside Cohort's own ---------------------------

def _bytes_worker(rank: int, world: int, port: int, pairs: list[tuple[str, str]], out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from cohort.api.jobconfig import from_manifest
    from cohort.trainer.runtime.exit import exit_process
    from cohort.trainer.sync.base import CommStats, SyncContext
    from cohort.trainer.sync.registry import SYNCS
    from cohort.trainer.workloads.models import MLP, DataInfo

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    kernel = os.environ.get("COHORT_BENCH_NETNS") == "1"

    def window_start() -> int:
        dist.barrier()
        start = quiet_tx_bytes(still_s=0.1) if kernel and rank == 0 else 0
        dist.barrier()  # nobody sends until rank 0 has read the counter
        return start

    def window_end(start: int) -> int:
        dist.barrier()
        net = quiet_tx_bytes(still_s=0.1) - start if kernel and rank == 0 else 0
        dist.barrier()  # nobody starts the next pair (its set-up talks) until rank 0 has read the counter
        return net

    empty = window_end(window_start())  # the windows' own barriers, subtracted from every pair
    rows: dict[str, Any] = {"_barriers": empty}
    warm, measured = 6, 8
    for sync_name, method in pairs:
        m = manifest(sync_name, method)
        m["spec"]["sync"]["warmupSteps"] = 2  # local SGD's warm-up before the measured steps
        spec = from_manifest(m).spec
        ctx = SyncContext(rank, world, spec, CommStats())
        sync = SYNCS[spec.sync.algorithm](ctx)
        torch.manual_seed(0)
        model = MLP(DataInfo((1, 8, 8), num_classes=10))
        module = sync.wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        snap, start = None, 0
        for step in range(warm + measured):
            if step == warm:
                start = window_start()
                snap = (ctx.stats.bytes_sent, ctx.stats.payload_bytes, ctx.stats.dense_bytes)
            opt.zero_grad()
            F.cross_entropy(module(torch.rand(32, 1, 8, 8, generator=g)), torch.randint(0, 10, (32,), generator=g)
                            ).backward()
            opt.step()
            sync.after_step(module, step + 1)
        if hasattr(sync, "settle"):
            sync.settle(model)
        assert snap is not None
        wire, payload, dense = (b - a for a, b in zip(snap, (ctx.stats.bytes_sent, ctx.stats.payload_bytes,
                                                            ctx.stats.dense_bytes), strict=True))
        counted = [None] * world
        dist.all_gather_object(counted, wire)  # Cohort's count, mean over ranks (as the kernel's is)
        net = window_end(start) - empty
        rows[f"{sync_name}:{method}"] = {"wire": sum(counted) / world / measured, "payload": payload / measured,
                                         "dense": dense / measured,
                                         "kernel": net / world / measured if kernel else None}
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    exit_process(0)


def _bytes_main(world: int, pairs: list[tuple[str, str]], out: str) -> int:
    """Inside ``unshare --net``: bring the loopback up and run the ranks there."""
    import torch.multiprocessing as mp

    up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if up.returncode != 0:
        print(f"cannot bring up the namespace's loopback: {up.stderr.strip()}", file=sys.stderr)
        return 1
    os.environ["COHORT_BENCH_NETNS"] = "1"
    mp.start_processes(_bytes_worker, args=(world, 29660, pairs, out), nprocs=world, start_method="spawn")
    return 0


def measure_bytes(world: int, pairs: list[tuple[str, str]]) -> dict[str, dict[str, float]]:
    """Each world size in a network namespace of its own (``unshare --net``, needs root)."""
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "bytes.json")
        cmd = ["unshare", "--net", sys.executable, __file__, "--bytes-worker", str(world), "--out", out,
               "--pairs", ",".join(f"{s}:{m}" for s, m in pairs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd[:3])} ...` failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return json.loads(Path(out).read_text())


# --- 2. training runs, on loopback or behind rate-limited links ------------------------

class Network:
    """One network namespace per worker, each behind a veth pair to a bridge in a hub namespace.

    With ``rate`` set, tc's token bucket (tbf) limits both directions of every
    worker's link. ``error`` holds the kernel's exact refusal, if any.
    """

    PREFIX = "cohortb"

    def __init__(self, workers: int, rate: str | None):
        self.workers, self.rate = workers, rate
        self.error: str | None = None
        self.hub = f"{self.PREFIX}-hub"
        self.spaces = [f"{self.PREFIX}-w{i}" for i in range(workers)]
        self.ips = [f"10.213.0.{i + 1}" for i in range(workers)]

    def _run(self, *cmd: str) -> None:
        p = subprocess.run(list(cmd), capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({p.returncode}): {p.stderr.strip()}")

    def __enter__(self) -> Network:
        self.teardown()  # leftovers of an interrupted run
        try:
            self._run("ip", "netns", "add", self.hub)
            self._run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            self._run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i, (ns, ip) in enumerate(zip(self.spaces, self.ips, strict=True)):
                host, inner = f"{self.PREFIX}h{i}", f"{self.PREFIX}n{i}"
                self._run("ip", "netns", "add", ns)
                self._run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
                self._run("ip", "link", "set", host, "netns", self.hub)
                self._run("ip", "link", "set", inner, "netns", ns)
                self._run("ip", "-n", self.hub, "link", "set", host, "master", "br0", "up")
                self._run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inner)
                self._run("ip", "-n", ns, "link", "set", inner, "up")
                self._run("ip", "-n", ns, "link", "set", "lo", "up")
                if self.rate:
                    # A small bucket (about 1 ms at the rate, at least 10 packets) so that
                    # a step's messages cannot slip through as one burst at memory speed.
                    burst = max(15_000, _bits(self.rate) // 8 // 1000)
                    for space, dev in ((ns, inner), (self.hub, host)):
                        self._run("ip", "netns", "exec", space, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                                  "rate", self.rate, "burst", str(burst), "latency", "100ms")
        except (RuntimeError, OSError) as e:
            self.error = str(e)
        return self

    def tx_bytes(self, i: int) -> int:
        p = subprocess.run(["ip", "netns", "exec", self.spaces[i], "cat",
                            f"/sys/class/net/{self.PREFIX}n{i}/statistics/tx_bytes"], capture_output=True, text=True)
        return int(p.stdout.strip() or 0)

    def teardown(self) -> None:
        for ns in [*self.spaces, self.hub]:  # deleting a namespace deletes its veth ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def __exit__(self, *exc: Any) -> None:
        self.teardown()


def _bits(rate: str) -> int:
    units = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    for suffix, mult in units.items():
        if rate.endswith(suffix):
            return int(float(rate[: -len(suffix)]) * mult)
    return int(rate)


@dataclass
class Run:
    accuracy: float | None = None
    eval_loss: float | None = None
    step_ms: float | None = None
    t_target_s: float | None = None
    steps: int = 0
    sps: list[float] = field(default_factory=list)  # each rank's samples/s (trainer's EMA)
    wall_s: float = 0.0
    tx_bytes: list[int] = field(default_factory=list)
    error: str = ""


def _ts(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def train(m: dict[str, Any], net: Network | None, env: dict[str, str] | None = None, timeout_s: float = 600,
          reached: Callable[[dict[str, Any]], bool] = lambda rec: (rec.get("accuracy") or 0.0) >= 0.95) -> Run:
    """Start the workers by hand (what the local launcher does), each in its namespace when ``net`` is given."""
    from cohort.api.jobconfig import from_manifest

    cfg = from_manifest(m)
    run_dir = Path(tempfile.mkdtemp(prefix="cohort-bench-"))
    ips = net.ips if net else [f"127.77.{os.getpid() % 250}.{10 + i}" for i in range(WORKERS)]
    (run_dir / "job.json").write_text(json.dumps(cfg.to_document()))
    world = {"version": 1, "members": [{"rank": r, "pod": f"w{r}", "ip": ip} for r, ip in enumerate(ips)],
             "master": {"addr": ips[0], "port": cfg.rendezvous_port}, "spares": [], "reason": "bench"}
    (run_dir / "world.json").write_text(json.dumps(world))
    tx0 = [net.tx_bytes(i) for i in range(WORKERS)] if net else []
    procs = []
    t0 = time.monotonic()
    for r, ip in enumerate(ips):
        wenv = {**os.environ, "COHORT_WORLD": f"file:{run_dir / 'world.json'}", "COHORT_POD_NAME": f"w{r}",
                "COHORT_POD_IP": ip, "COHORT_JOB_NAME": cfg.name, "COHORT_NAMESPACE": "default",
                "COHORT_CONFIG": str(run_dir / "job.json"), "COHORT_TERMINATION_LOG": str(run_dir / f"w{r}.term"),
                "COHORT_PATH_MAP": json.dumps({cfg.spec.checkpoint.path: str(run_dir / "ckpt")}),
                "OMP_NUM_THREADS": "1", **(env or {})}
        cmd = [sys.executable, "-m", "cohort.trainer.cli", "train", "--config", str(run_dir / "job.json")]
        if net:
            cmd = ["ip", "netns", "exec", net.spaces[r], *cmd]
            # gloo binds to the address the hostname resolves to (loopback here) unless told the interface.
            wenv["GLOO_SOCKET_IFNAME"] = f"{Network.PREFIX}n{r}"
        with open(run_dir / f"w{r}.log", "w") as log:
            procs.append(subprocess.Popen(cmd, env=wenv, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    run = Run()
    try:
        for p in procs:
            p.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {timeout_s:.0f}s"
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the worker's own session: only what this run started
                p.wait()
    run.wall_s = time.monotonic() - t0
    if net:
        run.tx_bytes = [net.tx_bytes(i) - tx0[i] for i in range(WORKERS)]
    if any(p.returncode != 0 for p in procs) and not run.error:
        bad = next(r for r, p in enumerate(procs) if p.returncode != 0)
        run.error = f"worker {bad} exited {procs[bad].returncode}: " + \
            " | ".join((run_dir / f"w{bad}.log").read_text().splitlines()[-3:])[-400:]
    _parse(run_dir, run, reached)
    if not run.error:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        run.error += f" (logs: {run_dir})"
    return run


def _parse(run_dir: Path, run: Run, reached: Callable[[dict[str, Any]], bool]) -> None:
    joined, evals, last = None, [], None
    for line in (run_dir / "w0.log").read_text().splitlines() if (run_dir / "w0.log").exists() else []:
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if rec.get("msg") == "joined world" and joined is None:
            joined = _ts(rec["ts"])
        elif rec.get("msg") == "evaluated":
            evals.append((_ts(rec["ts"]), rec, rec.get("step")))
    for r in range(WORKERS):
        term = run_dir / f"w{r}.term"
        if term.exists():
            summary = json.loads(term.read_text())
            run.sps.append(summary.get("samplesPerSecond") or 0.0)
            if r == 0:
                run.accuracy, run.steps = summary.get("accuracy"), summary.get("step", 0)
                run.eval_loss = summary.get("eval_loss")
    if joined is not None and evals:
        last = evals[-1]
        run.step_ms = 1000 * (last[0] - joined) / max(1, last[2] or 1)
        hit = next((t for t, rec, _ in evals if reached(rec)), None)
        run.t_target_s = None if hit is None else hit - joined


# --- tables ------------------------------------------------------------------------------

def times(ratios: list[float]) -> str:
    """A ratio cell: the spread with an "x", or "-" when no run could be compared."""
    return f"{spread(ratios)}x" if ratios else "-"


def fmt(v: float | None, spec: str = ".2f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def bytes_table(pairs: list[tuple[str, str]], worlds: list[int]) -> None:
    measured = {w: measure_bytes(w, pairs) for w in worlds}
    dense = {w: measured[w]["allreduce:none"]["kernel"] for w in worlds}
    print("\n### Bytes per rank per step, as the kernel counts them (digits MLP, 9610 parameters = 38440 dense "
          "fp32 bytes)\n")
    print("Each P in a network namespace of its own: its loopback's tx_bytes over 8 steps, divided by P and the "
          "steps, less the measuring window's own barriers ("
          + ", ".join(f"P={w}: {measured[w]['_barriers'] / w:,.0f} B per rank" for w in worlds)
          + "). In parentheses: Cohort's count (`cohort_bytes_sent_total`, the mean over ranks).\n")
    head = "| pair | payload B per vector | payload ratio | " + " | ".join(
        f"kernel B P={w} (Cohort) | kernel / Cohort P={w} | vs dense P={w}" for w in worlds) + " |"
    print(head)
    print("|" + "---|" * (3 + 3 * len(worlds)))
    for sync, method in pairs:
        row = measured[worlds[0]][f"{sync}:{method}"]
        ratio = row["dense"] / row["payload"] if row["payload"] else None
        per_vector = 4 * 9610 / ratio if ratio else 0.0  # a gossip step sends one vector per neighbour
        cells = []
        for w in worlds:
            r = measured[w][f"{sync}:{method}"]
            cells += [f"{r['kernel']:,.0f} ({r['wire']:,.0f})", fmt(r["kernel"] / r["wire"] if r["wire"] else None,
                                                                   ".2f"),
                      fmt(dense[w] / r["kernel"] if r["kernel"] else None, ".1f") + "x"]
        print(f"| {sync} {method} | {per_vector:,.0f} | {fmt(ratio, '.1f')}x | " + " | ".join(cells) + " |")
    if not {"allreduce:topk", "allreduce:signsgd"} <= set(measured[worlds[0]]):
        return  # --pairs left out a pair the targets are stated for
    topk, sign = measured[worlds[0]]["allreduce:topk"], measured[worlds[0]]["allreduce:signsgd"]
    print(f"\nTargets (payload ratios, no framing): topk(1%) {topk['dense'] / topk['payload']:.1f}x (>= 40x: "
          f"{'met' if topk['dense'] / topk['payload'] >= 40 else 'MISSED'}); signsgd "
          f"{sign['dense'] / sign['payload']:.1f}x (>= 30x: {'met' if sign['dense'] / sign['payload'] >= 30 else 'MISSED'}).")


def train_tables(pairs: list[tuple[str, str]], nets: list[str], hidden: int | None = None,
                 epochs: int | None = None, gpt: bool = False, repeats: int = 1) -> None:
    results: dict[str, dict[tuple[str, str], list[Run]]] = {}
    errors: dict[str, str] = {}
    hosts: dict[str, tuple[str, str]] = {}
    for name in nets:
        print(f"  [{time.strftime('%H:%M:%S')}] network {name}", file=sys.stderr, flush=True)
        if name != "loopback" and name not in RATES:
            raise SystemExit(f"--nets: unknown network {name!r}; known: loopback, {', '.join(RATES)}")
        net_ctx = Network(WORKERS, RATES[name]) if name != "loopback" else None
        if net_ctx:
            net_ctx.__enter__()
            if net_ctx.error:
                errors[name] = net_ctx.error
                net_ctx.teardown()
                continue
        try:
            results[name] = {p: [] for p in pairs}
            before = host()
            # Rounds: every pair once per round, so a drift in the host's speed reaches every pair alike,
            # and each round's dense run is the baseline of that round's ratios.
            for _ in range(repeats):
                for sync, method in pairs:
                    if gpt:
                        run = train(gpt_manifest(sync, method), net_ctx, timeout_s=1500,
                                    env={"COHORT_DATA_DIR": str(GPT_DATA)},
                                    reached=lambda rec: (rec.get("eval_loss") or 99.0) <= GPT_TARGET)
                    else:
                        run = train(manifest(sync, method, hidden, **({"epochs": epochs} if epochs else {})),
                                    net_ctx)
                    results[name][(sync, method)].append(run)
                    print(f"    {sync}:{method} acc={run.accuracy} loss={run.eval_loss} t={run.t_target_s} "
                          f"wall={run.wall_s:.0f} {run.error}", file=sys.stderr, flush=True)
            hosts[name] = (before, host())
        finally:
            if net_ctx:
                net_ctx.teardown()
    for name in nets:
        model = f"MLP hidden {hidden}, {epochs} epochs" if hidden else "examples/digits.yaml"
        if gpt:
            model = f"examples/gpt-text.yaml (1.86 M parameters), time to validation loss <= {GPT_TARGET}"
        print(f"\n### Training, 4 workers, {name}, {model}\n")
        if name in errors:
            print(f"Not measured: the kernel refused the network set-up:\n\n    {errors[name]}")
            continue
        print(f"{repeats} run(s) per pair, in rounds of every pair; the median and [min-max] over the runs. "
              f"Ratios are taken within a round (against that round's dense allreduce), then summarised. "
              + (f"sync.period {PERIOD} for gossip and local SGD (--period). " if PERIOD else "") +
              f"Host at the start: {hosts[name][0]}; at the end: {hosts[name][1]}.\n")
        base = results[name].get(("allreduce", "none"), [])
        kernel = name != "loopback"
        quality, reach = ("final validation loss", f"time to loss {GPT_TARGET} (s)") if gpt \
            else ("accuracy", "time to 95% (s)")
        print(f"| pair | {quality} | ms/step | vs dense | {reach} | vs dense |" +
              (" kernel tx B/step (rank 0) |" if kernel else ""))
        print("|---|---:|---:|---:|---:|---:|" + ("---:|" if kernel else ""))
        best: list[tuple[float, tuple[str, str]]] = []
        for (sync, method), runs in results[name].items():
            ok = [r for r in runs if not r.error]
            if not ok:
                print(f"| {sync} {method} | error: {runs[0].error} |")
                continue
            rounds = [(r, b) for r, b in zip(runs, base, strict=False) if not r.error and not b.error]
            rel_step = [r.step_ms / b.step_ms for r, b in rounds if r.step_ms and b.step_ms]
            rel_target = [r.t_target_s / b.t_target_s for r, b in rounds if r.t_target_s and b.t_target_s]
            reached = [r.t_target_s for r in ok if r.t_target_s is not None]
            target = spread(reached) if len(reached) == len(ok) else \
                ("not reached" if not reached else f"{spread(reached)} ({len(reached)} of {len(ok)} reached)")
            qual = [q for q in ((r.eval_loss if gpt else r.accuracy) for r in ok) if q is not None]
            tx = f" {spread([r.tx_bytes[0] / max(r.steps, 1) for r in ok if r.tx_bytes], ',.0f')} |" if kernel else ""
            print(f"| {sync} {method} | {spread(qual, '.4f')} | {spread([r.step_ms for r in ok if r.step_ms], '.1f')} | "
                  f"{times(rel_step)} | {target} | {times(rel_target)} |{tx}")
            if method != "none" and rel_target and len(reached) == len(ok):
                best.append((statistics.median(rel_target), (sync, method)))
        if best:
            ratio, (sync, method) = min(best)
            print(f"\nBest compressed: {sync} {method}, time to target {ratio:.2f}x dense allreduce's (median of "
                  f"the rounds' ratios)" + (" (target at 100mbit: <= 0.5x)" if name == "100mbit" else "") + ".")


def straggler_table(repeats: int = 1) -> None:
    # Compute must dominate a step for "3x slower compute" to mean a 3x slower worker: a wider
    # MLP and a larger batch than examples/digits.yaml (whose steps are mostly fixed overhead).
    workload = {"epochs": 0, "maxSteps": 150, "batchSize": 256, "evalEveryEpochs": 0}
    slow = {"COHORT_FAULT_SLOW": f"rank={WORKERS - 1},factor=3,step=0"}
    before = host()
    runs: dict[str, list[tuple[Run, Run]]] = {"gossip": [], "allreduce": []}
    for _ in range(repeats):  # unslowed and slowed back to back, each sync in turn: pairs share the host's state
        for sync in runs:
            m = manifest(sync, "none", 1024, **workload)  # evaluations are sync points: only at the end
            runs[sync].append((train(m, None), train(m, None, env=slow)))
    print("\n### One worker 3x slower (COHORT_FAULT_SLOW=rank=3,factor=3,step=0), loopback, "
          "MLP hidden 1024, batch 256, 150 steps\n")
    print(f"{repeats} pair(s) of runs (unslowed, then slowed) per sync; the median and [min-max] over the pairs; "
          f"\"kept\" is taken within a pair. Host at the start: {before}; at the end: {host()}.\n")
    print("| sync | samples/s unslowed | samples/s with straggler | kept | fast ranks' steps/s kept | "
          "job wall s unslowed | with straggler |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    # Aggregate throughput: each rank's batch / its mean step time, summed (sps is global: P x batch / step).
    agg = lambda r: sum(s / WORKERS for s in r.sps)  # noqa: E731 - a one-line definition reads best here
    fast = lambda r: sum(r.sps[:-1])  # noqa: E731
    for sync, pairs in runs.items():
        ok = [(b, h) for b, h in pairs if not b.error and not h.error]
        if not ok:
            print(f"| {sync} | error: {next(b.error or h.error for b, h in pairs)} |")
            continue
        print(f"| {sync} | {spread([agg(b) for b, _ in ok], ',.0f')} | {spread([agg(h) for _, h in ok], ',.0f')} | "
              f"{spread([agg(h) / agg(b) for b, h in ok])}x | {spread([fast(h) / fast(b) for b, h in ok])}x | "
              f"{spread([b.wall_s for b, _ in ok], '.1f')} | {spread([h.wall_s for _, h in ok], '.1f')} |")
    print("\nTarget: gossip keeps >= 0.8x of its unslowed throughput.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="loopback,1gbit,100mbit")
    ap.add_argument("--pairs", default="", help="sync:method,... (default: every supported pair)")
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--skip-bytes", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--skip-straggler", action="store_true")
    ap.add_argument("--bytes-worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--wide-nets", default="loopback,100mbit",
                    help="networks for a second, communication-bound pass (MLP hidden 2048, 10 epochs); '' skips it")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per pair in the training and straggler tables (rounds; the median and range)")
    ap.add_argument("--gpt", default="", help="networks for the GPT pass (examples/gpt-text.yaml), e.g. "
                                             "'100mbit'; '' skips it")
    ap.add_argument("--period", type=int, default=0,
                    help="sync.period of every gossip and local-SGD pair (default: TUNED's, docs/algorithms.md)")
    args = ap.parse_args()
    global PERIOD
    PERIOD = args.period or None
    # A stopped run (SIGTERM, as timeout(1) sends) unwinds like Ctrl-C: the finally blocks tear the
    # network namespaces and the workers down (SIGTERM's default would skip them and leave both behind).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pairs = [tuple(p.split(":")) for p in args.pairs.split(",")] if args.pairs else ALL_PAIRS
    if args.bytes_worker:
        return _bytes_main(args.bytes_worker, pairs, args.out)
    if ("allreduce", "none") not in pairs:
        pairs = [("allreduce", "none"), *pairs]  # the baseline every ratio is against
    print(f"## Communication ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, "
          f"load average {os.getloadavg()[0]:.1f} at start)")
    if not args.skip_bytes:
        bytes_table(pairs, [int(w) for w in args.worlds.split(",")])
    if not args.skip_train:
        nets, wide = [n for n in args.nets.split(",") if n], [n for n in args.wide_nets.split(",") if n]
        if nets:
            train_tables(pairs, nets, repeats=args.repeats)
        if wide:
            train_tables(pairs, wide, hidden=2048, epochs=10, repeats=args.repeats)
    if args.gpt:
        prepare_gpt_data()
        train_tables([p for p in pairs if p[1] not in GPT_SKIP], [n for n in args.gpt.split(",") if n], gpt=True,
                     repeats=args.repeats)
    if not args.skip_straggler:
        straggler_table(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
