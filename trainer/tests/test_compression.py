"""Properties of the compressors, packing, error feedback and gossip topologies (unit, no processes).

Statistical tests draw a fixed set of seeds, so they are deterministic; their
tolerances are stated where they are used.
"""

from __future__ import annotations

import math

import pytest
import torch

from cohort.api.models import ALL_COMPRESSION
from cohort.trainer.compression import packing
from cohort.trainer.compression.base import Compressor, Unsupported, derive_seed, kept
from cohort.trainer.compression.dgc import DGC, DGCConfig, MomentumCorrection
from cohort.trainer.compression.error_feedback import ErrorFeedback
from cohort.trainer.compression.fp8 import FP8, FP8Config
from cohort.trainer.compression.quantize import QSGD, Natural, QSGDConfig, TernGrad, TernGradConfig
from cohort.trainer.compression.registry import METHODS
from cohort.trainer.compression.sign import OneBit, OneBitConfig, ScaledSign, Signum, SignumConfig, SignumMomentum
from cohort.trainer.compression.sparse_allreduce import owned, pack_pairs, unpack_pairs
from cohort.trainer.compression.sparsify import RandomK, RandomKConfig, Threshold, ThresholdConfig, TopK, TopKConfig
from cohort.trainer.sync import topology

# The payload compressors (every method but powersgd, which is torch's hook).
COMPRESSORS = {name: cls for name, cls in METHODS.items() if issubclass(cls, Compressor)}
MLP_PARAMS = 64 * 128 + 128 + 128 * 10 + 10  # examples/digits.yaml's model: 9610 parameters


def vector(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.rand(n, generator=g)  # uneven magnitudes


def samples(compressor, x: torch.Tensor, draws: int) -> torch.Tensor:
    return torch.stack([compressor.roundtrip(x, derive_seed(7, i))[1] for i in range(draws)])


# --- registry ------------------------------------------------------------------

def test_registry_covers_the_crd_enum():
    assert list(METHODS) == list(ALL_COMPRESSION)
    assert all(cls.name == key for key, cls in METHODS.items())
    assert set(METHODS) - set(COMPRESSORS) == {"powersgd"}


def supports(method, capability) -> bool:
    try:
        capability(method)
    except Unsupported:
        return False
    return True


@pytest.mark.parametrize("name", list(METHODS))
def test_each_class_implements_exactly_the_syncs_the_api_declares(name):
    """The API declares the pairs once (SUPPORTED_COMPRESSION, which admission's CEL rule comes from);
    the class must implement every sync it is declared for, and refuse the others."""
    method = METHODS[name]()
    syncs = method.syncs()
    assert "allreduce" in syncs  # every method has a DDP hook (none: DDP's own)
    gossips = isinstance(method, Compressor) and supports(method, lambda m: m.consensus_step())
    assert gossips == ("gossip" in syncs), name
    assert supports(method, lambda m: m.localsgd_mean()) == ("localsgd" in syncs), name
    if gossips:
        assert 0 < method.consensus_step() <= 1


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_payload_is_uint8_of_the_advertised_fixed_size(name):
    c = COMPRESSORS[name]()
    for n in (1, 7, 100, MLP_PARAMS):
        payload, decoded = c.roundtrip(vector(n), seed=3)
        assert payload.dtype == torch.uint8 and payload.dim() == 1
        assert payload.numel() == c.payload_nbytes(n)
        assert decoded.shape == (n,) and decoded.dtype == torch.float32
        assert torch.isfinite(decoded).all()


# --- unbiasedness ----------------------------------------------------------------

UNBIASED = {
    "qsgd": QSGD(QSGDConfig(levels=4)),        # few levels: a large variance to average out
    "randomk": RandomK(RandomKConfig(ratio=0.25)),
    "terngrad": TernGrad(),
    "natural": Natural(),
}


@pytest.mark.parametrize("name", sorted(UNBIASED))
def test_stochastic_compressors_are_unbiased(name):
    """E[C(x)] = x. Over 4000 draws, every coordinate's sample mean is within
    5 standard errors of x_i (per-coordinate standard error from the same draws;
    with 64 coordinates a false alarm has probability below 1e-4)."""
    x, draws = vector(64, seed=1), 4000
    s = samples(UNBIASED[name], x, draws)
    mean, stderr = s.mean(0), s.std(0) / math.sqrt(draws)
    assert (stderr > 0).any(), "the compressor must actually be random"
    assert ((mean - x).abs() <= 5 * stderr + 1e-6).all(), (mean - x).abs().max()


def test_contractive_randomk_and_terngrad_scale_by_one_over_one_plus_omega():
    x, draws = vector(64, seed=2), 4000
    rk = RandomK(RandomKConfig(ratio=0.25, contractive=True))
    mean = samples(rk, x, draws).mean(0)
    torch.testing.assert_close(mean, x * kept(64, 0.25) / 64, atol=0.02, rtol=0)
    # TernGrad contractive: E[C(x)] = x * ||x||^2 / (max|x| * ||x||_1).
    tg = TernGrad(TernGradConfig(contractive=True))
    mean = samples(tg, x, draws).mean(0)
    shrink = float(x.pow(2).sum() / (x.abs().max() * x.abs().sum()))
    torch.testing.assert_close(mean, x * shrink, atol=0.02, rtol=0)


@pytest.mark.parametrize("levels", [2, 4, 16, 256])
@pytest.mark.parametrize("n", [100, 10_000])
@pytest.mark.parametrize("chunk_size", [64, 512, 1 << 30])
def test_qsgd_variance_is_within_the_papers_bound(levels, n, chunk_size):
    """Alistarh et al. 2017, Lemma 3.1 applied per chunk of d elements and summed:
    E||Q(x) - x||^2 <= min(d/s^2, sqrt(d)/s) ||x||^2, with d = min(chunk_size, n).
    The expectation is estimated from 100 draws; the bound must hold for the estimate."""
    x = vector(n, seed=levels)
    q = QSGD(QSGDConfig(levels=levels, chunk_size=chunk_size))
    err = (samples(q, x, 100) - x).pow(2).sum(1).mean()
    d = min(chunk_size, n)
    bound = min(d / levels**2, math.sqrt(d) / levels) * float(x.pow(2).sum())
    assert float(err) <= bound
    assert q.variance_factor(n) * float(x.pow(2).sum()) == pytest.approx(bound)


def test_quantiser_payloads_count_one_fp32_scale_per_chunk():
    n = 10_000  # 20 chunks of 512 (the last one partial)
    assert QSGD().payload_nbytes(n) == 4 * 20 + packing.packed_nbytes(n, 10)  # 256 levels: 9 bits + sign
    assert TernGrad().payload_nbytes(n) == 4 * 20 + packing.packed_nbytes(n, 2)
    assert QSGD(QSGDConfig(chunk_size=1 << 30)).payload_nbytes(n) == 4 + packing.packed_nbytes(n, 10)


def mixed_bucket() -> tuple[torch.Tensor, slice]:
    """A 25 MiB DDP bucket (6.5 M fp32) holding a large layer and, at a chunk boundary, a
    small layer whose entries are 1000x smaller; returns it and the small layer's slice."""
    g = torch.Generator().manual_seed(11)
    big, small = 25 * 2**20 // 4 - 8192, 8192
    x = torch.cat([torch.randn(big, generator=g), 1e-3 * torch.randn(small, generator=g)])
    return x, slice(big, big + small)


def relative_error(c: Compressor, x: torch.Tensor, part: slice = slice(None)) -> float:
    err = c.roundtrip(x, seed=5)[1] - x
    return float(err[part].pow(2).sum() / x[part].pow(2).sum())


def test_qsgd_error_is_bounded_per_chunk_on_a_25_mib_bucket_that_mixes_scales():
    """With one norm per 512 elements the error stays within the per-chunk bound for the
    bucket and for its small layer. The control, one norm for the whole bucket (what
    Cohort did before chunking), has an error above ||x||^2 and leaves the small layer no
    signal: its entries round to zero (or, rarely, to a spike the size of the big layer's)."""
    x, small = mixed_bucket()
    q = QSGD()
    omega = q.variance_factor(x.numel())
    assert omega == pytest.approx(512 / 256**2)
    assert relative_error(q, x) <= omega
    assert relative_error(q, x, small) <= omega
    whole = QSGD(QSGDConfig(chunk_size=x.numel()))
    assert relative_error(whole, x) > 1.0
    assert relative_error(whole, x, small) >= 0.99


def test_terngrad_error_matches_its_variance_per_chunk_on_a_25_mib_bucket():
    """TernGrad's variance is exact: E||Q(x_c) - x_c||^2 = max|x_c| * ||x_c||_1 - ||x_c||^2
    per chunk. One draw over 6.5 M entries lands within 1 % of the sum, and the small layer
    keeps a relative error near the Gaussian chunk's (about 1.4), not the ~4000 it gets
    against the whole bucket's peak."""
    x, small = mixed_bucket()
    rows = x.view(-1, 512)
    expected = float((rows.abs().amax(1) * rows.abs().sum(1) - rows.pow(2).sum(1)).sum() / x.pow(2).sum())
    t = TernGrad()
    assert relative_error(t, x) == pytest.approx(expected, rel=0.01)
    assert relative_error(t, x, small) < 3.0
    assert relative_error(TernGrad(TernGradConfig(chunk_size=x.numel())), x, small) > 100.0


# --- biased compressors ----------------------------------------------------------

def test_topk_selects_the_k_largest_magnitudes():
    x = vector(1000, seed=4)
    c = TopK(TopKConfig(ratio=0.05))
    decoded = c.roundtrip(x, seed=0)[1]
    k = kept(1000, 0.05)
    expected = set(torch.argsort(x.abs(), descending=True)[:k].tolist())
    assert set(decoded.nonzero().flatten().tolist()) == expected
    torch.testing.assert_close(decoded[list(expected)], x[list(expected)], rtol=0, atol=0)


def test_per_tensor_topk_keeps_each_small_layers_share_where_bucket_topk_keeps_none():
    """A bucket holding a 100,000-entry layer and, after it, a 1,000-entry layer whose entries
    are 1000x smaller: top-1% over the bucket keeps none of the small layer's entries;
    perTensor keeps ceil(1% of each), the largest of each, and the payload counts both."""
    g = torch.Generator().manual_seed(8)
    big, small = torch.randn(100_000, generator=g), 1e-3 * torch.randn(1000, generator=g)
    x = torch.cat([big, small])
    bucket = TopK(TopKConfig(ratio=0.01)).roundtrip(x, seed=0)[1]
    assert int(bucket[100_000:].count_nonzero()) == 0
    c = TopK(TopKConfig(ratio=0.01, per_tensor=True)).layout([100_000, 1000])
    payload, decoded = c.roundtrip(x, seed=0)
    assert payload.numel() == c.payload_nbytes(x.numel()) == 8 * (1000 + 10)
    for part, k in ((slice(0, 100_000), 1000), (slice(100_000, None), 10)):
        expected = set(torch.topk(x[part].abs(), k).indices.tolist())
        assert set(decoded[part].nonzero().flatten().tolist()) == expected
    assert torch.equal(decoded[decoded != 0], x[decoded != 0])
    with pytest.raises(ValueError, match="layout"):
        c.roundtrip(x[:-1], seed=0)
    assert TopK(TopKConfig(ratio=0.01)).layout([100_000, 1000]).payload_nbytes(101_000) == 8 * 1010


@pytest.mark.parametrize("numel,world", [(10, 3), (9610, 4), (7, 8), (100_000, 8)])
def test_sparse_allreduce_shares_tile_the_index_space_and_pairs_round_trip(numel, world):
    shares = [owned(numel, world, r) for r in range(world)]
    assert sum(shares) == numel and max(shares) - min(shares) <= 1
    assert shares == [len(range(r, numel, world)) for r in range(world)]
    idx = torch.randperm(numel, generator=torch.Generator().manual_seed(1))[: max(1, numel // 10)]
    vals = torch.randn(idx.numel())
    got_idx, got_vals = unpack_pairs(pack_pairs(idx, vals))
    assert torch.equal(got_idx, idx) and torch.equal(got_vals, vals)


def test_signsgd_sends_one_bit_per_element_and_the_mean_magnitude():
    n = MLP_PARAMS
    c = ScaledSign()
    assert c.payload_nbytes(n) == 4 + math.ceil(n / 8)  # 1 bit each, plus one fp32 scale
    x = vector(n, seed=5)
    decoded = c.roundtrip(x, seed=0)[1]
    scale = float(x.abs().mean())
    assert torch.allclose(decoded.abs(), torch.full((n,), scale))
    assert torch.equal(decoded > 0, x >= 0)


def test_compression_ratios_on_the_digits_model():
    """The issue's targets, for a dense fp32 gradient of examples/digits.yaml's MLP."""
    assert TopK(TopKConfig(ratio=0.01)).ratio(MLP_PARAMS) >= 40
    assert ScaledSign().ratio(MLP_PARAMS) >= 30
    assert COMPRESSORS["fp16"]().ratio(MLP_PARAMS) == 2


@pytest.mark.parametrize("name", ["topk", "signsgd", "threshold", "onebit"])
def test_error_feedback_keeps_what_was_not_sent(name):
    """After T steps: sum(sent) + residual == sum(gradients) (up to fp32 rounding)."""
    c, ef = COMPRESSORS[name](), ErrorFeedback()
    grads_total = torch.zeros(500, dtype=torch.float64)
    sent_total = torch.zeros(500, dtype=torch.float64)
    for t in range(50):
        g = vector(500, seed=100 + t)
        x = ef.compensate("bucket", g)
        _, sent = c.roundtrip(x, seed=t)
        ef.update("bucket", x, sent)
        grads_total += g.double()
        sent_total += sent.double()
    residual = ef.residuals["bucket"].double()
    torch.testing.assert_close(sent_total + residual, grads_total, atol=1e-4, rtol=0)
    assert residual.norm() > 0  # something really was held back


def test_biased_methods_get_their_memory_from_the_class():
    """Error feedback for the biased payload methods (unless errorFeedback is off); dgc and
    signum keep their own momentum whatever errorFeedback says; the unbiased ones keep nothing."""
    for name, cls in COMPRESSORS.items():
        on, off = cls().memory(True), cls().memory(False)
        if name == "dgc":
            assert isinstance(on, MomentumCorrection) and isinstance(off, MomentumCorrection)
        elif name == "signum":
            assert isinstance(on, SignumMomentum) and isinstance(off, SignumMomentum)
        elif name in ("topk", "signsgd", "threshold", "onebit"):
            assert isinstance(on, ErrorFeedback) and off is None, name
        else:
            assert on is None and off is None, name


def test_error_feedback_resets_when_a_bucket_changes_size():
    ef = ErrorFeedback()
    ef.update(0, torch.ones(4), torch.zeros(4))
    torch.testing.assert_close(ef.compensate(0, torch.ones(4)), torch.full((4,), 2.0))
    torch.testing.assert_close(ef.compensate(0, torch.ones(6)), torch.ones(6))


# --- the methods from GRACE's set: dgc, threshold, natural, onebit, signum ---------

def test_dgc_momentum_correction_accumulates_velocity_and_masks_what_was_sent():
    """Lin et al. 2018, §3.2-3.3, step by step against the recurrence written out here:
    u = m u + g, v = v + u, send top-k(v), then u and v are 0 at the sent entries. The
    invariant of the accumulation: sum(sent) + v_T = sum_t u_t (u_t as it was added to v)."""
    n, m, ratio = 400, 0.9, 0.02
    c, mem = DGC(DGCConfig(ratio=ratio, momentum=m)), MomentumCorrection(m)
    u, v = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    sent_total, u_total = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    for t in range(30):
        g = vector(n, seed=200 + t)
        u = m * u + g.double()
        v = v + u
        u_total += u
        x = mem.compensate("bucket", g)
        torch.testing.assert_close(x.double(), v, atol=1e-5, rtol=1e-6)
        _, sent = c.roundtrip(x, seed=t)
        mem.update("bucket", x, sent)
        chosen = sent != 0
        assert int(chosen.sum()) == kept(n, ratio)
        assert set(chosen.nonzero().flatten().tolist()) == set(torch.topk(x.abs(), kept(n, ratio)).indices.tolist())
        # Momentum factor masking: both u and v restart from 0 where an entry went.
        assert (mem.velocity["bucket"][chosen] == 0).all() and (mem.accumulated["bucket"][chosen] == 0).all()
        assert (mem.velocity["bucket"][~chosen] != 0).all()
        u[chosen.numpy()] = 0.0
        v[chosen.numpy()] = 0.0
        sent_total += sent.double()
    torch.testing.assert_close(sent_total + mem.accumulated["bucket"].double(), u_total, atol=1e-4, rtol=0)


def test_dgc_payload_is_topks_and_it_refuses_gossip_and_the_sparse_collective():
    n = MLP_PARAMS
    assert DGC().payload_nbytes(n) == TopK().payload_nbytes(n) == 8 * kept(n, 0.01)
    x = vector(n, seed=9)
    assert torch.equal(DGC().roundtrip(x, 0)[1], TopK().roundtrip(x, 0)[1])  # the wire is top-k's
    with pytest.raises(Unsupported):
        DGC().consensus_step()


def test_threshold_sends_the_entries_above_it_up_to_a_fixed_capacity():
    """Below capacity: exactly the entries with |x| >= threshold (the count says how many of the
    k slots are real). Above it: the k largest. The payload size never changes."""
    x = vector(1000, seed=12)
    c = Threshold(ThresholdConfig(threshold=1.0, ratio=0.2))  # capacity 200
    above = (x.abs() >= 1.0).nonzero().flatten()
    assert 0 < above.numel() < 200
    payload, decoded = c.roundtrip(x, seed=0)
    assert payload.numel() == c.payload_nbytes(1000) == 4 + 8 * 200
    assert int(payload[:4].view(torch.int32)[0]) == above.numel()
    assert torch.equal(decoded.nonzero().flatten(), above)
    assert torch.equal(decoded[above], x[above])
    full = Threshold(ThresholdConfig(threshold=0.05, ratio=0.01))  # many above, capacity 10
    assert int((x.abs() >= 0.05).sum()) > 10
    got = full.roundtrip(x, seed=0)[1]
    assert set(got.nonzero().flatten().tolist()) == set(torch.topk(x.abs(), 10).indices.tolist())
    nothing = Threshold(ThresholdConfig(threshold=100.0)).roundtrip(x, seed=0)[1]  # none above: an empty message
    assert int(nothing.count_nonzero()) == 0


def test_natural_rounds_to_a_neighbouring_power_of_two_keeping_the_sign_in_9_bits():
    """Horvath et al. 2019: C(x) in {sign(x) 2^a, sign(x) 2^(a+1)} with 2^a <= |x| < 2^(a+1), up with
    probability (|x| - 2^a)/2^a; an exact power of two (and 0) stays as it is; the variance
    is within the paper's factor 1/8: E||C(x) - x||^2 <= ||x||^2 / 8."""
    c = Natural()
    assert c.payload_nbytes(MLP_PARAMS) == math.ceil(9 * MLP_PARAMS / 8)
    x = vector(2000, seed=13)
    x[:4] = torch.tensor([0.0, 0.5, -8.0, 2.0**-126])
    x[4:6] = torch.tensor([1e-40, -3e-42])  # fp32 subnormals round to 0 or 2^-126
    s = samples(c, x, 200)
    nonzero = s != 0
    assert torch.equal(torch.frexp(s[nonzero].abs())[0], torch.full((int(nonzero.sum()),), 0.5))  # powers of 2
    assert (s[nonzero].sign() == x.expand_as(s)[nonzero].sign()).all()
    low = torch.exp2(torch.floor(torch.log2(x.abs()[6:].double()))).float()
    assert ((s[:, 6:].abs() == low) | (s[:, 6:].abs() == 2 * low)).all()
    assert torch.equal(s[:, :4], x[:4].expand(200, 4))
    assert set(s[:, 4].tolist()) <= {0.0, 2.0**-126} and set(s[:, 5].tolist()) <= {0.0, -(2.0**-126)}
    assert float((s - x).pow(2).sum(1).mean()) <= float(x.pow(2).sum()) / 8


def test_fp8_rounds_each_chunk_scaled_to_e4m3s_range_to_the_nearest_e4m3_value():
    """One fp32 scale per chunk, max|x_c| / 448, and a byte per element: the element divided by it, rounded to the
    nearest e4m3fn value (torch's own cast). A chunk's largest entry comes back exact, its others within 2^-4 of
    their magnitude (3 mantissa bits) down to e4m3's normal range (448 x 2^-6 of the scale's 448), and within
    half its smallest subnormal step below; a chunk of zeros stays zeros, a non-finite entry makes its chunk
    non-finite rather than quietly finite; and a payload decodes from any byte offset (an all-gather's rows)."""
    c = FP8(FP8Config(chunk_size=256))
    n = 1000  # 4 chunks, the last one partial
    x = vector(n, seed=21)
    x[256:512] *= 1e-3                        # a chunk a thousand times smaller keeps its own scale
    x[600:700] = 0.0
    x[768:] = 0.0                             # the last chunk all zeros
    assert c.payload_nbytes(n) == 4 * 4 + n
    payload, got = c.roundtrip(x, seed=0)
    assert payload.numel() == c.payload_nbytes(n)
    for a in range(0, n, 256):
        chunk, back = x[a:a + 256], got[a:a + 256]
        peak = float(chunk.abs().max())
        if peak == 0:
            assert torch.equal(back, torch.zeros_like(back))
            continue
        scale = peak / 448
        cast = (chunk / scale).to(torch.float8_e4m3fn).float() * scale
        torch.testing.assert_close(back, cast, rtol=2e-7, atol=0)  # torch's cast, up to how the scale is applied
        assert float(back.abs().max()) == pytest.approx(peak, rel=1e-6)
        normal = chunk.abs() >= scale * 2.0**-6
        assert ((back - chunk).abs()[normal] <= 2.0**-4 * chunk.abs()[normal] * (1 + 1e-6)).all()
        assert ((back - chunk).abs()[~normal] <= scale * 2.0**-10 * (1 + 1e-6)).all()
    assert (got[600:700] == 0).all()
    buffer = torch.cat([torch.zeros(3, dtype=torch.uint8), payload])
    assert torch.equal(c.decode(buffer[3:], n), got)
    bad = x.clone()
    bad[10] = float("inf")
    back = c.roundtrip(bad, seed=0)[1]
    assert not torch.isfinite(back[:256]).any() and torch.equal(back[256:], got[256:])
    assert COMPRESSORS["fp8"]().ratio(MLP_PARAMS) > 3.9  # 1 byte per element and 4 per chunk of 512


def test_onebit_sends_a_bit_per_element_and_each_chunks_two_means():
    """Seide et al. 2014: per chunk, negative entries become the mean of the chunk's negative
    entries, the others the mean of its non-negative ones; 8 bytes per chunk plus n/8. The last,
    partial chunk's means are over its real entries only."""
    n, d = 1000, 256  # 4 chunks, the last of 232
    c = OneBit(OneBitConfig(chunk_size=d))
    assert c.payload_nbytes(n) == 8 * 4 + math.ceil(n / 8)
    x = vector(n, seed=14) + 0.3  # more positive than negative: padding counted as 0 would show
    decoded = c.roundtrip(x, seed=0)[1]
    for start in range(0, n, d):
        xc, dc = x[start:start + d], decoded[start:start + d]
        neg = xc < 0
        torch.testing.assert_close(dc[neg], xc[neg].mean().expand(int(neg.sum())), rtol=1e-6, atol=0)
        torch.testing.assert_close(dc[~neg], xc[~neg].mean().expand(int((~neg).sum())), rtol=1e-6, atol=0)
    assert torch.equal(OneBit().roundtrip(torch.ones(5), 0)[1], torch.ones(5))  # an empty side sends 0, unused


def test_signum_sends_the_sign_of_its_local_momentum_and_the_ranks_take_a_majority_vote():
    """Bernstein et al. 2018, Signum with majority vote: m = beta m + (1 - beta) g from m = 0, one
    bit per element; the result is sign(sum of the ranks' signs), 0 on a tie, not their mean."""
    beta, n = 0.9, 300
    c, mem = Signum(SignumConfig(momentum=beta)), SignumMomentum(beta)
    assert c.payload_nbytes(n) == math.ceil(n / 8)
    m = torch.zeros(n)
    for t in range(5):
        g = vector(n, seed=300 + t)
        m = beta * m + (1 - beta) * g
        x = mem.compensate(0, g)
        torch.testing.assert_close(x, m, rtol=1e-6, atol=1e-7)
        sent = c.roundtrip(x, seed=t)[1]
        mem.update(0, x, sent)
        assert torch.equal(sent, torch.where(m >= 0, 1.0, -1.0))
    votes = torch.tensor([[1.0, 1.0, -1.0, -1.0], [1.0, -1.0, -1.0, 1.0], [-1.0, 1.0, -1.0, -1.0]])  # 3 ranks
    total = votes.sum(0)
    assert torch.equal(c.combine(total.clone(), 3), torch.tensor([1.0, 1.0, -1.0, -1.0]))
    assert not torch.equal(c.combine(total.clone(), 3), total / 3)  # the mean would give +-1/3 here
    assert torch.equal(c.combine(torch.tensor([0.0, 2.0, -4.0]), 4), torch.tensor([0.0, 1.0, -1.0]))  # a 2-2 tie: 0
    assert torch.equal(ScaledSign().combine(total.clone(), 3), total / 3)  # the others average


# --- packing ---------------------------------------------------------------------

@pytest.mark.parametrize("bits", [1, 2, 3, 7, 8, 9, 10, 16])
@pytest.mark.parametrize("n", [1, 5, 8, 1001])
def test_bit_packing_round_trips_exactly(bits, n):
    codes = torch.randint(0, 2**bits, (n,), generator=torch.Generator().manual_seed(bits * n))
    packed = packing.pack_bits(codes, bits)
    assert packed.dtype == torch.uint8 and packed.numel() == packing.packed_nbytes(n, bits) == math.ceil(n * bits / 8)
    assert torch.equal(packing.unpack_bits(packed, n, bits), codes.to(torch.int32))


def test_sparse_and_float_packing_round_trip_exactly():
    idx = torch.tensor([0, 17, 4095, 2**31 - 1])
    values = torch.tensor([1.5, -0.0, 3.4e38, -1e-30])
    got_idx, got_values = packing.unpack_sparse(packing.pack_sparse(idx, values), 4)
    assert torch.equal(got_idx, idx) and torch.equal(got_values, values)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        v = torch.randn(33).to(dtype).float()  # representable in dtype
        assert torch.equal(packing.unpack_floats(packing.pack_floats(v, dtype), dtype), v)


def test_payloads_decode_from_an_unaligned_offset():
    """An allgather buffer holds payloads back to back; one may start at any byte."""
    c, x = ScaledSign(), vector(13)
    payload, decoded = c.roundtrip(x, seed=0)
    buffer = torch.cat([torch.zeros(3, dtype=torch.uint8), payload])
    assert torch.equal(c.decode(buffer[3:], 13, seed=0), decoded)
    t = TopK(TopKConfig(ratio=0.5))
    payload, decoded = t.roundtrip(x, seed=0)
    buffer = torch.cat([torch.zeros(1, dtype=torch.uint8), payload])
    assert torch.equal(t.decode(buffer[1:], 13, seed=0), decoded)


def test_randomk_indices_are_derived_from_the_seed_not_sent():
    c = RandomK(RandomKConfig(ratio=0.1))
    assert c.payload_nbytes(1000) == 4 * 100  # values only
    x = vector(1000)
    a, b = c.roundtrip(x, seed=11)[1], c.roundtrip(x, seed=11)[1]
    assert torch.equal(a, b)
    assert not torch.equal(a.nonzero(), c.roundtrip(x, seed=12)[1].nonzero())


# --- topologies ----------------------------------------------------------------------

def mixing_matrix(name: str, world: int, round_index: int = 0) -> torch.Tensor:
    """One uncompressed gossip round as a matrix: row r holds rank r's new parameters as
    weights over every rank's old ones, after x_r += w * sum over neighbours p of (x_p - x_r),
    the update GossipSync applies (gamma = 1) with the topology's neighbours and edge weight."""
    x = torch.eye(world, dtype=torch.float64)
    new = x.clone()
    for r in range(world):
        for p in topology.neighbours(name, r, world, round_index, seed=3):
            new[r] += topology.edge_weight(name, world) * (x[p] - x[r])
    return new


def contraction(w: torch.Tensor) -> float:
    """||W - J||_2, J the averaging matrix: below 1, repeated rounds converge to the average."""
    n = w.shape[0]
    return float(torch.linalg.matrix_norm(w - torch.full((n, n), 1 / n, dtype=w.dtype), ord=2))


@pytest.mark.parametrize("name", topology.TOPOLOGIES)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_gossip_mixing_is_doubly_stochastic_nonnegative_and_converges(name, world):
    """The matrix of the topology builder's rounds must be symmetric (so the average is kept),
    nonnegative (no rank over-corrects), and contract towards the average: ||W - J||_2 < 1
    for one round of ring or exponential, and for the product of a few rounds of random
    matchings (one matching leaves each pair's disagreement with the others)."""
    product = torch.eye(world, dtype=torch.float64)
    for round_index in range(2 * world):
        w = mixing_matrix(name, world, round_index)
        assert torch.equal(w, w.T)
        torch.testing.assert_close(w.sum(0), torch.ones(world, dtype=torch.float64))
        assert (w >= 0).all(), w
        product = w @ product
        if name != "random" and world > 1:
            assert contraction(w) < 1 - 1e-9, w
    if world > 1:
        assert contraction(product) < 1 - 1e-9


def test_topology_neighbours():
    assert topology.peers("ring", 0, 1) == []
    assert topology.peers("ring", 0, 2) == [1]       # the ring of two is one edge
    assert topology.peers("ring", 0, 5) == [1, 4]
    assert topology.peers("exponential", 0, 8) == [1, 2, 4, 6, 7]  # +-1, +-2, 4
    assert topology.peers("exponential", 0, 4) == [1, 2, 3]
    partners = topology.matching(5, seed=3, round_index=0)
    assert partners.count(-1) == 1 and all(partners[p] == r for r, p in enumerate(partners) if p >= 0)
    assert topology.matching(5, 3, 0) == topology.matching(5, 3, 0)
    assert any(topology.matching(8, 3, 0) != topology.matching(8, 3, i) for i in range(1, 5))


def test_a_top_k_hooks_thread_runs_in_order_and_ends_with_its_state():
    """The sparse, cyclic and global hooks' communication thread (topk_buckets.py): first in, first out (every
    rank issues its buckets' collectives in one order), a daemon (a collective blocked on a lost peer must not
    keep the process alive), gone once its state is (each new world builds a new one)."""
    import gc
    import threading

    from cohort.trainer.compression.topk_buckets import _start_worker

    class State:
        pass

    state, order, done = State(), [], threading.Event()
    before = set(threading.enumerate())
    jobs = _start_worker(state)
    for i in range(20):
        jobs.put(lambda i=i: order.append(i))
    jobs.put(done.set)
    assert done.wait(5) and order == list(range(20))
    [thread] = [t for t in set(threading.enumerate()) - before if t.name == "cohort-topk"]
    assert thread.daemon
    del state
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
