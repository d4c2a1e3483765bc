"""The planner's cost models against values computed by hand for a tiny transformer (unit tests).

The model: dim d=8, 2 layers, 2 heads, ffn hidden f=16, vocab v=16, seq t=4.
  block params   = attention 4d² (256) + w1 d·f+f (144) + w2 f·d+d (136) + 2 LayerNorms 4d (32) = 568
    of which tp splits 256 + 144 + 128 (w2's weight; its bias stays whole) = 528
  embeddings     = v·d + t·d = 128 + 32 = 160 (tp splits the 128 of tok_embeddings)
  norm + output  = 2d + d·v = 16 + 128 = 144 (tp splits output's 128)
  total          = 2·568 + 160 + 144 = 1440
  forward FLOPs per sample: per block t·(2·(4d² + 2df) + 4td) = 4·(1024 + 128) = 4608,
    output t·2dv = 1024; total 2·4608 + 1024 = 10240
  saved activations per sample (bytes): per block t·(4d+4)·4 = 576 plus tp-split t·(4d+h+2f)·4 = 1056;
    last stage t·(2d+2+2v)·4 = 800; a boundary (one TP all-reduce) t·d·4 = 128; logits t·v·4 = 256
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from cohort.trainer.planner import Candidate, format_table, rank_plans
from cohort.trainer.planner.collectives import allgather_time, allreduce_time, fit, fit_all
from cohort.trainer.planner.dims import ParallelDims
from cohort.trainer.planner.hardware import (
    Hardware,
    load_hardware,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_seconds,
    save_hardware,
)
from cohort.trainer.planner.memory import activation_bytes, memory_per_device
from cohort.trainer.planner.profile import transformer_profile
from cohort.trainer.planner.search import enumerate_plans
from cohort.trainer.planner.step_time import step_time
from cohort.trainer.profiling import generic_profile
from cohort.trainer.workloads.models import MLP, DataInfo, Transformer

TINY = dict(dim=8, n_layers=2, n_heads=2, ffn_mult=2, vocab_size=16, seq_len=4)
# Slow, simple hardware so every term is visible; no fixed costs, no shared host.
HW = Hardware(alpha_s=1e-4, beta_s_per_byte=1e-8, device_flops=1e6, memory_bandwidth=1e9, layer_overhead_s=0.0,
              tp_layer_overhead_s=0.0, fsdp_unit_overhead_s=0.0, microbatch_overhead_s=0.0)


@pytest.fixture
def tiny():
    return transformer_profile(**TINY)


def tiny_model(device: str = "cpu") -> Transformer:
    with torch.device(device):
        return Transformer(DataInfo((4,), vocab_size=16, seq_len=4), dim=8, n_layers=2, n_heads=2, ffn_mult=2)


# --- collectives -----------------------------------------------------------------------------------------
def test_allreduce_models_match_ben_nun_hoefler():
    a, b, m, p = 1e-5, 1e-9, 1e6, 4  # log2(4) = 2
    assert allreduce_time(m, p, a, b, "tree") == pytest.approx(2 * 2 * (a + m * b))
    assert allreduce_time(m, p, a, b, "butterfly") == pytest.approx(2 * (a + m * b))
    assert allreduce_time(m, p, a, b, "ring") == pytest.approx(2 * 3 * a + 2 * 3 / 4 * m * b)
    assert allreduce_time(m, p, a, b, "rabenseifner") == pytest.approx(2 * 2 * a + 2 * 3 / 4 * m * b)
    assert allgather_time(m, p, a, b) == pytest.approx(3 * a + 3 / 4 * m * b)
    assert allreduce_time(m, 1, a, b) == 0.0


def test_fit_recovers_alpha_beta_and_the_algorithm():
    a, b = 2e-4, 5e-10
    samples = [(m, p, allreduce_time(m, p, a, b, "tree")) for p in (2, 4, 8) for m in (1e3, 1e5, 1e7)]
    best = fit_all(samples)[0]
    assert best.algorithm == "tree"
    assert best.alpha_s == pytest.approx(a) and best.beta_s_per_byte == pytest.approx(b)
    assert best.rel_rms_error < 1e-9
    ring = fit("ring", [(m, p, allreduce_time(m, p, a, b, "ring")) for p in (2, 4) for m in (1e3, 1e6)])
    assert ring.predict(1e6, 4) == pytest.approx(allreduce_time(1e6, 4, a, b, "ring"))


# --- model profile -----------------------------------------------------------------------------------------
def test_transformer_profile_counts_by_hand(tiny):
    assert (tiny.block_params, tiny.block_params_tp) == (568, 528)
    assert (tiny.first_params, tiny.first_params_tp, tiny.last_params, tiny.last_params_tp) == (160, 128, 144, 128)
    assert tiny.params == 1440
    assert (tiny.block_flops, tiny.last_flops, tiny.forward_flops) == (4608, 1024, 10240)
    assert (tiny.block_act_bytes, tiny.block_act_bytes_tp, tiny.last_act_bytes) == (576, 1056, 800)
    assert (tiny.block_kept_selective, tiny.block_kept_selective_tp) == (384, 800)
    assert (tiny.boundary_bytes, tiny.logits_bytes) == (128, 256)


def test_transformer_profile_agrees_with_the_model_and_flop_counter(tiny):
    assert sum(p.numel() for p in tiny_model().parameters()) == tiny.params
    counter = FlopCounterMode(display=False)
    with counter:  # on meta, attention is counted too (the CPU kernel has no FLOP formula registered)
        tiny_model("meta")(torch.zeros(1, 4, dtype=torch.long, device="meta"))
    assert counter.get_total_flops() == tiny.forward_flops


def test_generic_profile_measures_any_model():
    mlp = MLP(DataInfo((32,), num_classes=4), hidden=64)
    p = generic_profile(mlp, torch.zeros(1, 32))
    assert p.params == 32 * 64 + 64 + 64 * 4 + 4
    assert p.forward_flops == 2 * (32 * 64 + 64 * 4)
    assert not p.supports_tp(2) and not p.supports_pp(2)


# --- memory ----------------------------------------------------------------------------------------------
def test_memory_data_parallel(tiny):
    m = memory_per_device(tiny, ParallelDims(dp=2, dp_mode="ddp"), global_batch=8, optimizer="adamw")
    assert (m.params, m.grads, m.optimizer) == (1440 * 4, 1440 * 4, 2 * 1440 * 4)
    assert m.activations == 4 * (2 * (576 + 1056) + 800)  # 4 samples per rank
    sgd = memory_per_device(tiny, ParallelDims(dp=2, dp_mode="ddp"), global_batch=8, optimizer="sgd", momentum=0.9)
    assert sgd.optimizer == 1440 * 4
    plain = memory_per_device(tiny, ParallelDims(dp=2, dp_mode="ddp"), global_batch=8, optimizer="sgd", momentum=0)
    assert plain.optimizer == 0


def test_memory_fsdp_shards_by_dp_plus_one_gathered_unit(tiny):
    m = memory_per_device(tiny, ParallelDims(dp=2), global_batch=8, optimizer="adamw")
    assert m.params == (1440 / 2 + 568) * 4       # shards + the biggest unit (a block) gathered
    assert m.grads == 1440 / 2 * 4
    assert m.optimizer == 2 * 1440 / 2 * 4
    assert m.activations == 4 * (2 * (576 + 1056) + 800)


def test_memory_tensor_parallel_splits_weights_and_activations(tiny):
    m = memory_per_device(tiny, ParallelDims(tp=2), global_batch=8, optimizer="adamw")
    local = 2 * (568 - 528 + 264) + (160 - 64) + (144 - 64)  # = 784
    assert (m.params, m.grads, m.optimizer) == (local * 4, local * 4, 2 * local * 4)
    assert m.activations == 8 * (2 * (576 + 1056 / 2) + 800)


def test_memory_pipeline_1f1b_vs_gpipe(tiny):
    one = memory_per_device(tiny, ParallelDims(pp=2, microbatches=2, schedule="1f1b"), 8, "adamw")
    # Stage 0 (one block + embeddings = 728 params) holds both microbatches' activations (8 samples).
    assert one.total == 728 * 4 * 4 + 8 * (576 + 1056)
    gpipe = memory_per_device(tiny, ParallelDims(pp=2, microbatches=2, schedule="gpipe"), 8, "adamw")
    # GPipe: the last stage (712 params) holds all 8 samples' activations and logits.
    assert gpipe.total == 712 * 4 * 4 + 8 * (576 + 1056 + 800)


# --- step time -------------------------------------------------------------------------------------------
def test_step_time_data_parallel(tiny):
    t = step_time(tiny, ParallelDims(dp=2, dp_mode="ddp"), global_batch=8, hw=HW, optimizer="adamw")
    assert t.compute == pytest.approx(3 * 10240 * 4 / 1e6)
    assert t.dp == pytest.approx(2 * 1e-4 + 5760 * 1e-8)      # ring allreduce of 1440 fp32 grads, P=2
    assert t.optimizer == pytest.approx(1440 * 4 * 7 / 1e9)   # param r/w, 2 states r/w, grad read
    assert t.bubble == t.tp == t.pp == 0
    assert t.total == pytest.approx(0.12288 + 2.576e-4 + 4.032e-5)


def test_activation_checkpointing_keeps_less_and_full_recomputes_the_blocks(tiny):
    batch = 8
    none, full, selective = (activation_bytes(tiny, ParallelDims(dp=2, ac=ac), 0, batch)
                             for ac in ("none", "full", "selective"))
    per_rank, last = 4, 800
    assert none == per_rank * (2 * (576 + 1056) + last)
    # Kept by each block, and the rest of one block's activations while backward recomputes it.
    assert full == per_rank * (2 * 128 + last) + per_rank * (576 + 1056 - 128)
    assert selective == per_rank * (2 * (384 + 800) + last) + per_rank * (576 + 1056 - 384 - 800)
    assert full < selective < none
    plain, recomputed = (step_time(tiny, ParallelDims(dp=2, ac=ac), batch, HW, "adamw") for ac in ("none", "full"))
    block = 2 * 4608 * per_rank / 1e6                   # one forward of the 2 blocks on this rank's samples
    assert recomputed.compute == pytest.approx(plain.compute + block)
    tp = ParallelDims(tp=2, ac="selective")
    kept = 384 + 800 / 2 + 2 * 128  # with tp, also wo's and w2's all-reduced outputs
    assert activation_bytes(tiny, tp, 0, batch) == 8 * (2 * kept + last) + 8 * (576 + 1056 / 2 - kept)


def test_auto_checkpointing_gives_each_plan_the_least_recomputation_that_fits(tiny):
    ddp = ParallelDims(dp=2, dp_mode="ddp")
    need = {ac: memory_per_device(tiny, replace(ddp, ac=ac), 8, "adamw").total for ac in ("none", "selective", "full")}
    assert need["full"] < need["selective"] < need["none"]

    def ddp_plan(memory: float) -> Candidate:
        hw = Hardware(**{**HW.__dict__, "memory_bytes": memory})
        return next(c for c in rank_plans(2, tiny, hw, global_batch=8, ac="auto") if c.dims.dp_mode == "ddp")
    assert ddp_plan(0).dims.ac == "none"                      # memory not known: nothing to fit
    assert ddp_plan(need["none"]).dims.ac == "none" and not ddp_plan(need["none"]).rejected
    assert ddp_plan(need["none"] - 1).dims.ac == "selective"
    assert ddp_plan(need["selective"] - 1).dims.ac == "full"
    assert ddp_plan(need["full"] - 1).rejected and ddp_plan(need["full"] - 1).dims.ac == "full"
    assert ddp_plan(need["selective"] - 1).dims.describe() == "dp=2 tp=1 pp=1 ddp ac=full"
    fixed = rank_plans(2, tiny, HW, global_batch=8, ac="selective")
    assert {c.dims.ac for c in fixed} == {"selective"}


def test_step_time_fsdp_gathers_twice_and_reduce_scatters(tiny):
    t = step_time(tiny, ParallelDims(dp=2), global_batch=8, hw=HW, optimizer="adamw")
    block, root = 568 * 4, 1440 * 4 - 2 * 568 * 4
    assert t.dp == pytest.approx(sum(3 * (1e-4 + n / 2 * 1e-8) for n in (block, block, root)))


def test_step_time_tensor_parallel(tiny):
    t = step_time(tiny, ParallelDims(tp=2), global_batch=8, hw=HW, optimizer="adamw")
    assert t.compute == pytest.approx(3 * 10240 * 8 / 2 / 1e6)
    ar = 2 * 1e-4 + 8 * 128 * 1e-8                    # all-reduce of 8 samples' activations, P=2
    # 2 blocks x (2 forward + 4 backward), the embedding's, the output's input gradient; the logits gather.
    assert t.tp == pytest.approx(14 * ar + (1e-4 + 8 * 256 / 2 * 1e-8))


def test_step_time_pipeline_bubble(tiny):
    t = step_time(tiny, ParallelDims(pp=2, microbatches=2), global_batch=8, hw=HW, optimizer="adamw")
    last = 3 * (4608 + 1024) * 4 / 1e6                # the last stage is slower (it has the output layer)
    p2p = 2 * (1e-4 + 4 * 128 * 1e-8)
    assert t.compute == pytest.approx(2 * last)
    assert t.pp == pytest.approx(2 * p2p)
    assert t.bubble == pytest.approx(1 * (last + p2p))  # (p - 1) slots
    assert t.bubble / (t.compute + t.bubble + t.pp) == pytest.approx((2 - 1) / (2 + 2 - 1))


def test_shared_host_fills_the_bubble(tiny):
    shared = Hardware(**{**HW.__dict__, "host_flops": 2e6})  # 4 ranks share 2 ranks' worth of compute
    pipe = step_time(tiny, ParallelDims(pp=4 // 2, dp=2, microbatches=2), 8, shared, "adamw")
    assert pipe.bubble == 0
    assert pipe.compute == pytest.approx(3 * 10240 * 8 / 2e6)  # the whole step's FLOPs over the host's


# --- search and report -----------------------------------------------------------------------------------
def test_enumerates_every_split_the_model_allows(tiny):
    plans = {p.describe() for p in enumerate_plans(4, tiny, global_batch=8)}
    assert "dp=4 tp=1 pp=1 ddp" in plans and "dp=4 tp=1 pp=1 fsdp" in plans
    assert "dp=2 tp=2 pp=1 fsdp" in plans
    assert "dp=1 tp=1 pp=2 mb=4 1f1b" not in plans   # 2 x 2 = 4 ranks need dp=1, tp=2 or dp=2
    assert "dp=2 tp=1 pp=2 mb=2 1f1b fsdp" in plans
    assert not any("tp=4" in p for p in plans)        # 4 does not divide the 2 heads
    assert not any("pp=4" in p for p in plans)        # 2 layers cannot make 4 stages


def test_ranks_by_time_and_rejects_over_memory(tiny):
    hw = Hardware(**{**HW.__dict__, "memory_bytes": 30000})
    ranked = rank_plans(2, tiny, hw, global_batch=8, optimizer="adamw")
    ok = [c for c in ranked if not c.rejected]
    bad = [c for c in ranked if c.rejected]
    assert ok and bad and ranked.index(ok[-1]) < ranked.index(bad[0])
    assert [c.time.total for c in ok] == sorted(c.time.total for c in ok)
    assert all(c.memory.total > 30000 for c in bad) and all(c.memory.total <= 30000 for c in ok)
    table = format_table(ranked)
    assert "fastest" in table and "rejected: needs" in table and "vs #1, mostly" in table


def test_the_tables_columns_stay_aligned_under_long_plan_names(tiny):
    """``dp=2 tp=1 pp=1 fsdp ac=selective`` is longer than the plan column's 28 characters: it widens."""
    ranked = rank_plans(2, tiny, HW, global_batch=8, ac="selective")
    assert max(len(c.dims.describe()) for c in ranked) > 28
    lines = format_table(ranked).splitlines()
    end = lines[0].index("step ms") + len("step ms")  # the step time is right-aligned under its header
    assert all(line[end - 1].isdigit() and line[end] == " " for line in lines[2:]), "\n".join(lines)


# --- hardware ------------------------------------------------------------------------------------------
def test_units_parse():
    assert parse_bytes("80GiB") == 80 * 2 ** 30 and parse_bytes("4Gi") == 4 * 2 ** 30
    assert parse_bytes("512MB") == 512e6
    assert parse_bandwidth("100Gbit") == 100e9 / 8 and parse_bandwidth("12.5GB") == 12.5e9
    assert parse_flops("312TFLOPs") == 312e12
    assert parse_seconds("10us") == pytest.approx(1e-5) and parse_seconds("2ms") == pytest.approx(2e-3)
    with pytest.raises(ValueError):
        parse_bytes("lots")


def test_calibration_file_round_trip(tmp_path):
    hw = Hardware(alpha_s=1e-5, lines=(("allreduce", 2, 1e-4, 1e-9),), sync_lines=((2, 3e-4),), host_flops=1e11,
                  block_table=((1e6, 1e-3), (1e8, 1e-2)))
    path = save_hardware(hw, tmp_path / "cal.json", extra={"measurements": {}})
    back = load_hardware(path)
    assert back.with_overrides(source=hw.source) == hw
    assert back.allreduce_s(1000, 2) == pytest.approx(1e-4 + 1e-6 + 3e-4)
    assert back.allgather_s(1000, 2) == pytest.approx((1e-4 + 1e-6) / 2 + 3e-4)  # no allgather line: half
    assert back.block_s(1e7) == pytest.approx(math.sqrt(1e-3 * 1e-2))  # log-log halfway
    assert back.block_s(1e9) == pytest.approx(1e-1)                    # the largest call's throughput
    assert json.loads(path.read_text())["hardware"]["alpha_s"] == 1e-5


# --- cohort plan ---------------------------------------------------------------------------------------
def _manifest(tmp_path, precision="fp32"):
    path = tmp_path / "job.yaml"
    path.write_text(f"""apiVersion: cohort.dev/v1alpha1
kind: TrainingJob
metadata: {{name: big}}
spec:
  workload:
    model: transformer
    modelArgs: {{dim: 1024, n_layers: 8, n_heads: 16}}
    dataset: synthetic-lm
    datasetArgs: {{seq_len: 512, vocab: 8192}}
    maxSteps: 10
    batchSize: 4
    precision: {precision}
    optimizer: {{name: adamw, lr: 0.001}}
""")
    return path


def _cohort(*args):
    return subprocess.run([sys.executable, "-m", "cohort.trainer.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_cohort_plan_prints_a_ranked_table(tmp_path):
    proc = _cohort("plan", str(_manifest(tmp_path)), "--gpus", "8", "--gpu-memory", "1GiB", "--bandwidth",
                   "100Gbit", "--device-flops", "100TFLOPs", "--memory-bandwidth", "2TB", "--calibration",
                   str(save_hardware(Hardware(), tmp_path / "cal.json")))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "fastest" in out and "strategy: auto would run" in out
    assert "rejected: needs" in out  # 1 GiB does not hold the replicated plans
    d, f, v, t = 1024, 4096, 8192, 512
    params = 8 * (4 * d * d + 2 * d * f + f + d + 4 * d) + (v * d + t * d) + (2 * d + d * v)
    assert math.isclose(float(out.split("M parameters")[0].split()[-1]), params / 1e6, abs_tol=0.01)


def test_cohort_plan_says_a_bf16_jobs_memory_is_counted_in_fp32(tmp_path):
    args = ("--gpus", "2", "--calibration", str(save_hardware(Hardware(), tmp_path / "cal.json")))
    bf16 = _cohort("plan", str(_manifest(tmp_path, "bf16")), *args)
    assert bf16.returncode == 0, bf16.stderr
    assert "memory     counted in fp32; this job runs bf16" in bf16.stdout
    fp32 = _cohort("plan", str(_manifest(tmp_path)), *args)
    assert fp32.returncode == 0, fp32.stderr
    assert "counted in fp32" not in fp32.stdout


def test_cohort_plan_refuses_bad_input(tmp_path):
    proc = _cohort("plan", str(_manifest(tmp_path)), "--gpus", "2", "--gpu-memory", "lots")
    assert proc.returncode == 2 and proc.stderr.startswith("error: memory: cannot read 'lots'")
    proc = _cohort("plan", str(_manifest(tmp_path)), "--gpus", "2", "--calibration", str(tmp_path / "none.json"))
    assert proc.returncode == 2 and "cohort calibrate" in proc.stderr


# --- the tp collective counts the step-time model assumes, counted on a real TP model ---------------------
def _count_worker(rank: int, port: int, out) -> None:
    import datetime

    import torch.distributed as dist
    from torch.distributed.tensor.debug import CommDebugMode

    from cohort.trainer.parallel.mesh import build_mesh
    from cohort.trainer.parallel.tensor import apply_tp
    from cohort.trainer.runtime.exit import exit_process
    from cohort.trainer.workloads.workload import cross_entropy

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = apply_tp(tiny_model(), build_mesh(ParallelDims(tp=2), torch.device("cpu"))["tp"])
    x = torch.randint(0, 16, (2, 4))
    fwd, bwd = CommDebugMode(), CommDebugMode()
    with fwd:
        loss = cross_entropy(model(x), x)
    with bwd:
        loss.backward()
    if rank == 0:
        out.put(({str(k): v for k, v in fwd.get_comm_counts().items()},
                 {str(k): v for k, v in bwd.get_comm_counts().items()}))
    dist.destroy_process_group()
    exit_process(0)


@pytest.mark.dist
def test_tensor_parallel_collectives_are_the_ones_costed(tiny):
    import torch.multiprocessing as mp

    from cohort.trainer.runtime.ports import free_port

    out = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_count_worker, args=(free_port(), out), nprocs=2, start_method="spawn")
    fwd, bwd = out.get()
    layers = TINY["n_layers"]
    # Forward: 2 per block + the embedding's all-reduce; the logits' all-gather.
    assert fwd == {"c10d_functional.all_reduce": layers * tiny.tp_allreduces_fwd + 1,
                   "c10d_functional.all_gather_into_tensor": 1}
    # Backward: 4 per block + the output layer's input gradient.
    assert bwd == {"c10d_functional.all_reduce": layers * tiny.tp_allreduces_bwd + 1}
