"""Cohort's compressors against independent reference definitions, on identical tensors.

The references below are written from the papers' definitions, in the form the
GRACE framework uses for its torch compressors (Xu, Ho, Sahu, Kalnis et al.,
"GRACE: A Compressed Communication Framework for Distributed Machine Learning",
ICDCS 2021; its public code, sands-lab/grace, was read for the conventions, not
copied). They work on a plain tensor, with no packing, chunking bookkeeping or
seeds: each stochastic reference takes the uniform draws as an argument, and
the test hands it the draws Cohort's compressor makes from the same seed
(``torch.rand(n, generator=seed)``), so the two must agree element by element.

Deliberate differences from GRACE, each asserted here rather than hidden:

- random-k: GRACE sends the k values unscaled (biased); Cohort scales them by n/k
  (unbiased) under allreduce and sends them unscaled only for gossip (``contractive``).
- TernGrad: GRACE clips at 2.5 standard deviations first; Cohort does not clip.
- QSGD and TernGrad: GRACE takes one norm (or peak) per tensor; Cohort one per chunk
  of ``chunkSize`` elements, which equals GRACE's applied to each chunk.
- DGC: GRACE estimates a threshold from a 1% sample and sends a varying number of
  entries (0.7k to 1.3k); Cohort sends exactly the top k of the accumulated velocity
  (fixed-size payloads). Neither clips the gradient here.
- threshold: GRACE sends every entry at or above the threshold (payloads of any
  size); Cohort's payload holds at most k = ceil(ratio * n) of them, the largest.
- natural compression: GRACE rounds an exact power of two up to twice itself (its
  probability of rounding down is 0 there: biased) and clamps exponents to
  [-110, 17] to fit 8 bits; Cohort keeps powers of two and spends 9 bits on the
  whole fp32 exponent range.
- 1-bit SGD: GRACE takes the two means per tensor; Cohort per chunk.
- Signum: GRACE starts the momentum at m_1 = g_1, the paper (and Cohort) at
  m_0 = 0, so m_1 = (1 - beta) g_1; and GRACE's majority vote turns a tie into
  +1, Cohort's (the sign of the sum) into 0.
"""

from __future__ import annotations

import pytest
import torch

from cohort.trainer.compression.base import generator, kept
from cohort.trainer.compression.dgc import DGC, DGCConfig, MomentumCorrection
from cohort.trainer.compression.error_feedback import ErrorFeedback
from cohort.trainer.compression.quantize import QSGD, Natural, QSGDConfig, TernGrad, TernGradConfig
from cohort.trainer.compression.sign import OneBit, OneBitConfig, ScaledSign, Signum, SignumConfig, SignumMomentum
from cohort.trainer.compression.sparsify import RandomK, RandomKConfig, Threshold, ThresholdConfig, TopK, TopKConfig

SEED = 1234


def gradient(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.rand(n, generator=g).pow(3)  # heavy-tailed magnitudes


def uniforms(n: int) -> torch.Tensor:
    return torch.rand(n, generator=generator(SEED))


# --- the references ------------------------------------------------------------------

def ref_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    out = torch.zeros_like(x)
    idx = torch.topk(x.abs(), k).indices
    out[idx] = x[idx]
    return out


def ref_randomk(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    out[indices] = x[indices]
    return out


def ref_qsgd(x: torch.Tensor, s: int, u: torch.Tensor) -> torch.Tensor:
    """Alistarh et al. 2017: ||x|| / s * sign(x) * (floor(l) + [u < l - floor(l)]), l = s |x| / ||x||."""
    norm = x.norm()
    level = s / norm * x.abs()
    low = level.floor()
    return norm / s * x.sign() * (low + (u < level - low).float())


def ref_terngrad(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Wen et al. 2017 without clipping: max|x| * sign(x) where u * max|x| < |x|, else 0."""
    peak = x.abs().max()
    return torch.where(u * peak < x.abs(), x.sign() * peak, torch.zeros_like(x))


def ref_scaled_sign(x: torch.Tensor) -> torch.Tensor:
    """EF-SignSGD's compressor (Karimireddy et al. 2019): mean |x| times the sign, 0 counted as +."""
    return x.abs().mean() * torch.where(x >= 0, 1.0, -1.0)


def ref_threshold(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """GRACE's threshold compressor (Strom 2015): every entry with |x| >= threshold."""
    return torch.where(x.abs() >= threshold, x, torch.zeros_like(x))


def ref_natural(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Horvath et al. 2019: with 2^a <= |x| < 2^(a+1), sign(x) 2^(a+1) where u < (|x| - 2^a)/2^a, else sign(x) 2^a."""
    low = torch.exp2(torch.floor(torch.log2(x.abs().double())))
    up = u.double() < (x.abs().double() - low) / low
    return (x.sign().double() * torch.where(up, 2 * low, low)).float()


def grace_natural_up_probability(x: torch.Tensor) -> torch.Tensor:
    """GRACE's form of the probability of rounding up: 1 - (2^ceil(log2|x|) - |x|) / 2^floor(log2|x|)."""
    log = torch.log2(x.abs().double())
    return 1 - (torch.exp2(log.ceil()) - x.abs().double()) / torch.exp2(log.floor())


def ref_onebit(x: torch.Tensor) -> torch.Tensor:
    """1-bit SGD (Seide et al. 2014) as GRACE writes it: negatives become their mean, the rest theirs."""
    neg = x < 0
    mean_neg = x[neg].mean() if neg.any() else torch.zeros(())
    mean_pos = x[~neg].mean() if (~neg).any() else torch.zeros(())
    return torch.where(neg, mean_neg, mean_pos)


def ref_dgc(grads: list[torch.Tensor], m: float, k: int) -> list[torch.Tensor]:
    """DGC (Lin et al. 2018, Algorithm 1 with momentum correction and factor masking), with exact top-k."""
    u, v, out = torch.zeros_like(grads[0]), torch.zeros_like(grads[0]), []
    for g in grads:
        u = m * u + g
        v = v + u
        idx = torch.topk(v.abs(), k).indices
        sent = torch.zeros_like(v)
        sent[idx] = v[idx]
        u[idx] = 0.0
        v[idx] = 0.0
        out.append(sent)
    return out


def ref_signum_vote(grads_per_rank: list[list[torch.Tensor]], beta: float) -> list[torch.Tensor]:
    """Signum with majority vote (Bernstein et al. 2018): m_r = beta m_r + (1 - beta) g_r from m_r = 0,
    each rank sends sign(m_r) (0 counted as +), the result is sign(sum_r sign(m_r))."""
    momenta, out = [torch.zeros_like(g[0]) for g in grads_per_rank], []
    for t in range(len(grads_per_rank[0])):
        signs = []
        for r, grads in enumerate(grads_per_rank):
            momenta[r] = beta * momenta[r] + (1 - beta) * grads[t]
            signs.append(torch.where(momenta[r] >= 0, 1.0, -1.0))
        out.append(torch.stack(signs).sum(0).sign())
    return out


def per_chunk(ref, x: torch.Tensor, chunk: int, u: torch.Tensor | None = None) -> torch.Tensor:
    parts = []
    for start in range(0, x.numel(), chunk):
        piece = slice(start, start + chunk)
        parts.append(ref(x[piece]) if u is None else ref(x[piece], u[piece]))
    return torch.cat(parts)


# --- the comparisons -------------------------------------------------------------------

N = 10_000


def test_topk_selects_the_same_entries_with_the_same_signs_and_values():
    x = gradient(N, 1)
    for ratio in (0.001, 0.01, 0.1):
        got = TopK(TopKConfig(ratio=ratio)).roundtrip(x, SEED)[1]
        assert torch.equal(got, ref_topk(x, kept(N, ratio)))


def test_per_tensor_topk_equals_the_reference_applied_to_each_tensor():
    x, sizes = gradient(N, 6), [6000, 2500, 1000, 400, 100]
    got = TopK(TopKConfig(ratio=0.01, per_tensor=True)).layout(sizes).roundtrip(x, SEED)[1]
    want = torch.cat([ref_topk(part, kept(part.numel(), 0.01)) for part in x.split(sizes)])
    assert torch.equal(got, want)


def test_randomk_is_the_reference_unscaled_for_gossip_and_scaled_by_n_over_k_otherwise():
    x, ratio = gradient(N, 2), 0.05  # k = 500 exactly: GRACE's floor and Cohort's ceil agree
    k = kept(N, ratio)
    assert k == int(N * ratio)
    indices = torch.randperm(N, generator=generator(SEED))[:k]  # the draw both ends derive from the seed
    reference = ref_randomk(x, indices)
    assert torch.equal(RandomK(RandomKConfig(ratio=ratio, contractive=True)).roundtrip(x, SEED)[1], reference)
    torch.testing.assert_close(RandomK(RandomKConfig(ratio=ratio)).roundtrip(x, SEED)[1], reference * (N / k),
                               rtol=1e-6, atol=0)


@pytest.mark.parametrize("levels", [4, 256])
@pytest.mark.parametrize("chunk", [N, 512, 100])
def test_qsgd_equals_the_reference_applied_to_each_chunk(levels, chunk):
    x, u = gradient(N, 3), uniforms(N)
    got = QSGD(QSGDConfig(levels=levels, chunk_size=chunk)).roundtrip(x, SEED)[1]
    want = per_chunk(lambda xc, uc: ref_qsgd(xc, levels, uc), x, chunk, u)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [N, 512, 100])
def test_terngrad_equals_the_unclipped_reference_applied_to_each_chunk(chunk):
    x, u = gradient(N, 4), uniforms(N)
    got = TernGrad(TernGradConfig(chunk_size=chunk)).roundtrip(x, SEED)[1]
    torch.testing.assert_close(got, per_chunk(ref_terngrad, x, chunk, u), rtol=1e-6, atol=0)


def test_scaled_sign_equals_ef_signsgds_compressor_including_zero():
    x = gradient(N, 5)
    x[::97] = 0.0
    torch.testing.assert_close(ScaledSign().roundtrip(x, SEED)[1], ref_scaled_sign(x), rtol=1e-6, atol=0)


def test_error_feedback_equals_the_residual_memory_step_by_step():
    """GRACE's residual memory (and Seide et al. 2014): p_t = g_t + e_{t-1}, send C(p_t),
    e_t = p_t - C(p_t). Cohort's ErrorFeedback must produce the same residual and the same
    message at every step, so sum(sent) + e_T = sum(g) (checked exactly at the end)."""
    ef, topk, k = ErrorFeedback(), TopK(TopKConfig(ratio=0.01)), kept(N, 0.01)
    residual, sent_sum, grad_sum = torch.zeros(N), torch.zeros(N, dtype=torch.float64), torch.zeros(N, dtype=torch.float64)
    for step in range(20):
        g = gradient(N, 100 + step)
        p = g + residual
        reference_sent = ref_topk(p, k)
        residual = p - reference_sent
        compensated = ef.compensate("bucket", g)
        sent = topk.roundtrip(compensated, SEED)[1]
        ef.update("bucket", compensated, sent)
        assert torch.equal(sent, reference_sent), step
        assert torch.equal(ef.residuals["bucket"], residual), step
        sent_sum += sent.double()
        grad_sum += g.double()
    torch.testing.assert_close(sent_sum + residual.double(), grad_sum, rtol=0, atol=1e-5)


# --- dgc, threshold, natural, onebit, signum ------------------------------------------

def test_dgc_sends_what_the_papers_algorithm_sends_at_every_step():
    m, ratio = 0.9, 0.01
    grads = [gradient(N, 400 + t) for t in range(20)]
    want = ref_dgc(grads, m, kept(N, ratio))
    c, mem = DGC(DGCConfig(ratio=ratio, momentum=m)), MomentumCorrection(m)
    for t, g in enumerate(grads):
        x = mem.compensate("bucket", g)
        sent = c.roundtrip(x, SEED)[1]
        mem.update("bucket", x, sent)
        assert torch.equal(sent, want[t]), t
        assert int(sent.count_nonzero()) == kept(N, ratio)  # exactly k (GRACE: 0.7k to 1.3k)


def test_threshold_equals_the_reference_below_capacity_and_keeps_the_largest_above_it():
    x = gradient(N, 7)
    t = 0.5
    above = int((x.abs() >= t).sum())
    roomy = Threshold(ThresholdConfig(threshold=t, ratio=1.0))
    assert torch.equal(roomy.roundtrip(x, SEED)[1], ref_threshold(x, t))
    tight = Threshold(ThresholdConfig(threshold=t, ratio=0.5 * above / N))  # room for half of them
    got = tight.roundtrip(x, SEED)[1]
    assert not torch.equal(got, ref_threshold(x, t))  # the deliberate difference: a capacity
    assert torch.equal(got, ref_topk(x, kept(N, 0.5 * above / N)))


def test_natural_equals_the_papers_rounding_on_the_same_draws():
    x, u = gradient(N, 8), uniforms(N)
    x[x == 0] = 1e-3
    torch.testing.assert_close(Natural().roundtrip(x, SEED)[1], ref_natural(x, u), rtol=0, atol=0)


def test_natural_keeps_powers_of_two_and_the_whole_fp32_range_where_grace_does_not():
    powers = torch.tensor([1.0, -0.5, 2.0**20, -(2.0**-120), 2.0**-3])
    p_grace = grace_natural_up_probability(powers)
    assert (p_grace == 1).all()  # GRACE rounds 2^a up to 2^(a+1) for sure
    nonpowers = gradient(1000, 9)
    nonpowers = nonpowers[nonpowers != 0]
    low = torch.exp2(torch.floor(torch.log2(nonpowers.abs().double())))
    torch.testing.assert_close(grace_natural_up_probability(nonpowers), (nonpowers.abs().double() - low) / low)
    for seed in range(20):  # Cohort: exact powers of two (2^20 and 2^-120 beyond GRACE's clamp) pass unchanged
        assert torch.equal(Natural().roundtrip(powers, seed)[1], powers)


@pytest.mark.parametrize("chunk", [N, 512, 100])
def test_onebit_equals_the_reference_applied_to_each_chunk(chunk):
    x = gradient(N, 10)
    got = OneBit(OneBitConfig(chunk_size=chunk)).roundtrip(x, SEED)[1]
    torch.testing.assert_close(got, per_chunk(ref_onebit, x, chunk), rtol=2e-6, atol=0)


def test_signum_majority_vote_equals_the_papers_over_steps_and_ranks():
    beta, world, steps = 0.9, 4, 10
    grads = [[gradient(N, 1000 * r + t) for t in range(steps)] for r in range(world)]
    want = ref_signum_vote(grads, beta)
    c, memories = Signum(SignumConfig(momentum=beta)), [SignumMomentum(beta) for _ in range(world)]
    ties = 0
    for t in range(steps):
        total = torch.zeros(N)
        for r in range(world):
            x = memories[r].compensate(0, grads[r][t])
            sent = c.roundtrip(x, SEED)[1]
            memories[r].update(0, x, sent)
            total += sent
        assert torch.equal(c.combine(total, world), want[t]), t
        ties += int((want[t] == 0).sum())
    assert ties > 0  # 2-2 ties happen at P = 4: Cohort votes 0 there, GRACE +1


def test_signum_momentum_differs_from_graces_by_beta_to_the_t_times_the_first_gradient():
    beta = 0.9
    grads = [gradient(N, 500 + t) for t in range(6)]
    mem, grace = SignumMomentum(beta), None
    for t, g in enumerate(grads, start=1):
        mine = mem.compensate(0, g)
        grace = g.clone() if grace is None else (1 - beta) * g + beta * grace
        torch.testing.assert_close(grace - mine, beta**t * grads[0], rtol=1e-4, atol=1e-6)
