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
"""

from __future__ import annotations

import pytest
import torch

from cohort.trainer.compression.base import generator, kept
from cohort.trainer.compression.error_feedback import ErrorFeedback
from cohort.trainer.compression.quantize import QSGD, QSGDConfig, TernGrad, TernGradConfig
from cohort.trainer.compression.sign import ScaledSign
from cohort.trainer.compression.sparsify import RandomK, RandomKConfig, TopK, TopKConfig

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
