"""α-β cost models of collectives, and fitting α and β to measured times.

A message of ``m`` bytes costs ``α + m·β`` on one link (α: latency per
message in s, β: time per byte in s/B). Ben-Nun & Hoefler, "Demystifying
Parallel and Distributed Deep Learning" (ACM CSUR 2019), §2.4 give the
allreduce algorithms' costs on P ranks (after Thakur, Rabenseifner & Gropp
2005; the reduction's own compute term γ is left out):

- tree (reduce, then broadcast, on a binomial tree): ``2·log2(P)·(α + m·β)``
- butterfly (recursive doubling, whole message each round): ``log2(P)·(α + m·β)``
- ring / pipeline (reduce-scatter + allgather around a ring):
  ``2·(P-1)·α + 2·(P-1)/P·m·β``
- Rabenseifner (recursive-halving reduce-scatter + recursive-doubling
  allgather): ``2·log2(P)·α + 2·(P-1)/P·m·β``

Ring allgather and reduce-scatter of a ``m``-byte (whole) tensor each cost
half a ring allreduce, ``(P-1)·α + (P-1)/P·m·β``; a point-to-point send costs
``α + m·β``. Every model is linear in α and β, so ``fit`` is least squares;
fitting one (α, β) jointly over several P is what tells the algorithms
apart, since at a single P all of them are affine in m.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Each model as (α coefficient, β coefficient) for a message of m bytes over p ranks.
Coefficients = Callable[[float, int], tuple[float, float]]


def _log2(p: int) -> float:
    return float(math.ceil(math.log2(p))) if p > 1 else 0.0


ALLREDUCE_MODELS: dict[str, Coefficients] = {
    "tree": lambda m, p: (2 * _log2(p), 2 * _log2(p) * m),
    "butterfly": lambda m, p: (_log2(p), _log2(p) * m),
    "ring": lambda m, p: (2 * (p - 1), 2 * (p - 1) / p * m),
    "rabenseifner": lambda m, p: (2 * _log2(p), 2 * (p - 1) / p * m),
}


def allreduce_time(nbytes: float, p: int, alpha_s: float, beta_s_per_byte: float, algorithm: str = "ring") -> float:
    if p <= 1 or nbytes <= 0:
        return 0.0
    ca, cb = ALLREDUCE_MODELS[algorithm](nbytes, p)
    return ca * alpha_s + cb * beta_s_per_byte


def allgather_time(nbytes: float, p: int, alpha_s: float, beta_s_per_byte: float) -> float:
    """Ring allgather whose result has ``nbytes`` (each rank contributes nbytes/p); reduce-scatter is the same."""
    if p <= 1 or nbytes <= 0:
        return 0.0
    return (p - 1) * alpha_s + (p - 1) / p * nbytes * beta_s_per_byte


reduce_scatter_time = allgather_time


def p2p_time(nbytes: float, alpha_s: float, beta_s_per_byte: float) -> float:
    return alpha_s + nbytes * beta_s_per_byte if nbytes > 0 else 0.0


@dataclass(frozen=True)
class Fit:
    """α and β of one allreduce model fitted to measurements, and how well it fits."""

    algorithm: str
    alpha_s: float
    beta_s_per_byte: float
    rel_rms_error: float      # sqrt(mean(((predicted - measured) / measured)^2))

    def predict(self, nbytes: float, p: int) -> float:
        return allreduce_time(nbytes, p, self.alpha_s, self.beta_s_per_byte, self.algorithm)


def fit(algorithm: str, samples: Sequence[tuple[float, int, float]]) -> Fit:
    """Least-squares α, β ≥ 0 for ``algorithm`` from (bytes, P, seconds) samples.

    Each sample is weighted by 1/seconds, so the fit minimises relative error
    and small (latency-bound) messages count as much as large ones.
    """
    rows = [(*ALLREDUCE_MODELS[algorithm](m, p), t) for m, p, t in samples]
    # Normal equations of the weighted 2-parameter problem, solved in closed form.
    saa = sum((a / t) ** 2 for a, b, t in rows)
    sbb = sum((b / t) ** 2 for a, b, t in rows)
    sab = sum(a * b / t ** 2 for a, b, t in rows)
    say = sum(a / t for a, b, t in rows)
    sby = sum(b / t for a, b, t in rows)
    det = saa * sbb - sab * sab
    alpha, beta = ((say * sbb - sby * sab) / det, (sby * saa - say * sab) / det) if det > 0 else (0.0, 0.0)
    if alpha < 0:  # clamp to the boundary and refit the other parameter alone
        alpha, beta = 0.0, sby / sbb
    elif beta < 0:
        alpha, beta = say / saa, 0.0
    err = math.sqrt(sum(((alpha * a + beta * b) / t - 1) ** 2 for a, b, t in rows) / len(rows))
    return Fit(algorithm, alpha, beta, err)


def fit_all(samples: Sequence[tuple[float, int, float]]) -> list[Fit]:
    """Every allreduce model fitted to the same samples, best (lowest error) first."""
    return sorted((fit(name, samples) for name in ALLREDUCE_MODELS), key=lambda f: f.rel_rms_error)
