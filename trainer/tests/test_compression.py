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
from cohort.trainer.compression.error_feedback import ErrorFeedback
from cohort.trainer.compression.quantize import QSGD, QSGDConfig, TernGrad, TernGradConfig
from cohort.trainer.compression.registry import METHODS
from cohort.trainer.compression.sign import ScaledSign
from cohort.trainer.compression.sparsify import RandomK, RandomKConfig, TopK, TopKConfig
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
    assert supports(method, lambda m: m.localsgd_dtype()) == ("localsgd" in syncs), name
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
def test_qsgd_variance_is_within_the_papers_bound(levels, n):
    """Alistarh et al. 2017, Lemma 3.1: E||Q(x) - x||^2 <= min(n/s^2, sqrt(n)/s) ||x||^2.
    The expectation is estimated from 100 draws; the bound must hold for the estimate."""
    x = vector(n, seed=levels)
    q = QSGD(QSGDConfig(levels=levels))
    err = (samples(q, x, 100) - x).pow(2).sum(1).mean()
    bound = min(n / levels**2, math.sqrt(n) / levels) * float(x.pow(2).sum())
    assert float(err) <= bound
    assert q.variance_factor(n) * float(x.pow(2).sum()) == pytest.approx(bound)


# --- biased compressors ----------------------------------------------------------

def test_topk_selects_the_k_largest_magnitudes():
    x = vector(1000, seed=4)
    c = TopK(TopKConfig(ratio=0.05))
    decoded = c.roundtrip(x, seed=0)[1]
    k = kept(1000, 0.05)
    expected = set(torch.argsort(x.abs(), descending=True)[:k].tolist())
    assert set(decoded.nonzero().flatten().tolist()) == expected
    torch.testing.assert_close(decoded[list(expected)], x[list(expected)], rtol=0, atol=0)


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


@pytest.mark.parametrize("name", ["topk", "signsgd"])
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


def test_error_feedback_resets_when_a_bucket_changes_size():
    ef = ErrorFeedback()
    ef.update(0, torch.ones(4), torch.zeros(4))
    torch.testing.assert_close(ef.compensate(0, torch.ones(4)), torch.full((4,), 2.0))
    torch.testing.assert_close(ef.compensate(0, torch.ones(6)), torch.ones(6))


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
    w = torch.zeros(world, world, dtype=torch.float64)
    for r in range(world):
        for p in topology.neighbours(name, r, world, round_index, seed=3):
            w[r, p] = topology.edge_weight(name, world)
        w[r, r] = 1 - w[r].sum()
    return w


@pytest.mark.parametrize("name", topology.TOPOLOGIES)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8])
def test_mixing_is_symmetric_and_doubly_stochastic(name, world):
    for round_index in range(3):
        w = mixing_matrix(name, world, round_index)
        assert torch.equal(w, w.T)
        torch.testing.assert_close(w.sum(0), torch.ones(world, dtype=torch.float64))
        assert (w >= 0).all()


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
