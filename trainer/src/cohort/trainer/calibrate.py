"""``cohort calibrate``: measure α, β and device throughput on this machine, for the planner.

- α and β: allreduce time against message size for P = 2 and 4 local ranks
  (gloo over loopback, or NCCL when GPUs are present), fitted jointly with
  every allreduce model of planner/collectives.py; the best-fitting model is stored
  as the backend's algorithm.
- device throughput: FLOP/s of a training-sized fp32 matmul in one rank
  (one intra-op thread, as the trainer runs) and in P ranks at once, which
  says how much a host's ranks slow each other down (shared CPU cores).
- memory bandwidth: bytes/s of a large copy (the optimizer update streams).
- fixed costs: a block's forward + backward (eager and under DTensor TP), an
  FSDP unit, a pipeline microbatch, timed on a tiny model in one rank.
- on a shared host (ranks slow each other's matmuls), the allreduce line of
  each P measured while all ranks are busy, and what a collective adds when
  ranks compute between collectives (waiting for a descheduled peer).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .planner.collectives import fit, fit_all
from .planner.hardware import DEFAULT_CALIBRATION, Hardware, save_hardware
from .runtime.exit import exit_process
from .runtime.ports import free_port

SIZES = tuple(4 ** k * 1024 for k in range(0, 7))  # 1 KiB .. 4 MiB, then 16 MiB below
MATMUL = (256, 256, 1024)                           # tokens x dim @ dim x ffn: a block's biggest matmul
BLOCK = {"dim": 256, "n_heads": 4, "ffn_mult": 4, "seq": 32}  # the transformer block the throughput table times


def _backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _run_collective(op: str, t: torch.Tensor, group: Any, p: int) -> None:
    """One collective whose *full* tensor is ``t`` (allgather's output, reduce-scatter's input)."""
    if op == "allreduce":
        dist.all_reduce(t, group=group)
    elif op == "allgather":
        dist.all_gather_into_tensor(t, t[: t.numel() // p].clone(), group=group)
    else:
        dist.reduce_scatter_tensor(t[: t.numel() // p].clone(), t, group=group)


def _allreduce_worker(rank: int, world: int, p: int, port: int, sizes: Sequence[int], reps: int, out: Any,
                      ops: Sequence[str] = ("allreduce",)) -> None:
    torch.set_num_threads(1)
    backend = _backend()
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    # world/p groups of p ranks allreduce at once (all of the host's ranks busy, as in a job's subgroups).
    group = dist.new_subgroups(group_size=p)[0] if p < world else None
    results = []
    for op in ops:
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, device=device)
            times = []
            for i in range(reps + 2):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                _run_collective(op, t, group, p)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                if i >= 2:  # the first two warm up connections and buffers
                    times.append(time.perf_counter() - t0)
            # A collective ends when its slowest rank ends: take the max over ranks of each rank's median.
            med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            results.append((op, nbytes, p, float(med.cpu())))
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()
    exit_process(0)


def measure_allreduce(p: int, world: int | None = None, sizes: Sequence[int] = (*SIZES, 16 * 2 ** 20),
                      reps: int = 7) -> list[tuple]:
    """(bytes, P, seconds) for an allreduce of each size among ``p`` local ranks.

    ``world`` > p runs world/p groups at once (the time of the slowest group).
    """
    return [(m, q, t) for _, m, q, t in measure_collectives(p, world, sizes, reps)]


COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")


def measure_collectives(p: int, world: int | None = None, sizes: Sequence[int] = (*SIZES, 16 * 2 ** 20),
                        reps: int = 7, ops: Sequence[str] = ("allreduce",)) -> list[tuple]:
    """(op, bytes, P, seconds) for each collective and size among ``p`` ranks (world/p groups at once)."""
    world = world or p
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_allreduce_worker, args=(world, p, free_port(), list(sizes), reps, out, tuple(ops)),
                       nprocs=world, start_method="spawn")
    return out.get()


def group_line(samples: Sequence[tuple]) -> tuple[float, float]:
    """The least-squares line t = a + b·m (relative error) through one P's (bytes, P, seconds) samples."""
    fitted = fit("ring", samples)  # at one P every model is the same line, rescaled
    p = samples[0][1]
    return fitted.alpha_s * 2 * (p - 1), fitted.beta_s_per_byte * 2 * (p - 1) / p


def _sync_worker(rank: int, world: int, p: int, port: int, rounds: int, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_subgroups(group_size=p)[0] if p < world else None
    m, k, n = MATMUL
    a, b, token = torch.randn(m, k), torch.randn(k, n), torch.zeros(1)
    penalties = []
    for _ in range(3):
        elapsed = {}
        for mode in ("compute", "sync"):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(rounds):
                a @ b
                a @ b
                if mode == "sync":
                    dist.all_reduce(token, group=group)
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            elapsed[mode] = float(t)
        penalties.append(max(0.0, (elapsed["sync"] - elapsed["compute"]) / rounds))
    if rank == 0:
        out.put(statistics.median(penalties))
    dist.destroy_process_group()
    exit_process(0)


def measure_sync(p: int, world: int, rounds: int = 40) -> float:
    """Seconds one tiny collective among ``p`` ranks adds when ranks compute between collectives.

    On dedicated devices this is about α. When ranks share cores, a peer is
    often descheduled when a collective starts, and waiting for it costs a
    slice of the OS scheduler's time; it is measured, not assumed.
    """
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_sync_worker, args=(world, p, free_port(), rounds, out), nprocs=world, start_method="spawn")
    return out.get()


def _time_steps(step: Any, reps: int = 15) -> float:
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return min(times)  # the least disturbed run: other processes on the host only ever add time


def _overhead_worker(rank: int, port: int, out: Any) -> None:
    """Fixed costs of the framework, timed on a tiny transformer in a 1-rank world (FLOPs ~ 0)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from .parallel.fsdp import apply_fsdp
    from .parallel.tensor import apply_tp
    from .workloads.models import DataInfo, Transformer
    from .workloads.workload import cross_entropy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    info = DataInfo((4,), vocab_size=8, seq_len=4)
    x, y = torch.randint(0, 8, (2, 4)), torch.randint(0, 8, (2, 4))

    def fwd_bwd(model: torch.nn.Module) -> Any:
        return lambda: cross_entropy(model(x), y).backward()

    def per_layer(make: Any) -> float:
        return (_time_steps(fwd_bwd(make(6))) - _time_steps(fwd_bwd(make(2)))) / 4

    def model(layers: int) -> Transformer:
        torch.manual_seed(0)
        return Transformer(info, dim=8, n_layers=layers, n_heads=2, ffn_mult=2)

    mesh = init_device_mesh("cpu", (1,))
    plain = per_layer(model)
    tp = per_layer(lambda n: apply_tp(model(n), mesh))
    fsdp_unit = (_time_steps(fwd_bwd(apply_fsdp(model(4), mesh))) - _time_steps(fwd_bwd(model(4)))) / 5

    def pipeline_step(m: int) -> float:
        stage = PipelineStage(model(2), 0, 1, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, m, loss_fn=cross_entropy)
        xs, ys = x.repeat(m, 1), y.repeat(m, 1)
        return _time_steps(lambda: schedule.step(xs, target=ys))

    per_microbatch = (pipeline_step(8) - pipeline_step(1)) / 7 - _time_steps(fwd_bwd(model(2)))

    # A real block (BLOCK: dim 256) at growing batch: seconds per forward+backward against its FLOPs. Small
    # calls run far below matmul peak (fixed costs, elementwise ops, small matrices); the planner
    # interpolates this table at each plan's per-call FLOPs (microbatch size, tp split).
    from .planner.profile import transformer_profile
    from .workloads.models import Block

    torch.manual_seed(0)
    dim, heads, ffn, seq = BLOCK["dim"], BLOCK["n_heads"], BLOCK["ffn_mult"], BLOCK["seq"]
    block = Block(dim, heads, ffn)
    per_sample = 3 * transformer_profile(dim, 1, heads, ffn, 64, seq).block_flops
    table = []
    for batch in (1, 2, 4, 8, 16, 32, 64):
        h = torch.randn(batch, seq, dim, requires_grad=True)
        table.append((per_sample * batch, _time_steps(lambda h=h: block(h).sum().backward(), reps=7)))
    out.put({"block_table": tuple(table), "layer_overhead_s": max(plain, 0.0), "tp_layer_overhead_s": max(tp, 0.0),
             "fsdp_unit_overhead_s": max(fsdp_unit, 0.0), "microbatch_overhead_s": max(per_microbatch, 0.0)})
    dist.destroy_process_group()
    exit_process(0)


def measure_overheads() -> dict[str, float]:
    """Seconds of fixed cost per block forward+backward (eager, under TP), per FSDP unit, per microbatch."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_overhead_worker, args=(free_port(), out), nprocs=1, start_method="spawn")
    return out.get()


def _mesh_overhead_worker(rank: int, world: int, port: int, out: Any) -> None:
    """Per-block time of FSDP2 and of DTensor TP over ``world`` ranks, on a tiny transformer (FLOPs ~ 0)."""
    from torch.distributed.device_mesh import init_device_mesh

    from .parallel.fsdp import apply_fsdp
    from .parallel.tensor import apply_tp
    from .workloads.models import DataInfo, Transformer
    from .workloads.workload import cross_entropy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    info = DataInfo((4,), vocab_size=8, seq_len=4)
    x, y = torch.randint(0, 8, (2, 4)), torch.randint(0, 8, (2, 4))

    def model(layers: int) -> Transformer:
        torch.manual_seed(0)
        return Transformer(info, dim=8, n_layers=layers, n_heads=4, ffn_mult=2)

    def per_block(wrap: Any) -> float:
        def step(m: torch.nn.Module) -> Any:
            return lambda: cross_entropy(m(x), y).backward()
        return (_time_steps(step(wrap(model(6)))) - _time_steps(step(wrap(model(2))))) / 4

    times = torch.tensor([per_block(lambda m: apply_fsdp(m, mesh)), per_block(lambda m: apply_tp(m, mesh))],
                         dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(times.tolist())
    dist.destroy_process_group()
    exit_process(0)


def measure_mesh_overheads(world: int) -> tuple[float, float]:
    """Seconds per block of (FSDP2 unit, DTensor TP block) forward+backward over ``world`` ranks, tiny model."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_mesh_overhead_worker, args=(world, free_port(), out), nprocs=world, start_method="spawn")
    fsdp, tp = out.get()
    return fsdp, tp


def _matmul_worker(rank: int, seconds: float, start: Any, out: Any) -> None:
    torch.set_num_threads(1)
    m, k, n = MATMUL
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    start.wait()  # every rank loops at the same time, or the shared-host number is too high
    count, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        count += 1
    out.put(2 * m * k * n * count / (time.perf_counter() - t0))


def measure_flops(ranks: int = 1, seconds: float = 1.0) -> float:
    """Mean FLOP/s of one rank while ``ranks`` ranks run the same matmul loop at once."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_matmul_worker, args=(seconds, ctx.Barrier(ranks), out), nprocs=ranks,
                       start_method="spawn")
    return statistics.mean(out.get() for _ in range(ranks))


def measure_memory_bandwidth(nbytes: int = 64 * 2 ** 20, reps: int = 5) -> float:
    """Bytes/s of reading and writing a large buffer once (copy_), one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
        dst.copy_(src)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        return 2 * nbytes / statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def calibrate(ps: Sequence[int] = (2, 4), log: Any = print) -> tuple[Hardware, dict[str, Any]]:
    """Measure everything; returns the Hardware and the raw measurements (what the file stores)."""
    top = max(ps)
    log("matmul throughput, 1 rank and " + " and ".join(f"{p} ranks at once" for p in ps) + " ...")
    single = measure_flops(1)
    shared = {p: measure_flops(p) for p in ps}
    host = shared[top] * top if shared[top] < 0.9 * single else 0.0  # ranks slow each other: a shared host
    isolated: list[tuple] = []
    busy: list[tuple] = []
    for p in ps:
        log(f"allreduce, allgather, reduce-scatter among {p} ranks ({_backend()}) ...")
        isolated += measure_collectives(p, ops=COLLECTIVES)
        if host and p < top:
            # On a shared host, a job's subgroups run side by side: measure them that way for the planner.
            log(f"... and among {p} ranks while {top} ranks are busy ...")
            busy += measure_collectives(p, world=top, ops=COLLECTIVES)
        else:
            busy += [s for s in isolated if s[2] == p]
    samples = [(m, q, t) for op, m, q, t in isolated if op == "allreduce"]
    fits = fit_all(samples)
    best = fits[0]
    lines = tuple((op, p, *group_line([(m, q, t) for o, m, q, t in busy if o == op and q == p]))
                  for op in COLLECTIVES for p in ps)
    if host:
        log("synchronisation cost while ranks compute ...")
        syncs = tuple((p, measure_sync(p, top)) for p in ps)
    else:
        syncs = ()
    log("transformer block throughput and fixed costs per layer, FSDP unit and microbatch ...")
    overheads: dict[str, Any] = measure_overheads()
    blocks = overheads.pop("block_table")
    # The one-rank numbers miss what only happens with peers (FSDP's copy-in/out around real collectives,
    # DTensor's redistributions); time both over `top` ranks and keep what their collectives' latency
    # (already in the measured lines) does not explain.
    fsdp_block, tp_block = measure_mesh_overheads(top)
    latency = {op: a for op, p, a, _ in lines if p == top}
    overheads["fsdp_unit_overhead_s"] = max(overheads["fsdp_unit_overhead_s"], fsdp_block - overheads[
        "layer_overhead_s"] - 2 * latency["allgather"] - latency["reduce_scatter"])
    overheads["tp_layer_overhead_s"] = max(overheads["tp_layer_overhead_s"], tp_block - 6 * latency["allreduce"])
    hw = Hardware(alpha_s=best.alpha_s, beta_s_per_byte=best.beta_s_per_byte, allreduce=best.algorithm,
                  lines=lines, sync_lines=syncs, block_table=blocks, device_flops=single, host_flops=host,
                  memory_bandwidth=measure_memory_bandwidth(), source="cohort calibrate", **overheads)
    raw = {"backend": _backend(), "allreduce_samples": samples, "collective_samples": isolated,
           "collective_samples_busy": busy,
           "fits": [{"algorithm": f.algorithm, "alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte,
                     "rel_rms_error": f.rel_rms_error} for f in fits],
           "flops_alone": single, "flops_shared": {str(p): v for p, v in shared.items()},
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return hw, raw


def run(out: str | None = None, log: Any = print) -> Path:
    hw, raw = calibrate(log=log)
    return save_hardware(hw, out or DEFAULT_CALIBRATION, extra={"measurements": raw})
