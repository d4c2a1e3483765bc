"""Sync algorithms and DDP compression hooks on real gloo process groups (2-4 ranks on CPU).

Each test spawns its ranks once and checks several configurations inside, to
keep process start-up (importing torch) from dominating the run time.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_ranks import job_spec, run_ranks
from torch.nn.utils import parameters_to_vector

from cohort.trainer.commit import StepDiscarded
from cohort.trainer.compression.base import CompressedAllgather, kept
from cohort.trainer.compression.fp8 import FP8
from cohort.trainer.compression.registry import build_method
from cohort.trainer.compression.sparse_allreduce import sparse_allreduce
from cohort.trainer.sampler import ElasticSampler
from cohort.trainer.state import TrainState
from cohort.trainer.sync.allreduce import AllreduceSync
from cohort.trainer.sync.base import CommStats, SyncContext, allgather_bytes, ring_allreduce_bytes
from cohort.trainer.sync.gossip import GossipSync
from cohort.trainer.sync.gossip_exchange import HEADER_BYTES
from cohort.trainer.sync.localsgd import LocalSGDSync, carried_state
from cohort.trainer.workloads.datasets import digits
from cohort.trainer.workloads.models import MLP, DataInfo

pytestmark = pytest.mark.dist

INFO = DataInfo((1, 8, 8), num_classes=10)
N_PARAMS = 9610  # MLP(hidden=128) on 8x8 digits
HOOK_METHODS = ["none", "fp16", "bf16", "fp8", "powersgd", "topk", "randomk", "qsgd", "terngrad", "signsgd",
                "dgc", "threshold", "natural", "onebit", "signum"]
GOSSIP_METHODS = ["none", "fp16", "bf16", "fp8", "topk", "randomk", "qsgd", "terngrad", "signsgd"]


def fp8_mean(vectors: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """What FP8Mean must give every rank from the ranks' vectors: part j of each (the vector cut in P parts, the
    last padded with zeros) rounded by fp8's codec, the P of them summed in rank order in fp32 and divided by P,
    that rounded again, the parts put back together (torchft's allreduce_quantized, without its collectives)."""
    codec, world, n = FP8(), len(vectors), vectors[0].numel()
    part = -(-n // world)
    padded = [F.pad(v, (0, world * part - n)) for v in vectors]
    means = []
    for j in range(world):
        total = torch.zeros(part)
        for v in padded:
            total += codec.decode(codec.encode(v[j * part:(j + 1) * part]), part)
        means.append(codec.decode(codec.encode(total.div_(world)), part))
    return torch.cat(means)[:n]


def fp8_mean_bytes(numel: int, world: int) -> tuple[int, int]:
    """(wire, payload) bytes of one rank's FP8Mean of ``numel`` entries: an all-to-all and an all-gather, each
    sending P - 1 parts of ceil(numel / P) bytes and a 4-byte scale per chunk of up to 512."""
    part = -(-numel // world)
    encoded = part + 4 * -(-part // min(512, part))
    return 2 * (world - 1) * encoded, world * encoded


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def gather(x: torch.Tensor, world: int) -> torch.Tensor:
    out = torch.empty(world * x.numel(), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out.view(world, -1)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.rand(32, 1, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)


# --- allreduce: DDP hooks ---------------------------------------------------------

def _hooks(rank: int, world: int) -> dict:
    out = {}
    for method in HOOK_METHODS:
        spec = job_spec(method=method)
        ctx = SyncContext(rank, world, spec, CommStats())
        torch.manual_seed(0)
        model = MLP(INFO)
        reference = MLP(INFO)
        reference.load_state_dict(model.state_dict())
        sync = AllreduceSync(ctx)
        ddp = sync.wrap(model)
        steps = 3 if method == "powersgd" else 1  # PowerSGD's first two iterations are plain allreduce
        for step in range(steps):
            ddp.zero_grad()
            x, y = batch(rank, step)
            F.cross_entropy(ddp(x), y).backward()
            sync.after_step(ddp, step)  # as the trainer does (dense DDP counts its bytes here)
        reference.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        local = flat_grad(reference)  # this rank's own gradient, never communicated
        result = {"hook": flat_grad(model), "all_local": gather(local, world), "bytes": ctx.stats.bytes_sent,
                  "payload": ctx.stats.payload_bytes, "dense": ctx.stats.dense_bytes}
        if method == "fp8":
            result["expected"] = fp8_mean(result["all_local"])
        elif method not in ("none", "fp16", "bf16", "powersgd"):
            # What the hook must produce: the mean of every rank's decoded payload (same seeds);
            # signum: their majority vote. At the first step dgc's and signum's memories change
            # nothing that is sent (dgc: v = u = g; signum: m = (1 - beta) g, whose sign is g's).
            comp = build_method(spec.compression)
            seeds = CompressedAllgather(ctx, comp, None)
            decoded = [comp.roundtrip(result["all_local"][r], seeds.seed(0, r))[1] for r in range(world)]
            result["expected"] = torch.stack(decoded).mean(0)
            if method == "signum":
                result["expected"] = torch.stack(decoded).sum(0).sign()
            result["payload_nbytes"] = comp.payload_nbytes(N_PARAMS)
        out[method] = result
    return out


def powersgd_bytes(world: int, rank: int = 2) -> int:
    """PowerSGD's wire bytes for one compressed step of the MLP, from its shapes (not from the code under test)."""
    uncompressed = 128 + 10                     # biases are vectors: sent as they are
    ps, qs = 128 * rank + 10 * rank, 64 * rank + 128 * rank  # fc1.weight 128x64, fc2.weight 10x128
    return sum(ring_allreduce_bytes(4 * k, world) for k in (uncompressed, ps, qs))


@pytest.fixture(scope="module")
def hook_results() -> list[dict]:
    return run_ranks(_hooks, 4)


@pytest.mark.parametrize("method", HOOK_METHODS)
def test_ddp_hook_averages_gradients(hook_results, method):
    """none: exact mean; fp16 within 2e-3 and bf16 within 2e-2 of the largest |mean| entry; fp8 the
    quantised reduce-scatter's mean of the ranks' gradients bit for bit (fp8_mean);
    powersgd: the same on every rank; compact compressors: identical on every rank and equal
    (to 1e-6) to the mean of each rank's decoded payload (signum: exactly their majority vote)."""
    ranks = [r[method] for r in hook_results]
    mean = ranks[0]["all_local"].mean(0)
    got = ranks[0]["hook"]
    for r in ranks[1:]:
        # PowerSGD's small allreduces may sum in a different order per rank (gloo's algorithm
        # choice), so its ranks agree to rounding; every other method agrees bit for bit.
        tol = 1e-6 * float(got.abs().max()) if method == "powersgd" else 0.0
        torch.testing.assert_close(r["hook"], got, atol=tol, rtol=0)
    assert torch.isfinite(got).all()
    scale = float(mean.abs().max())
    if method == "none":
        torch.testing.assert_close(got, mean, atol=1e-6, rtol=0)
    elif method == "fp16":
        assert float((got - mean).abs().max()) <= 2e-3 * scale
    elif method == "bf16":
        assert float((got - mean).abs().max()) <= 2e-2 * scale
    elif method == "fp8":
        assert torch.equal(got, ranks[0]["expected"])
        # Each rank's entry within 2^-4 of itself, the sum's over P within 2^-4 of it, and below e4m3's normal
        # range half a subnormal step of 2^-10 x each chunk's scale; the chunks' peaks bound those scales.
        local = ranks[0]["all_local"]
        bound = 2.0**-4 * (local.abs().mean(0) * (1 + 2.0**-4) + mean.abs()) + 2 * 2.0**-10 * float(local.abs().max()) / 448
        assert ((got - mean).abs() <= bound).all()
    elif method != "powersgd":
        torch.testing.assert_close(got, ranks[0]["expected"], atol=1e-6, rtol=0)
    if method == "signum":  # a vote, not a mean: every coordinate is -1, 0 (a 2-2 tie) or +1
        assert set(got.unique().tolist()) <= {-1.0, 0.0, 1.0}


def test_powersgd_is_a_rank_r_projection_of_the_true_mean(hook_results):
    """At its first compressed step (no error fed back yet), PowerSGD (Vogels et al. 2019,
    Alg. 1) returns, for each weight matrix M (the true mean over ranks), P P^T M with P
    orthonormal of rank r = 2: so the result has rank <= 2, is an orthogonal projection
    (||M - out||^2 + ||out||^2 = ||M||^2), is no better than the best rank-2 approximation
    (Eckart-Young), and (one power iteration from a random start) keeps at least 70 % of the
    energy that best approximation keeps (measured: 79 % for fc1, 95 % for fc2). Biases travel uncompressed: exact means."""
    r0 = hook_results[0]["powersgd"]
    mean, got = r0["all_local"].mean(0).double(), r0["hook"].double()
    offset = 0
    for p in MLP(INFO).parameters():
        m_true, out = (v[offset:offset + p.numel()].view(p.shape[0], -1) for v in (mean, got))
        offset += p.numel()
        energy = float(m_true.pow(2).sum())
        if p.dim() == 1:
            torch.testing.assert_close(out, m_true, atol=1e-6 * float(m_true.abs().max()), rtol=0)
            continue
        s = torch.linalg.svdvals(out)
        assert float(s[2:].max()) <= 1e-4 * float(s[0]), s[:4]
        err = float((m_true - out).pow(2).sum())
        assert err + float(out.pow(2).sum()) == pytest.approx(energy, rel=1e-4)
        best = torch.linalg.svdvals(m_true).pow(2)
        assert err >= float(best[2:].sum()) * (1 - 1e-4)
        assert float(out.pow(2).sum()) >= 0.7 * float(best[:2].sum()), (float(out.pow(2).sum()), best[:2])


def _per_tensor_topk(rank: int, world: int) -> dict:
    spec = job_spec(method="topk", perTensor=True, errorFeedback=False)
    ctx = SyncContext(rank, world, spec, CommStats())
    torch.manual_seed(0)
    model, reference = MLP(INFO), MLP(INFO)
    reference.load_state_dict(model.state_dict())
    sync = AllreduceSync(ctx)
    ddp = sync.wrap(model)
    x, y = batch(rank, 0)
    F.cross_entropy(ddp(x), y).backward()
    F.cross_entropy(reference(x), y).backward()
    return {"hook": flat_grad(model), "all_local": gather(flat_grad(reference), world),
            "payload": ctx.stats.payload_bytes, "wire": ctx.stats.bytes_sent}


def test_per_tensor_topk_hook_averages_each_ranks_per_tensor_selection():
    """compression.perTensor through DDP: every rank ends with the mean of every rank's
    per-tensor top-1% (selection per tensor does not depend on how DDP buckets them), and
    the payload holds ceil(1%) of each of the MLP's four tensors: 82 + 2 + 13 + 1 entries."""
    results = run_ranks(_per_tensor_topk, 4)
    sizes = [p.numel() for p in MLP(INFO).parameters()]
    comp = build_method(job_spec(method="topk", perTensor=True).compression).layout(sizes)
    local = results[0]["all_local"]
    expected = torch.stack([comp.roundtrip(local[r], 0)[1] for r in range(4)]).mean(0)
    for r in results:
        torch.testing.assert_close(r["hook"], expected, atol=1e-6, rtol=0)
        assert r["payload"] == 8 * (82 + 2 + 13 + 1) == comp.payload_nbytes(N_PARAMS)
        assert r["wire"] == allgather_bytes(r["payload"], 4)


SPARSE_CASES = {  # name: (n, k, fraction of k every rank shares)
    "same support": (10_000, 100, 1.0),
    "half shared": (10_000, 100, 0.5),
    "disjoint": (10_000, 100, 0.0),
    "filled": (1_000, 400, 0.0),  # the summed shares are denser than 50 %: they travel dense
}


def _sparse_sums(rank: int, world: int) -> dict:
    out = {}
    for name, (n, k, shared_fraction) in SPARSE_CASES.items():
        shared = torch.randperm(n, generator=torch.Generator().manual_seed(99))[:int(k * shared_fraction)]
        taken = set(shared.tolist())
        rest = torch.tensor([i for i in torch.randperm(n, generator=torch.Generator().manual_seed(rank)).tolist()
                             if i not in taken][: k - shared.numel()], dtype=torch.int64)
        idx = torch.cat([shared, rest])
        vals = torch.randn(k, generator=torch.Generator().manual_seed(1000 + rank))
        done = sparse_allreduce(idx, vals, n, rank, world)
        out[name] = {"total": done.total, "wire": done.wire_bytes, "dense_shares": done.dense_shares,
                     "all": gather(torch.zeros(n).index_put_((idx,), vals), world)}
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_sparse_allreduce_sums_exactly_and_its_bytes_follow_the_overlap(world):
    """Every rank gets the same sum (bit for bit) as a dense sum of the ranks' sparse vectors.
    Bytes (Cohort's count of what this rank handed to gloo): with one shared support, from
    P = 4 below the allgather of the same top-k; never above a dense ring allreduce; and a range filled
    past 50 % travels dense."""
    results = run_ranks(_sparse_sums, world)
    for name, (n, k, _) in SPARSE_CASES.items():
        want = results[0][name]["all"].sum(0)
        for r in results:
            assert torch.equal(r[name]["total"], results[0][name]["total"]), name
            torch.testing.assert_close(r[name]["total"], want, atol=1e-5, rtol=0)
            assert r[name]["wire"] <= ring_allreduce_bytes(4 * n, world), (name, r[name]["wire"])
        wires = [r[name]["wire"] for r in results]
        if name == "same support" and world > 2:  # at P = 2 both send k pairs (plus 24 header bytes)
            assert max(wires) < allgather_bytes(8 * k, world), wires
        if name == "filled":
            assert results[0][name]["dense_shares"] == world
        else:
            assert results[0][name]["dense_shares"] == 0


def _sparse_vs_allgather(rank: int, world: int) -> dict:
    out = {}
    for collective in ("allgather", "sparse"):
        ctx = SyncContext(rank, world, job_spec(method="topk", collective=collective), CommStats())
        torch.manual_seed(0)
        sync = AllreduceSync(ctx)
        ddp = sync.wrap(MLP(INFO))
        for step in range(3):  # error feedback carries residuals from step to step
            ddp.zero_grad()
            x, y = batch(rank, step)
            F.cross_entropy(ddp(x), y).backward()
        out[collective] = {"grad": flat_grad(ddp.module), "wire": ctx.stats.bytes_sent}
    return out


def test_sparse_collective_ddp_hook_gives_the_allgather_hooks_gradients():
    """compression.collective sparse through DDP on 4 ranks, 3 steps with error feedback: the
    same averaged gradient as the allgather of top-k payloads (to float rounding: the sums run
    in a different order), identical on every rank."""
    results = run_ranks(_sparse_vs_allgather, 4)
    for r in results:
        torch.testing.assert_close(r["sparse"]["grad"], r["allgather"]["grad"], atol=1e-6, rtol=1e-5)
        assert torch.equal(r["sparse"]["grad"], results[0]["sparse"]["grad"])


def _late_peer(rank: int, world: int) -> dict:
    """Each top-k collective through DDP, rank 1 joining every bucket's collective 0.6 s late: how long
    rank 0's hook took to return, and whether its future was still open then."""
    import cohort.trainer.compression.cyclic_topk as cyclic
    import cohort.trainer.compression.global_topk as global_
    import cohort.trainer.compression.sparse_allreduce as sparse

    out = {}
    for collective, module, name in (("sparse", sparse, "sparse_allreduce_hook"), ("cyclic", cyclic, "cyclic_topk_hook"),
                                     ("global", global_, "global_topk_hook")):
        real, seen = getattr(module, name), []

        def spy(state, bucket, real=real, seen=seen):
            if rank == 1:
                time.sleep(0.6)
            t0 = time.perf_counter()
            fut = real(state, bucket)
            seen.append((time.perf_counter() - t0, fut.done()))
            return fut
        setattr(module, name, spy)
        try:
            ctx = SyncContext(rank, world, job_spec(method="topk", collective=collective), CommStats())
            torch.manual_seed(0)
            ddp = AllreduceSync(ctx).wrap(MLP(INFO))
            x, y = batch(rank, 0)
            F.cross_entropy(ddp(x), y).backward()
        finally:
            setattr(module, name, real)
        out[collective] = {"seen": seen, "grad": flat_grad(ddp.module)}
    return out


def test_top_k_collectives_return_ddp_a_future_and_communicate_off_the_backward_pass():
    """Issue 32 item 6: the sparse, cyclic and global collectives ran inside the hook, so backward waited for
    each bucket's communication. With a peer 0.6 s late, rank 0's hook must return at once with its future
    still open (it was 0.6 s and done before), and the gradients still agree on both ranks."""
    results = run_ranks(_late_peer, 2)
    for collective, r in results[0].items():
        assert r["seen"] and all(took < 0.3 and not done for took, done in r["seen"]), (collective, r["seen"])
        assert torch.equal(r["grad"], results[1][collective]["grad"]), collective


@pytest.mark.parametrize("method", HOOK_METHODS)
def test_ddp_hook_counts_bytes_for_the_collective_used(hook_results, method):
    world, n = 4, N_PARAMS
    stats = hook_results[1][method]
    expected = {
        "none": (ring_allreduce_bytes(4 * n, world), 4 * n),
        "fp16": (ring_allreduce_bytes(2 * n, world), 2 * n),
        "bf16": (ring_allreduce_bytes(2 * n, world), 2 * n),
        "fp8": fp8_mean_bytes(n, world),
        "powersgd": (2 * ring_allreduce_bytes(4 * n, world) + powersgd_bytes(world),
                     2 * 4 * n + 4 * (138 + 276 + 384)),
    }
    if method in expected:
        wire, payload = expected[method]
    else:
        wire, payload = allgather_bytes(stats["payload_nbytes"], world), stats["payload_nbytes"]
    assert stats["bytes"] == wire
    assert stats["payload"] == payload
    assert stats["dense"] == 4 * n * (3 if method == "powersgd" else 1)


MEMORY_METHODS = ["dgc", "signum", "threshold", "onebit", "topk"]
PARAM_SIZES = [p.numel() for p in MLP(INFO).parameters()]


def _spied_steps(ctx: SyncContext, module, hook_name: str, rank: int, world: int, steps: int = 4) -> dict:
    """``steps`` steps through DDP with fixed parameters (no optimizer), so each step's gradients are
    known: the hook's results, every rank's own gradients (gathered on every rank), and the order of
    the parameters in the (single) bucket at each step, recorded by a spy around ``module.hook_name``."""
    torch.manual_seed(0)
    model, reference = MLP(INFO), MLP(INFO)
    reference.load_state_dict(model.state_dict())
    position = {p.data_ptr(): i for i, p in enumerate(model.parameters())}
    orders: list[list[int]] = []
    real_hook = getattr(module, hook_name)

    def spy(state, bucket):
        orders.append([position[p.data_ptr()] for p in bucket.parameters()])
        return real_hook(state, bucket)
    setattr(module, hook_name, spy)
    try:
        ddp = AllreduceSync(ctx).wrap(model)
        hooks, locals_ = [], []
        for step in range(steps):
            ddp.zero_grad()
            reference.zero_grad()
            x, y = batch(rank, step)
            F.cross_entropy(ddp(x), y).backward()
            F.cross_entropy(reference(x), y).backward()
            hooks.append(flat_grad(model))
            locals_.append(gather(flat_grad(reference), world))
    finally:
        setattr(module, hook_name, real_hook)
    return {"hook": hooks, "all_local": locals_, "orders": orders}


def _memories(rank: int, world: int) -> dict:
    """4 steps of each memory method (see :func:`_spied_steps`)."""
    import cohort.trainer.compression.base as base
    return {method: _spied_steps(SyncContext(rank, world, job_spec(method=method), CommStats()),
                                 base, "compressed_allgather_hook", rank, world)
            for method in MEMORY_METHODS}


def to_bucket(v: torch.Tensor, order: list[int]) -> torch.Tensor:
    parts = v.split(PARAM_SIZES)
    return torch.cat([parts[i] for i in order])


def from_bucket(b: torch.Tensor, order: list[int]) -> torch.Tensor:
    parts = dict(zip(order, b.split([PARAM_SIZES[i] for i in order]), strict=True))
    return torch.cat([parts[i] for i in range(len(PARAM_SIZES))])


def replay(method: str, result: dict, memory: bool, reset_on_reorder: bool) -> list[torch.Tensor]:
    """What the hook must return at each step, computed from every rank's own gradients."""
    comp = build_method(job_spec(method=method).compression)
    memories, previous, out = [comp.memory(True) for _ in range(4)], None, []
    for step, order in enumerate(result["orders"]):
        if reset_on_reorder and previous is not None and order != previous:
            memories = [comp.memory(True) for _ in range(4)]
        previous = order
        sent = []
        for r in range(4):
            g = to_bucket(result["all_local"][step][r], order)
            x = memories[r].compensate(0, g) if memory else g
            decoded = comp.roundtrip(x, 0)[1]  # none of these methods draws anything
            if memory:
                memories[r].update(0, x, decoded)
            sent.append(decoded)
        out.append(from_bucket(comp.combine(torch.stack(sent).sum(0), 4), order))
    return out


@pytest.fixture(scope="module")
def memory_results() -> list[dict]:
    return run_ranks(_memories, 4)


@pytest.mark.parametrize("method", MEMORY_METHODS)
def test_ddp_hook_carries_each_methods_memory_across_steps_and_resets_it_when_ddp_reorders_the_bucket(
        memory_results, method):
    """4 steps on 4 ranks: the hook's result equals what each rank's own memory (DGC's momentum
    correction, Signum's momentum, error feedback) sends, combined (mean; signum: majority vote),
    so the hook keeps that state per bucket from step to step. DDP rebuilds its bucket after the
    first step with the tensors in reverse order (same index, same size): the memory must restart
    then, since its entries belong to the old order. Controls: no memory at all, and a memory
    carried over the reorder, both differ from the hook's result."""
    result = memory_results[0][method]
    orders = result["orders"]
    assert len(orders) == 4 and orders[1] != orders[0] and orders[1:] == [orders[1]] * 3, orders
    expected = replay(method, result, memory=True, reset_on_reorder=True)
    for step in range(4):
        for r in memory_results:
            torch.testing.assert_close(r[method]["hook"][step], expected[step], atol=1e-6, rtol=0)
    for control in (replay(method, result, memory=False, reset_on_reorder=True),
                    replay(method, result, memory=True, reset_on_reorder=False)):
        assert any(not torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(control, expected, strict=True))


def _cyclic(rank: int, world: int) -> dict:
    """4 steps of compression.collective cyclic (see :func:`_spied_steps`), and the bytes it counted."""
    import cohort.trainer.compression.cyclic_topk as cyclic
    ctx = SyncContext(rank, world, job_spec(method="topk", collective="cyclic"), CommStats())
    return {**_spied_steps(ctx, cyclic, "cyclic_topk_hook", rank, world), "bytes": ctx.stats.bytes_sent}


def replay_cyclic(result: dict, leaders: list[int], memory: bool = True) -> list[torch.Tensor]:
    """CLT-k written from ScaleCom's definition: at each step the leader's top-k (by magnitude, of its
    error-compensated gradient) picks the indices; the update is the mean of every rank's compensated
    values there; each rank's residual is its compensated vector off those indices."""
    k = kept(N_PARAMS, 0.01)
    residual, previous, out = [torch.zeros(N_PARAMS) for _ in range(4)], None, []
    for step, order in enumerate(result["orders"]):
        if previous is not None and order != previous:  # DDP rebuilt the bucket: the residuals restart
            residual = [torch.zeros(N_PARAMS) for _ in range(4)]
        previous = order
        x = [to_bucket(result["all_local"][step][r], order) + (residual[r] if memory else 0) for r in range(4)]
        chosen = torch.topk(x[leaders[step]].abs(), k).indices
        update = torch.zeros(N_PARAMS)
        update[chosen] = torch.stack([v[chosen] for v in x]).mean(0)
        for r in range(4):
            residual[r] = x[r].clone()
            residual[r][chosen] = 0
        out.append(from_bucket(update, order))
    return out


def test_cyclic_collective_sends_the_cycling_leaders_top_k_with_every_ranks_values():
    """compression.collective cyclic on 4 ranks, 4 steps through DDP: every rank's gradient equals an
    independent replay of CLT-k with the leader cycling 0, 1, 2, 3 (one bucket), error feedback included
    and restarted when DDP reorders the bucket. Controls: a fixed leader, and no error feedback, both differ.
    Bytes: per step the k indices' broadcast (mean share) and the k values' ring allreduce."""
    results = run_ranks(_cyclic, 4)
    result = results[0]
    assert len(result["orders"]) == 4 and result["orders"][1] != result["orders"][0], result["orders"]
    expected = replay_cyclic(result, leaders=[0, 1, 2, 3])
    for step in range(4):
        assert int((expected[step] != 0).sum()) == kept(N_PARAMS, 0.01)
        for r in results:
            torch.testing.assert_close(r["hook"][step], expected[step], atol=1e-6, rtol=0)
    for control in (replay_cyclic(result, leaders=[0, 0, 0, 0]), replay_cyclic(result, [0, 1, 2, 3], memory=False)):
        assert any(not torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(control, expected, strict=True))
    k = kept(N_PARAMS, 0.01)
    assert result["bytes"] == 4 * (4 * k * 3 // 4 + ring_allreduce_bytes(4 * k, 4))
    assert result["bytes"] / 4 < allgather_bytes(8 * k, 4) / 2  # 1.5/P of the allgather's, per step


def _global(rank: int, world: int) -> dict:
    """4 steps of compression.collective global (see :func:`_spied_steps`), and the bytes it counted."""
    import cohort.trainer.compression.global_topk as global_topk
    ctx = SyncContext(rank, world, job_spec(method="topk", collective="global"), CommStats())
    return {**_spied_steps(ctx, global_topk, "global_topk_hook", rank, world), "bytes": ctx.stats.bytes_sent}


def replay_global(result: dict, reselect: bool = True, memory: bool = True) -> tuple[list[torch.Tensor], list[int]]:
    """Global top-k written from its definition (gTop-k, split as Ok-Topk): each rank takes the top-k of
    its error-compensated gradient; index i's sum belongs to rank i mod 4, which keeps the ceil(k/4)
    largest sums it owns; the update is those sums over 4; each rank's residual is its compensated vector
    off its own top-k entries that were kept. Also each rank's bytes over the steps: per step, 8 per
    other rank (phase 1's counts), 8 per pair it sent to another owner, and 8 ceil(k/4) to each of 3."""
    world, k = 4, kept(N_PARAMS, 0.01)
    m = -(-k // world)
    residual, previous, out, sent_bytes = [torch.zeros(N_PARAMS) for _ in range(world)], None, [], [0] * world
    for step, order in enumerate(result["orders"]):
        if previous is not None and order != previous:  # DDP rebuilt the bucket: the residuals restart
            residual = [torch.zeros(N_PARAMS) for _ in range(world)]
        previous = order
        x = [to_bucket(result["all_local"][step][r], order) + (residual[r] if memory else 0) for r in range(world)]
        picks = [torch.topk(v.abs(), k).indices for v in x]
        summed = torch.zeros(N_PARAMS)
        for v, pick in zip(x, picks, strict=True):
            summed[pick] += v[pick]
        owner = torch.arange(N_PARAMS) % world
        if reselect:
            kept_idx = torch.cat([torch.nonzero(owner == j).flatten()[
                torch.topk(summed[owner == j].abs(), m).indices] for j in range(world)])
        else:
            kept_idx = torch.cat(picks).unique()
        update = torch.zeros(N_PARAMS)
        update[kept_idx] = summed[kept_idx] / world
        for r in range(world):
            residual[r] = x[r].clone()
            residual[r][picks[r][torch.isin(picks[r], kept_idx)]] = 0
            sent_bytes[r] += 8 * (world - 1) + 8 * int((picks[r] % world != r).sum()) + 8 * m * (world - 1)
        out.append(from_bucket(update, order))
    return out, sent_bytes


def test_global_collective_keeps_the_top_k_of_the_sum_and_its_bytes_stay_flat():
    """compression.collective global on 4 ranks, 4 steps through DDP: every rank's gradient equals an
    independent replay of global top-k (each owner's ceil(k/4) largest sums of the ranks' top-k), error
    feedback included (what a rank picked that was not kept waits in its residual) and restarted when
    DDP reorders the bucket. Controls: no reselection (the whole sum, as collective: sparse), and no error
    feedback, both differ. Bytes: each rank's count equals the replay's, and per step it is near half the
    allgather's (2/P, plus phase 1's counts)."""
    results = run_ranks(_global, 4)
    result, k = results[0], kept(N_PARAMS, 0.01)
    assert len(result["orders"]) == 4 and result["orders"][1] != result["orders"][0], result["orders"]
    expected, sent_bytes = replay_global(result)
    for step in range(4):
        assert int((expected[step] != 0).sum()) == 4 * -(-k // 4)
        for r in results:
            torch.testing.assert_close(r["hook"][step], expected[step], atol=1e-6, rtol=0)
            assert torch.equal(r["hook"][step], results[0]["hook"][step])
    for control in (replay_global(result, reselect=False)[0], replay_global(result, memory=False)[0]):
        assert any(not torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(control, expected, strict=True))
    assert [r["bytes"] for r in results] == sent_bytes
    assert max(sent_bytes) / 4 < 0.6 * allgather_bytes(8 * k, 4)  # about 2/P of it: 16k (P-1)/P


def test_sparse_wire_advantage_shrinks_as_the_world_grows():
    """An allgather's cost grows with P, a ring allreduce's does not: the tables must show this."""
    n, k_bytes = N_PARAMS, 8 * 97  # top-1% of the MLP
    ratios = [ring_allreduce_bytes(4 * n, p) / allgather_bytes(k_bytes, p) for p in (2, 4, 8, 16)]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] > 2 * ratios[-1]


# --- local SGD ---------------------------------------------------------------------------

LOCALSGD_METHODS = ("none", "fp16", "bf16", "fp8")


def _localsgd(rank: int, world: int) -> dict:
    out = {}
    for method in LOCALSGD_METHODS:
        ctx = SyncContext(rank, world, job_spec(sync="localsgd", method=method, period=2, warmup=2), CommStats())
        torch.manual_seed(0)
        model = MLP(INFO)
        sync = LocalSGDSync(ctx)
        ddp = sync.wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        params = []
        for step in range(6):
            opt.zero_grad()
            x, y = batch(rank, step)
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            sync.after_step(ddp, step + 1)
            params.append(gather(parameters_to_vector(model.parameters()).detach(), world))
        out[method] = {"params": params, "bytes": ctx.stats.bytes_sent}
    return out


def test_localsgd_averages_every_period_after_warmup():
    """Two warm-up steps whose gradients go through the method's allreduce exchange, then rounds every 2 steps:
    the first in fp32 (no reference yet), the others as the method sends the change since the last round."""
    results = run_ranks(_localsgd, 2)
    n, world = N_PARAMS, 2
    for method in LOCALSGD_METHODS:
        params = results[0][method]["params"]
        same = [torch.equal(p[0], p[1]) for p in params]
        # steps 1-2: gradients allreduced (warm-up); then local steps, averaged after steps 2, 4, 6.
        assert same == [True, True, False, True, False, True], (method, same)
        for p in params:
            assert torch.isfinite(p).all()
        sent = {"none": ring_allreduce_bytes(4 * n, world), "fp16": ring_allreduce_bytes(2 * n, world),
                "bf16": ring_allreduce_bytes(2 * n, world), "fp8": fp8_mean_bytes(n, world)[0]}[method]
        grads = 2 * sent
        averages = ring_allreduce_bytes(4 * n, world) + 2 * sent  # the first average in fp32
        assert results[0][method]["bytes"] == grads + averages, method


def _step_and_exchange(rank: int, world: int, step: int, ddp, opt, sync, stats: CommStats) -> tuple:
    """One local step on this rank's batch, then the Sync's exchange after it (``step + 1``, the trainer's count):
    every rank's parameters before and after the exchange, and the bytes this rank sent in it."""
    opt.zero_grad()
    x, y = batch(rank, step)
    F.cross_entropy(ddp(x), y).backward()
    opt.step()
    before = gather(parameters_to_vector(ddp.parameters()).detach(), world)
    sent = stats.bytes_sent
    sync.after_step(ddp, step + 1)
    return before, gather(parameters_to_vector(ddp.parameters()).detach(), world), stats.bytes_sent - sent


OUTER = {"name": "nesterov", "lr": 0.7, "momentum": 0.9}


def _nesterov(theta: torch.Tensor, buf: torch.Tensor, average: torch.Tensor) -> torch.Tensor:
    """torch's SGD with Nesterov momentum on θ, the gradient θ - average; updates ``buf`` in place."""
    g = theta - average
    buf.mul_(OUTER["momentum"]).add_(g)
    return theta - OUTER["lr"] * g.add(buf, alpha=OUTER["momentum"])
# (outer optimizer, averaging dtype, the step after which the world changes or None). A world change builds a
# new Sync on the state the trainer carries (TrainState.sync), and rank 1 comes back as a newcomer: its carried
# state wiped, it takes rank 0's whole state by TrainState.broadcast, as the trainer's hand-over does.
OUTER_CASES = [("nesterov", "none", None), ("sgd", "none", None), ("nesterov", "bf16", None),
               ("nesterov", "none", 5), ("nesterov", "bf16", 5)]


def _outer(rank: int, world: int) -> dict:
    """Local SGD with an outer step: every rank's parameters before and after each round (warm-up 2, period 2)."""
    out = {}
    for name, method, change in OUTER_CASES:
        spec = job_spec(sync="localsgd", method=method, period=2, outer={**OUTER, "name": name}, warmup=2)
        torch.manual_seed(0)
        model = MLP(INFO)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        carried = carried_state(spec, model)
        state = TrainState(model, opt, ElasticSampler(64, 8, 0), sync=carried)
        worlds: list = []  # each world's (Sync, DDP), kept: the old DDP's hooks stay idle once it is not called
        before, after, record = [], [], {"bytes": 0}
        for step in range(8):
            if step == 0 or step == change:
                if step == change:
                    if rank == 1:
                        for v in carried.values():
                            v.fill_(-1)
                    state.broadcast(0, rank)
                    record["handed"] = {k: v.clone() for k, v in carried.items()}
                ctx = SyncContext(rank, world, spec, CommStats(), carried=carried)
                sync = LocalSGDSync(ctx)
                worlds.append((sync, sync.wrap(model), ctx))
            sync, ddp, ctx = worlds[-1]
            b, a, record[step + 1] = _step_and_exchange(rank, world, step, ddp, opt, sync, ctx.stats)
            before.append(b)
            after.append(a)
        out[(name, method, change)] = {"before": before, "after": after, **record}
    return out


def test_localsgd_outer_step_is_sgd_on_the_rounds_pseudo_gradient():
    """DiLoCo's and SlowMo's outer step (sync.outerOptimizer), 2 ranks, rounds after steps 2, 4, 6, 8. The
    first round is the plain average; each later round sets every replica to an independent replay of SGD
    (Nesterov or heavy ball, lr 0.7, momentum 0.9) on the previous round's parameters, with the previous
    round's parameters minus this round's average as its gradient (to 1e-6; with bf16 averaging, within 5% of
    the outer step's length). The control, the plain average, differs from it.

    Across a world change after step 5 the replay goes on unbroken: the round after step 6 is an outer step
    with the momentum of the rounds before (not a new world's plain average), the newcomer received the outer
    state bit for bit, and with bf16 that round sends 16 bits (the new world agreed on the reference)."""
    ranks = run_ranks(_outer, 2)
    r = ranks[0]
    lr, mu = OUTER["lr"], OUTER["momentum"]
    n = N_PARAMS
    for (name, method, change), got in r.items():
        rounds = [1, 3, 5, 7]  # indices of the steps after which the replicas average
        for i in rounds:
            assert torch.equal(got["after"][i][0], got["after"][i][1]), (name, method, i)
        first = got["after"][1][0]
        assert torch.equal(first, got["before"][1].mean(0)) or method != "none", name  # a plain fp32 average
        previous, buf = first, None
        for i in rounds[1:]:
            average = got["before"][i].mean(0)
            g = previous - average
            buf = g.clone() if buf is None else buf.mul(mu).add(g)
            update = g.add(buf, alpha=mu) if name == "nesterov" else buf
            expected = previous.add(update, alpha=-lr)
            if method == "none":
                torch.testing.assert_close(got["after"][i][0], expected, atol=1e-6, rtol=0)
            else:  # bf16 rounds each averaged change: near the replay, far from the plain average
                off, step = (got["after"][i][0] - expected).norm(), (expected - average).norm()
                assert off < 0.05 * step, (name, method, change, i, float(off), float(step))
            assert not torch.allclose(got["after"][i][0], average, atol=1e-6, rtol=0), (name, method, change, i)
            previous = got["after"][i][0]
        if change is not None:  # the newcomer (rank 1) received the outer state of the round after step 4
            handed, received = got["handed"], ranks[1][(name, method, change)]["handed"]
            assert int(handed["round"]) == 4 and torch.equal(handed["params"], got["after"][3][0]), (method, handed)
            assert torch.count_nonzero(handed["momentum"]) > 0
            assert handed.keys() == received.keys() and all(torch.equal(handed[k], received[k]) for k in handed)
            assert got[6] == ring_allreduce_bytes((4 if method == "none" else 2) * n, 2), (method, got[6])


def _carrying_world(rank: int, world: int, spec) -> tuple:
    """A seeded MLP, its SGD, and a local-SGD world on the state the trainer would carry: (model, opt, ctx, sync,
    the wrapped module)."""
    torch.manual_seed(0)
    model = MLP(INFO)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = SyncContext(rank, world, spec, CommStats(), carried=carried_state(spec, model))
    sync = LocalSGDSync(ctx)
    return model, opt, ctx, sync, sync.wrap(model)


FRAGMENT_CASES = [("none", "none"), ("none", "bf16"), ("nesterov", "none"), ("nesterov", "bf16")]


def _fragments(rank: int, world: int) -> dict:
    """Local SGD in 2 fragments (warm-up 2, period 4: fragment 0's rounds after steps 2, 6, 10, fragment 1's after
    4, 8): every rank's parameters before and after each step's exchange, and the bytes it sent."""
    out = {}
    for name, method in FRAGMENT_CASES:
        spec = job_spec(sync="localsgd", method=method, period=4, outer={**OUTER, "name": name}, warmup=2,
                        fragments=2)
        model, opt, ctx, sync, ddp = _carrying_world(rank, world, spec)
        before, after, sent = [], [], []
        for step in range(10):
            b, a, n = _step_and_exchange(rank, world, step, ddp, opt, sync, ctx.stats)
            before.append(b)
            after.append(a)
            sent.append(n)
        out[(name, method)] = {"before": before, "after": after, "sent": sent}
    return out


def test_localsgd_fragments_average_one_slice_per_round_and_step_its_slice_of_the_outer_state():
    """Streaming DiLoCo's schedule (sync.fragments 2, period 4, warm-up 2; 2 ranks): after steps 2, 6 and 10 the
    first half of the flat parameter vector is averaged, after 4 and 8 the second half, and the other half stays
    each rank's own, untouched. Each round sends half the model (the peak per round halves); with an outer
    step or 16-bit averaging the first round averages the whole model in fp32 (the reference every later round
    needs), and the later 16-bit rounds keep the replicas' slice identical.
    With Nesterov each round's slice equals an independent replay of SGD on that slice of θ with that slice of
    the momentum (to 1e-6; bf16 within 5 % of the step's length)."""
    ranks = run_ranks(_fragments, 2)
    n = N_PARAMS
    halves = [(0, n // 2), (n // 2, n)]
    for (name, method), got in ranks[0].items():
        theta, buf, started = None, torch.zeros(n), False
        for i in range(10):
            step, b, a = i + 1, got["before"][i], got["after"][i]
            round_of = {2: 0, 6: 0, 10: 0, 4: 1, 8: 1}.get(step)
            if step < 2:  # warm-up: synchronous SGD, nothing after the step
                assert torch.equal(b[0], b[1]) and torch.equal(a, b) and got["sent"][i] == 0, (name, method, step)
                continue
            if round_of is None:
                assert torch.equal(a, b) and got["sent"][i] == 0, (name, method, step)
                continue
            whole = not started and (name != "none" or method != "none")
            lo, hi = (0, n) if whole else halves[round_of]
            bpe = 4 if not started or method == "none" else 2
            started = True
            assert got["sent"][i] == ring_allreduce_bytes(bpe * (hi - lo), 2), (name, method, step, got["sent"][i])
            assert torch.equal(a[0][lo:hi], a[1][lo:hi]), (name, method, step)
            for r in range(2):  # outside the round's slice the parameters are the rank's own
                assert torch.equal(a[r][:lo], b[r][:lo]) and torch.equal(a[r][hi:], b[r][hi:]), (name, method, step)
            assert step == 2 or whole or not torch.equal(a[0], a[1]), (name, method, step)  # 2: the warm-up's last
            average = b[:, lo:hi].mean(0)
            if name == "none" or theta is None:
                if method == "none":
                    assert torch.equal(a[0][lo:hi], average), (name, method, step)
                theta = a[0].clone() if name != "none" else None
                continue
            expected = _nesterov(theta[lo:hi], buf[lo:hi], average)
            if method == "none":
                torch.testing.assert_close(a[0][lo:hi], expected, atol=1e-6, rtol=0)
            else:
                off, length = (a[0][lo:hi] - expected).norm(), (expected - average).norm()
                assert off < 0.05 * length, (name, method, step, float(off), float(length))
            theta[lo:hi] = a[0][lo:hi]


# (outer optimizer, averaging dtype, mixing, the step before which the world changes or None)
OVERLAP_CASES = [("none", "none", 0.0, None), ("nesterov", "none", 0.25, None), ("nesterov", "bf16", 0.0, None),
                 ("none", "bf16", 0.25, None), ("nesterov", "none", 0.0, 4)]


def _overlap(rank: int, world: int) -> dict:
    """Local SGD in 2 fragments with overlap 1 (warm-up 2, period 4: rounds sent after steps 2, 4, 6, 8, 10 and
    applied one step later): every rank's parameters before and after each step's exchange, the bytes it sent,
    the outer state's round, and the steps at which the commit gate was asked. With a world change the Sync is
    built again (on the carried state) after step 4, while that step's round is in flight."""
    out = {}
    for name, method, mixing, change in OVERLAP_CASES:
        spec = job_spec(sync="localsgd", method=method, period=4, outer={**OUTER, "name": name}, warmup=2,
                        fragments=2, overlap=1, mixing=mixing)
        torch.manual_seed(0)
        model = MLP(INFO)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        carried = carried_state(spec, model)
        record: dict = {"before": [], "after": [], "sent": [], "round": [], "gate": []}
        worlds: list = []
        for step in range(10):
            if step == 0 or step == change:
                ctx = SyncContext(rank, world, spec, CommStats(), carried=carried,
                                  check_gate=lambda r=record: r["gate"].append(len(r["sent"]) + 1))
                sync = LocalSGDSync(ctx)
                worlds.append((sync, sync.wrap(model), ctx))
            sync, ddp, ctx = worlds[-1]
            b, a, n = _step_and_exchange(rank, world, step, ddp, opt, sync, ctx.stats)
            for key, value in (("before", b), ("after", a), ("sent", n),
                               ("round", int(carried["round"]) if carried else None)):
                record[key].append(value)
        out[(name, method, mixing, change)] = record
    return out


def test_localsgd_overlap_applies_each_round_a_step_later_mixed_with_the_local_slice():
    """Streaming DiLoCo's overlap (sync.overlapSteps 1, fragments 2, period 4, warm-up 2; 2 ranks). Each round
    is sent after its step (2, 4, 6, 8, 10; its bytes counted then) while the parameters and θ stay as they are;
    one step later, after the next local step, the commit gate is asked and the round's slice becomes
    (1 - mixing) x the round's result + mixing x the rank's slice now; the rest stays the rank's own. The result
    is the average of the slice as it was sent (plain), or an independent replay of Nesterov on that slice of θ
    (1e-6; bf16 within 5 %). A round in flight when the world changes (after step 4) is dropped: nothing applied
    after step 5, θ still the round of step 2's, and the new world goes on from it."""
    ranks = run_ranks(_overlap, 2)
    n = N_PARAMS
    halves = [(0, n // 2), (n // 2, n)]
    for (name, method, mixing, change), got in ranks[0].items():
        case = (name, method, mixing, change)
        theta, buf, started, flight = None, torch.zeros(n), False, None
        applied = []
        for i in range(10):
            step, b, a = i + 1, got["before"][i], got["after"][i]
            if flight is not None and step == flight[0] + 1 and change != step - 1:
                sent_at, lo, hi, average = flight
                flight = None
                applied.append(step)
                for r in range(2):  # outside the round's slice the parameters are the rank's own
                    assert torch.equal(a[r][:lo], b[r][:lo]) and torch.equal(a[r][hi:], b[r][hi:]), (case, step)
                if name == "none" or theta is None:
                    result = average
                    if name != "none":
                        theta = average.clone()
                else:
                    result = _nesterov(theta[lo:hi], buf[lo:hi], average)
                    theta[lo:hi] = result
                for r in range(2):
                    expected = torch.lerp(result, b[r][lo:hi], mixing)
                    if method == "none" or (lo, hi) == (0, n):
                        torch.testing.assert_close(a[r][lo:hi], expected, atol=1e-6, rtol=0)
                    else:
                        off, length = (a[r][lo:hi] - expected).norm(), (b[r][lo:hi] - expected).norm()
                        assert off < 0.05 * length, (case, step, float(off), float(length))
                assert mixing or torch.equal(a[0][lo:hi], a[1][lo:hi]), (case, step)
                if name != "none":
                    assert got["round"][i] == sent_at, (case, step, got["round"][i])
            else:
                assert torch.equal(a, b), (case, step)  # nothing applied at a send step or between rounds
            if step >= 2 and (step - 2) % 2 == 0:  # a round is sent after this step
                whole = not started and (name != "none" or method != "none")
                lo, hi = (0, n) if whole else halves[((step - 2) // 2) % 2]
                bpe = 4 if not started or method == "none" else 2
                started = True
                assert got["sent"][i] == ring_allreduce_bytes(bpe * (hi - lo), 2), (case, step, got["sent"][i])
                flight = (step, lo, hi, a[:, lo:hi].mean(0))
                if name != "none" and i > 0:
                    assert got["round"][i] == got["round"][i - 1], (case, step)  # θ waits for the round
            else:
                assert got["sent"][i] == 0, (case, step)
        expected_applied = [3, 7, 9] if change == 4 else [3, 5, 7, 9]
        assert applied == expected_applied and got["gate"] == expected_applied, (case, applied, got["gate"])
        if change == 4:
            assert got["round"][4] == 2  # the round of step 4 never reached θ


# (outer optimizer, overlap, mixing): rounds on 3 ranks (9610 entries: parts of 3204, the last padded)
FP8_CASES = [("none", 0, 0.0), ("nesterov", 2, 0.25)]


def _fp8_rounds(rank: int, world: int) -> dict:
    """Local SGD with fp8 rounds (warm-up 2, period 4): every rank's parameters before and after each step's
    exchange, the bytes sent, θ before and after it, and whether a round was in flight with its second phase
    (the all-gather) started."""
    out = {}
    for name, overlap, mixing in FP8_CASES:
        spec = job_spec(sync="localsgd", method="fp8", period=4, outer={**OUTER, "name": name}, warmup=2,
                        overlap=overlap, mixing=mixing)
        model, opt, ctx, sync, ddp = _carrying_world(rank, world, spec)
        record: dict = {"before": [], "after": [], "sent": [], "theta": [], "advanced": []}
        for step in range(12):
            theta = sync.averager.reference
            record["theta"].append(None if theta is None else theta.clone())
            b, a, n = _step_and_exchange(rank, world, step, ddp, opt, sync, ctx.stats)
            pending = sync.averager.pending
            for key, value in (("before", b), ("after", a), ("sent", n),
                               ("advanced", pending is not None and getattr(pending.flight, "second", None) is not None)):
                record[key].append(value)
        record["theta"].append(sync.averager.reference.clone())
        out[(name, overlap, mixing)] = record
    return out


def test_localsgd_fp8_rounds_send_the_change_since_theta_as_a_quantised_mean():
    """fp8 rounds (3 ranks, warm-up 2, period 4: rounds after steps 2, 6, 10). The first has no θ to send the
    change since: the fp32 average. Each later one sends every rank's change since θ through FP8Mean, so the
    average it takes is θ + fp8_mean(the changes), the same bits on every rank; without an outer step that is the
    replicas' new value bit for bit, and with DiLoCo's Nesterov it is the outer step's average (the replay to
    1e-6). Left in flight for 2 steps, a round starts its all-gather at the step in between and is applied, mixed
    with the local slice by 0.25, at the second. Each round sends an all-to-all and an all-gather of one part."""
    ranks = run_ranks(_fp8_rounds, 3)
    n, world = N_PARAMS, 3
    wire = fp8_mean_bytes(n, world)[0]
    for (name, overlap, mixing), got in ranks[0].items():
        case = (name, overlap, mixing)
        buf = torch.zeros(n)
        for sent_at in (2, 6, 10):
            i, j = sent_at - 1, sent_at - 1 + overlap  # the indices of the steps it is sent and applied after
            sent, theta = got["before"][i], got["theta"][i]
            assert got["sent"][i] == (ring_allreduce_bytes(4 * n, world) if sent_at == 2 else wire), (case, sent_at)
            if sent_at == 2:
                result = sent.mean(0)
                exact = False
            else:
                average = theta + fp8_mean([sent[r] - theta for r in range(world)])
                result = average if name == "none" else _nesterov(theta, buf, average)
                exact = name == "none"
                off, moved = (average - sent.mean(0)).norm(), (sent.mean(0) - theta).norm()
                assert 0 < off < 0.05 * moved, (case, sent_at, float(off), float(moved))  # fp8 rounding, small
            if overlap:
                two_phase = sent_at > 2  # the first round's fp32 allreduce has one phase
                assert all(got["advanced"][k] == two_phase for k in range(i + 1, j)) and not got["advanced"][i], case
                assert all(torch.equal(got["after"][k], got["before"][k]) for k in range(i, j)), case
            for r in range(world):
                expected = torch.lerp(result, got["before"][j][r], mixing)
                if exact:
                    assert torch.equal(got["after"][j][r], expected), (case, sent_at, r)
                else:
                    torch.testing.assert_close(got["after"][j][r], expected, atol=1e-6, rtol=0)
            if name != "none":
                torch.testing.assert_close(got["theta"][j + 1], result, atol=1e-6, rtol=0)
        for r in range(1, world):
            assert all(torch.equal(ranks[r][case]["after"][k], got["after"][k]) for k in range(12)), (case, r)


def _failed_round(rank: int, world: int) -> dict:
    """DiLoCo, rounds after steps 2, 4, 6. The round after step 4 completes on rank 0 but the commit gate's check
    fails on rank 1 (fault-injected: on NCCL a failure is reported after the collective, its result perhaps half
    written). A new world (a new Sync on the carried state) follows after step 4."""
    spec = job_spec(sync="localsgd", period=2, outer=OUTER, warmup=2)
    torch.manual_seed(0)
    model = MLP(INFO)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    carried = carried_state(spec, model)
    checks = []

    def check_gate() -> None:
        checks.append(1)
        if rank == 1 and len(checks) == 2:
            raise StepDiscarded("step discarded: the cpu backend reports a failure (injected)")
    out: dict = {}
    worlds: list = []
    for step in range(6):
        if step in (0, 4):
            sync = LocalSGDSync(SyncContext(rank, world, spec, CommStats(), carried=carried, check_gate=check_gate))
            worlds.append((sync, sync.wrap(model)))
        sync, ddp = worlds[-1]
        opt.zero_grad()
        x, y = batch(rank, step)
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        local = parameters_to_vector(model.parameters()).detach().clone()
        theta = carried["params"].clone()
        try:
            sync.after_step(ddp, step + 1)
        except StepDiscarded as e:
            out["discarded"] = str(e)
            out["kept"] = torch.equal(parameters_to_vector(model.parameters()), local) and \
                torch.equal(carried["params"], theta)
        out[step + 1] = {"round": int(carried["round"]), "before": gather(local, world),
                         "after": gather(parameters_to_vector(model.parameters()).detach(), world)}
    return out


def test_a_round_the_commit_gate_refuses_changes_nothing_and_the_next_world_starts_the_outer_step_again():
    """The round after step 4 fails on rank 1 only: its parameters stay its local step's and θ the round of step
    2's, bit for bit, while rank 0 took the round. The next world finds the members' last rounds differ (4
    and 2), so its first round (after step 6) is the plain fp32 average on both, not two different outer
    steps."""
    r0, r1 = run_ranks(_failed_round, 2)
    assert "discarded" not in r0 and "injected" in r1["discarded"] and r1["kept"], r1.get("discarded")
    assert r0[4]["round"] == 4 and r1[4]["round"] == 2
    assert torch.equal(r1[4]["after"][1], r1[4]["before"][1])  # rank 1 kept its local parameters
    assert r0[6]["round"] == r1[6]["round"] == 6
    average = r0[6]["before"].mean(0)
    assert torch.equal(r0[6]["after"][0], average) and torch.equal(r0[6]["after"][1], average)


# (outer optimizer, averaging dtype, fragments, overlap, mixing, steps trained before training ends), period 4 and
# warm-up 2: rounds sent after steps 2 (the whole model when a reference is needed), 4, 6, ...
FINISH_CASES = [("none", "none", 1, 0, 0.0, 5), ("none", "bf16", 1, 0, 0.0, 5), ("nesterov", "none", 1, 0, 0.0, 5),
                ("nesterov", "none", 2, 0, 0.0, 4), ("nesterov", "none", 2, 1, 0.25, 6), ("nesterov", "none", 1, 0, 0.0, 2)]


def _finish(rank: int, world: int) -> dict:
    """Local SGD trained for a case's steps, then ``finish``: every rank's parameters and the outer state just
    before and just after it, the bytes it sent, and how often it asked the commit gate."""
    out = {}
    for name, method, fragments, overlap, mixing, steps in FINISH_CASES:
        spec = job_spec(sync="localsgd", method=method, period=4, outer={**OUTER, "name": name}, warmup=2,
                        fragments=fragments, overlap=overlap, mixing=mixing)
        torch.manual_seed(0)
        model = MLP(INFO)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        carried = carried_state(spec, model)
        gate: list[int] = []
        ctx = SyncContext(rank, world, spec, CommStats(), carried=carried, check_gate=lambda g=gate: g.append(1))
        sync = LocalSGDSync(ctx)
        ddp = sync.wrap(model)
        for step in range(steps):
            _step_and_exchange(rank, world, step, ddp, opt, sync, ctx.stats)
        record = {"before": gather(parameters_to_vector(model.parameters()).detach(), world),
                  "carried": {k: v.clone() for k, v in carried.items()}, "pending": sync.averager.pending is not None}
        sent, asked = ctx.stats.bytes_sent, len(gate)
        sync.finish(ddp, steps)
        record.update(after=gather(parameters_to_vector(model.parameters()).detach(), world),
                      theta=carried["params"].clone() if carried else None,
                      round=int(carried["round"]) if carried else None,
                      sent=ctx.stats.bytes_sent - sent, gate=len(gate) - asked)
        out[(name, method, fragments, overlap, mixing, steps)] = record
    return out


def test_localsgd_finishes_as_one_model_with_the_round_the_schedule_would_take_next():
    """When training ends (``finish``, 2 ranks, period 4, warm-up 2) the replicas become one model, bit for bit:
    the plain average of their parameters (exact in fp32; near it when the round sends its 16-bit change), or
    Nesterov's outer step on θ by that average, as the next round would have taken it. A fragment whose round
    was just applied is left as it is, θ included (4 steps, 2 fragments: only the first half takes a round, not
    a second momentum step on the other). A round in flight (overlap 1, sent after step 6) is applied first,
    mixed as usual, then both halves take an unmixed round. Within the warm-up (2 steps) nothing is sent."""
    ranks = run_ranks(_finish, 2)
    n, h = N_PARAMS, N_PARAMS // 2
    for case, got in ranks[0].items():
        name, method, fragments, overlap, mixing, steps = case
        b, a = got["before"], got["after"]
        assert torch.equal(a[0], a[1]), case  # one model
        if steps <= 2:  # the warm-up's allreduced gradients: identical already, nothing sent
            assert torch.equal(a, b) and got["sent"] == 0 and got["gate"] == 0, case
            continue
        assert not torch.equal(b[0], b[1]), case  # the replicas had trained apart
        if name == "none":
            assert got["sent"] == ring_allreduce_bytes((4 if method == "none" else 2) * n, 2), (case, got["sent"])
            if method == "none":
                assert torch.equal(a[0], b.mean(0)), case
            else:  # the change since the last round's average, in 16 bits
                off, moved = (a[0] - b.mean(0)).norm(), (b[0] - b.mean(0)).norm()
                assert off < 0.05 * moved, (case, float(off), float(moved))
            continue
        theta, buf = got["carried"]["params"].clone(), got["carried"]["momentum"].clone()
        if fragments == 1:
            theta = _nesterov(theta, buf, b.mean(0))
            rounds = 1
        elif not overlap:  # the second half's round was applied after step 4: only the first half moved
            assert torch.equal(b[0][h:], theta[h:]) and torch.equal(b[1][h:], theta[h:]), case
            theta[:h] = _nesterov(theta[:h], buf[:h], b[:, :h].mean(0))
            assert torch.equal(a[0][h:], b[0][h:]) and torch.equal(got["theta"][h:], got["carried"]["params"][h:])
            rounds = 1
        else:  # the first half's round of step 6 in flight: applied (and mixed), then a round of each half
            assert got["pending"], case
            theta[:h] = _nesterov(theta[:h], buf[:h], b[:, :h].mean(0))
            mixed = torch.lerp(theta[:h], b[:, :h], mixing)
            theta[:h] = _nesterov(theta[:h], buf[:h], mixed.mean(0))
            theta[h:] = _nesterov(theta[h:], buf[h:], b[:, h:].mean(0))
            rounds = 3
        torch.testing.assert_close(a[0], theta, atol=1e-6, rtol=0)
        assert torch.equal(got["theta"], a[0]) and got["round"] == steps, case
        assert got["gate"] == rounds, (case, got["gate"])


CONSENSUS_CASES = [("none", "none", 1, 0, 0.0), ("nesterov", "none", 2, 1, 0.25), ("nesterov", "bf16", 1, 0, 0.0),
                   ("none", "fp8", 2, 1, 0.0)]


def _localsgd_consensus(rank: int, world: int) -> dict:
    """Local SGD trained 10 steps (warm-up 2, period 4) twice: once asking for ``consensus`` after every step (as
    evaluations and checkpoints do), once not; then ``finish`` and ``consensus`` once more."""
    out = {}
    for name, method, fragments, overlap, mixing in CONSENSUS_CASES:
        finals, seen = [], {}
        for asking in (True, False):
            spec = job_spec(sync="localsgd", method=method, period=4, outer={**OUTER, "name": name}, warmup=2,
                            fragments=fragments, overlap=overlap, mixing=mixing)
            torch.manual_seed(0)
            model = MLP(INFO)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            gate: list[int] = []
            ctx = SyncContext(rank, world, spec, CommStats(), carried=carried_state(spec, model),
                              check_gate=lambda g=gate: g.append(1))
            sync = LocalSGDSync(ctx)
            ddp = sync.wrap(model)
            for step in range(10):
                _step_and_exchange(rank, world, step, ddp, opt, sync, ctx.stats)
                if asking:
                    mine = parameters_to_vector(model.parameters()).detach().clone()
                    sent, asked = ctx.stats.bytes_sent, len(gate)
                    delta = sync.mean.lossy and sync.averager.reference is not None  # sent as a lossy change
                    theta = sync.averager.reference.clone() if delta else None
                    got = sync.consensus(ddp, step + 1)
                    seen[step + 1] = {"got": got, "replicas": gather(mine, world), "sent": ctx.stats.bytes_sent - sent,
                                      "drift": ctx.stats.replica_drift, "delta": delta, "theta": theta,
                                      "gate": len(gate) - asked, "pending": sync.averager.pending is not None,
                                      "untouched": torch.equal(parameters_to_vector(model.parameters()), mine)}
            sync.finish(ddp, 10)
            finals.append(parameters_to_vector(model.parameters()).detach().clone())
            if asking:
                seen["after finish"] = sync.consensus(ddp, 10)
        out[(name, method, fragments, overlap, mixing)] = {"seen": seen, "finals": finals}
    return out


def test_localsgd_is_evaluated_and_checkpointed_as_the_replicas_average_without_changing_training():
    """Between rounds local SGD's replicas differ; ``consensus`` (what evaluations measure and checkpoints hold) is
    their average, on every rank, after the commit gate's check (sent as the rounds are: with bf16, the change since
    θ in 16 bits, so near the exact mean; with fp8, θ + fp8_mean of the changes bit for bit, near the mean too;
    otherwise the exact mean), while the
    parameters stay each rank's own, a round in flight included; each rank reports how far its replica is from
    it (``CommStats.replica_drift``, the ``cohort_replica_drift`` gauge). Asked after every step, it changes nothing in
    training: the models at the end are bit for bit those of the same run not asking. Within the warm-up, and
    after ``finish``, the replicas are one model: nothing is sent."""
    ranks = run_ranks(_localsgd_consensus, 2)
    for case, got in ranks[0].items():
        assert torch.equal(got["finals"][0], got["finals"][1]), case
        seen = got["seen"]
        assert seen.pop("after finish") is None, case
        for step, s in seen.items():
            assert s["untouched"] and ranks[1][case]["seen"][step]["untouched"], (case, step)
            if step <= 2:
                assert s["got"] is None and s["sent"] == 0 and s["gate"] == 0, (case, step)
                continue
            mean = s["replicas"].mean(0)
            if s["delta"] and case[1] == "fp8":  # as the rounds send it: fp8's mean of the changes since θ
                assert torch.equal(s["got"], s["theta"] + fp8_mean([r - s["theta"] for r in s["replicas"]])), (case, step)
            if s["delta"]:  # as the rounds send it: the change since θ in bf16, so near the mean
                off, moved = (s["got"] - mean).norm(), (s["replicas"][0] - mean).norm()
                assert off <= 0.05 * moved, (case, step, float(off), float(moved))
            else:
                assert torch.equal(s["got"], mean), (case, step)
            assert torch.equal(s["got"], ranks[1][case]["seen"][step]["got"]), (case, step)
            sent = ring_allreduce_bytes((2 if s["delta"] else 4) * N_PARAMS, 2)
            if s["delta"] and case[1] == "fp8":
                sent = fp8_mean_bytes(N_PARAMS, 2)[0]
            assert s["sent"] == sent and s["gate"] == 1, (case, step)
            for r, rank in enumerate(ranks):  # the drift each rank reports: how far its replica is from the average
                want = float((s["replicas"][r] - s["got"]).norm() / s["got"].norm())
                assert rank[case]["seen"][step]["drift"] == pytest.approx(want, rel=1e-5, abs=1e-12), (case, step, r)
        apart = [step for step, s in seen.items() if step > 2 and not torch.equal(*s["replicas"])]
        assert len(apart) >= 4, (case, apart)  # the replicas did differ when it was asked
        assert all(0 < seen[step]["drift"] < 0.1 for step in apart), (case, [seen[st]["drift"] for st in apart])
        if case[3]:
            assert any(s["pending"] for s in seen.values()), case
        assert any(s["delta"] for s in seen.values()) == (case[1] != "none"), case



def _averages_per_step(rank: int, world: int, port: int, root: str) -> dict:
    """DiLoCo (period 2, warm-up 2) trained 8 steps by the real Trainer, evaluating and saving every 4 steps: the
    steps at which the sync computed the replicas' average (``consensus``), and what it returned."""
    from gloo_ranks import run_trainer

    from cohort.api.jobconfig import from_manifest

    calls: list[tuple[int, bool]] = []
    real = LocalSGDSync.consensus

    def counted(self, model, step):
        got = real(self, model, step)
        calls.append((step, got is not None))
        return got
    LocalSGDSync.consensus = counted
    spec = {"workload": {"model": "mlp", "dataset": "digits", "modelArgs": {"hidden": 16}, "epochs": 0,
                         "maxSteps": 8, "batchSize": 8, "evalEveryEpochs": 0, "evalEverySteps": 4},
            "sync": {"algorithm": "localsgd", "period": 2, "warmupSteps": 2, "outerOptimizer": {"name": "nesterov"}},
            "replicas": {"min": 2, "max": 2, "target": 2},
            "checkpoint": {"everySteps": 4, "keep": 1, "async": False, "path": f"{root}/ck"}}
    cfg = from_manifest({"apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "avg"},
                         "spec": spec})
    summary = run_trainer(rank, world, port, cfg, {"COHORT_METRICS_PORT": "0", "COHORT_POD_NAME": f"avg-{rank}",
                                                   "COHORT_TERMINATION_LOG": f"{root}/avg-{rank}.summary"})[1]
    return {"calls": calls, "step": summary["step"]}


def test_an_evaluation_and_a_save_due_at_the_same_step_share_one_average(tmp_path):
    """At step 4 an evaluation and a periodic save are both due: the replicas' average (a collective of the whole
    model, on a slow link the cost local SGD avoids) is computed once and serves both; at the end, after finish,
    the evaluation asks once and the replicas are one model already (None, nothing sent). Red with the average
    computed for each (two calls at step 4)."""
    from cohort.trainer.runtime.ports import free_ports

    ranks = run_ranks(_averages_per_step, 2, free_ports(1)[0], str(tmp_path), group=False)
    for r in ranks:
        assert r["step"] == 8 and r["calls"] == [(4, True), (8, False)], r


# --- gossip ------------------------------------------------------------------------------

def _disagreement(model: torch.nn.Module, world: int) -> tuple[float, torch.Tensor]:
    """(mean ||w_i - w_bar||, w_bar), from all ranks' parameters."""
    w = gather(parameters_to_vector(model.parameters()).detach(), world)
    mean = w.mean(0)
    return float((w - mean).norm(dim=1).mean()), mean


def _gossip_consensus(rank: int, world: int, rounds: int, topologies: list[str], methods: list[str]) -> dict:
    out = {}
    for topology in topologies:
        for method in methods:
            ctx = SyncContext(rank, world, job_spec(sync="gossip", method=method, topology=topology, ratio=0.1),
                              CommStats())
            torch.manual_seed(rank)  # every rank starts elsewhere: gossip alone must pull them together
            model = MLP(INFO)
            sync = GossipSync(ctx)
            before, mean_before = _disagreement(model, world)
            for step in range(1, rounds + 1):
                sync.after_step(sync.wrap(model), step)
            sync.settle(model)
            after, mean_after = _disagreement(model, world)
            finite = bool(torch.isfinite(parameters_to_vector(model.parameters())).all())
            out[(topology, method)] = {"before": before, "after": after, "finite": finite,
                                       "mean_drift": float((mean_after - mean_before).abs().max()),
                                       "bytes": ctx.stats.bytes_sent, "sent": {p: lk.sent for p, lk in
                                                                               sync.exchange.links.items()}}
    return out


@pytest.fixture(scope="module")
def gossip4() -> dict:
    return run_ranks(_gossip_consensus, 4, 30, ["ring", "exponential", "random"], GOSSIP_METHODS)[0]


@pytest.mark.parametrize("topology", ["ring", "exponential", "random"])
@pytest.mark.parametrize("method", GOSSIP_METHODS)
def test_gossip_shrinks_disagreement_and_keeps_the_average(gossip4, topology, method):
    """30 rounds from different starting points, 4 ranks. Exact and nearly exact encodings (none, fp16, bf16, fp8)
    reach agreement (<1% of the starting disagreement; ring and random mix slower than the
    complete graph); compressed CHOCO exchanges shrink it by at least 10%. The replicas'
    average is invariant (exchanges are pairwise and symmetric) to 1e-5."""
    r = gossip4[(topology, method)]
    assert r["finite"]
    limit = 0.01 if method in ("none", "fp16", "bf16", "fp8") else 0.9
    assert r["after"] < limit * r["before"], r
    assert r["mean_drift"] < 1e-5


def test_gossip_bytes_match_the_messages_sent(gossip4):
    n = N_PARAMS
    dense = gossip4[("ring", "none")]
    assert sorted(dense["sent"]) == [1, 3] and set(dense["sent"].values()) == {30}  # one message per round
    # settle(), once at the end, agrees on every link's (sent, received, posted) counts: an allgather of
    # 4 x 3 int64 per rank, which each rank sends to the 3 others around the ring (wire bytes only).
    settle = (4 - 1) * (4 * 3 * 8)
    assert dense["bytes"] == 2 * 30 * (HEADER_BYTES + 4 * n) + settle
    topk = gossip4[("ring", "topk")]
    k = kept(N_PARAMS, 0.1)
    first = HEADER_BYTES + 4 * n  # a link's first message is dense (the copies start exact)
    assert topk["bytes"] == 2 * (first + (topk["sent"][1] - 1) * (HEADER_BYTES + 8 * k)) + settle


@pytest.mark.parametrize("world", [2, 3])
def test_gossip_at_small_and_odd_world_sizes(world):
    results = run_ranks(_gossip_consensus, world, 20, ["ring", "random"], ["none", "topk"])[0]
    for (topology, method), r in results.items():
        assert r["finite"] and r["mean_drift"] < 1e-5
        assert r["after"] < (0.01 if method == "none" else 0.9) * r["before"], (topology, method, r)
    if world == 2:
        assert list(results[("ring", "none")]["sent"]) == [1]  # the ring of two: a single link


def test_gossip_at_world_size_one_is_a_no_op():
    ctx = SyncContext(0, 1, job_spec(sync="gossip", method="topk"), CommStats())
    model = MLP(INFO)
    before = parameters_to_vector(model.parameters()).clone()
    sync = GossipSync(ctx)
    assert sync.wrap(model) is model
    sync.after_step(model, 1)
    assert torch.equal(parameters_to_vector(model.parameters()), before)
    assert sync.consensus(model, 1) is None and ctx.stats.bytes_sent == 0


def _refused_gossip_round(rank: int, world: int) -> dict:
    """Three plain gossip rounds between two replicas, each after a step on its own batch; rank 1's commit
    gate refuses the third."""
    checks = []

    def check_gate() -> None:
        checks.append(1)
        if rank == 1 and len(checks) == 3:
            raise StepDiscarded("step discarded: the cpu backend reports a failure (injected)")
    sync = GossipSync(SyncContext(rank, world, job_spec(sync="gossip"), CommStats(), check_gate=check_gate))
    torch.manual_seed(rank)
    model = sync.wrap(MLP(INFO))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: dict = {}
    for step in range(1, 4):
        opt.zero_grad()
        x, y = batch(rank, step)
        F.cross_entropy(model(x), y).backward()
        opt.step()  # the replicas differ before every round
        before = parameters_to_vector(model.parameters()).detach().clone()
        try:
            sync.after_step(model, step)
        except StepDiscarded as e:
            out["discarded"] = str(e)
        out[step] = not torch.equal(parameters_to_vector(model.parameters()), before)  # the round moved it
    sync.settle(model)
    return out


def test_a_gossip_round_the_commit_gate_refuses_leaves_the_parameters():
    """Gossip's mixing asks the commit gate before the parameters take the mixed values: rank 1's third
    round is refused (fault-injected) and leaves its parameters as they were; rank 0's went through."""
    r0, r1 = run_ranks(_refused_gossip_round, 2)
    assert "discarded" not in r0 and "injected" in r1["discarded"], r1
    assert [r0[s] for s in (1, 2, 3)] == [True, True, True] and [r1[s] for s in (1, 2, 3)] == [True, True, False]


def _gossip_finish(rank: int, world: int) -> dict:
    """Plain and top-k gossip trained 6 steps apart (each rank its own batches), then ``finish``."""
    out = {}
    for method in ("none", "topk"):
        gate: list[int] = []
        sync = GossipSync(SyncContext(rank, world, job_spec(sync="gossip", method=method, ratio=0.1), CommStats(),
                                      check_gate=lambda g=gate: g.append(1)))
        torch.manual_seed(rank)
        model = sync.wrap(MLP(INFO))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(1, 7):
            opt.zero_grad()
            x, y = batch(rank, step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sync.after_step(model, step)
        evaluated = sync.consensus(model, 6)
        asked = len(gate)
        sync.finish(model, 6)
        out[method] = {"evaluated": evaluated, "gate": len(gate) - asked, "same": sync.consensus(model, 6) is None,
                       "after": gather(parameters_to_vector(model.parameters()).detach(), world)}
    return out


def test_gossip_finishes_as_the_model_its_evaluation_measured():
    """When training ends (``finish``, 3 ranks on a ring) every replica takes the replicas' average, once the commit
    gate's check passes: the model the final evaluation measures (an evaluation before it sees the same average)
    and the one rank 0's checkpoint then holds. The evaluation after it uses the parameters themselves."""
    ranks = run_ranks(_gossip_finish, 3)
    for method, got in ranks[0].items():
        after = got["after"]
        assert torch.equal(after[0], after[1]) and torch.equal(after[0], after[2]), method
        assert torch.equal(after[0], got["evaluated"]), method
        assert all(r[method]["gate"] == 1 and r[method]["same"] for r in ranks), method


def _straggler(rank: int, world: int) -> dict:
    ctx = SyncContext(rank, world, job_spec(sync="gossip", method="none"), CommStats())
    torch.manual_seed(rank)
    model = MLP(INFO)
    sync = GossipSync(ctx)
    t0 = time.perf_counter()
    for step in range(1, 61):
        # "Compute" is a sleep, so the test measures waiting, not how busy the machine's cores are.
        time.sleep(0.03 if rank == world - 1 else 0.01)
        sync.after_step(model, step)
    elapsed = time.perf_counter() - t0
    return {"elapsed": elapsed, "consensus": sync.consensus(model, 60)}


def test_gossip_does_not_wait_for_a_straggler():
    """Rank 3 computes 3x as long per step. Its neighbours stop waiting for it, so the other
    ranks finish their 60 steps (0.6 s of compute) in under 0.7x the straggler's time (1.8 s)."""
    results = run_ranks(_straggler, 4)
    slow = results[3]["elapsed"]
    for r in results[:3]:
        assert r["elapsed"] < 0.7 * slow, [x["elapsed"] for x in results]
    for r in results[1:]:
        assert torch.equal(r["consensus"], results[0]["consensus"])  # evaluation sees one model


def _world_change(rank: int, world: int, alone: int, three: int) -> dict:
    """Gossip in a world of 4, then (rank 3 gone, receives still posted) in a new world of 3."""
    ctx = SyncContext(rank, world, job_spec(sync="gossip", method="topk", ratio=0.1), CommStats())
    torch.manual_seed(rank)
    model = MLP(INFO)
    sync = GossipSync(ctx)
    for step in range(1, 6):
        sync.after_step(model, step)
    dist.destroy_process_group()  # no settle: a world change interrupts whatever is in flight
    if rank == 3:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{alone}", rank=0, world_size=1)
        return {}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{three}", rank=rank, world_size=3)
    sync = GossipSync(SyncContext(rank, 3, job_spec(sync="gossip", method="topk", ratio=0.1), CommStats()))
    before, _ = _disagreement(model, 3)
    for step in range(6, 36):
        sync.after_step(model, step)
    sync.settle(model)
    after, _ = _disagreement(model, 3)
    return {"before": before, "after": after}


def test_gossip_keeps_working_after_the_world_shrinks():
    from cohort.trainer.runtime.ports import free_ports

    group, alone, three = free_ports(3)  # the first world's, then rank 3's and the new world's
    results = run_ranks(_world_change, 4, alone, three, port=group)
    for r in results[:3]:
        assert r["after"] < 0.9 * r["before"], r


def _gossip_consensus_of(rank: int, world: int) -> dict:
    ctx = SyncContext(rank, world, job_spec(sync="gossip", method="qsgd", topology="exponential"), CommStats())
    torch.manual_seed(rank)
    model = MLP(INFO)
    sync = GossipSync(ctx)
    for step in range(1, 4):
        sync.after_step(model, step)
    sync.settle(model)
    mine = parameters_to_vector(model.parameters()).detach().clone()
    consensus = sync.consensus(model, 3)
    return {"mine": mine, "after_eval": parameters_to_vector(model.parameters()).detach(),
            "all": gather(mine, world), "consensus": consensus}


def test_gossip_evaluates_the_average_without_touching_training_state():
    results = run_ranks(_gossip_consensus_of, 3)
    for r in results:
        torch.testing.assert_close(r["consensus"], r["all"].mean(0), atol=1e-6, rtol=0)
        assert torch.equal(r["after_eval"], r["mine"])


# --- consensus distance vs learning rate ---------------------------------------------------

def _consensus_vs_lr(rank: int, world: int, lrs: list[float], methods: list[str], steps: int) -> dict:
    data = digits()
    out = {}
    for method in methods:
        for lr in lrs:
            ctx = SyncContext(rank, world, job_spec(sync="gossip", method=method), CommStats())
            torch.manual_seed(0)
            model = MLP(data.info)
            sync = GossipSync(ctx)
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            g = torch.Generator().manual_seed(0)
            for step in range(1, steps + 1):
                idx = torch.randperm(len(data.train), generator=g)[rank * 32:(rank + 1) * 32]
                opt.zero_grad()
                F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
                opt.step()
                sync.after_step(model, step)
            sync.settle(model)
            out[(method, lr)] = _disagreement(model, world)[0]
    return out


def test_gossip_consensus_distance_shrinks_with_the_learning_rate():
    """D-PSGD (Lian et al. 2017): replicas stay within O(lr) of their average. After the same
    40 steps on digits (4 ranks, ring), mean ||w_i - w_bar|| decreases with lr, and at lr/100
    it is under 5% of its value at lr — for plain gossip and for CHOCO with top-k."""
    lrs = [0.1, 0.01, 0.001]
    dist_by = run_ranks(_consensus_vs_lr, 4, lrs, ["none", "topk"], 40)[0]
    for method in ("none", "topk"):
        d = [dist_by[(method, lr)] for lr in lrs]
        assert d[0] > d[1] > d[2] > 0, (method, d)
        assert d[2] < 0.05 * d[0], (method, d)
