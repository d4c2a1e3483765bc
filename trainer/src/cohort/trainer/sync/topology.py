"""Gossip topologies: who exchanges with whom, and with which mixing weight.

- ``ring``: rank r talks to r-1 and r+1 (one peer when P = 2).
- ``exponential``: peers at distance +-2^k (k = 0, 1, ...; 2^k < P), the
  static exponential graph of Assran et al. 2019 / Ying et al. 2021: degree
  O(log P) and a spectral gap that barely shrinks with P. At P <= 4 it is the
  complete graph.
- ``random``: each round a random perfect matching (one rank sits out when P
  is odd), drawn from a seed every rank shares (workload.seed and the round),
  as in randomized gossip (Boyd et al. 2006).

The static graphs are circulant, hence regular, so the uniform weight
1/(degree + 1) makes the mixing matrix symmetric and doubly stochastic: every
gossip round preserves the average of the replicas. Matchings use 1/2.
"""

from __future__ import annotations

import torch

from ..compression.base import derive_seed, generator

TOPOLOGIES = ("ring", "exponential", "random")


def _offsets(topology: str, world: int) -> list[int]:
    if topology == "ring":
        return [1, world - 1]
    k, out = 1, []
    while k < world:
        out += [k, world - k]
        k *= 2
    return out


def peers(topology: str, rank: int, world: int) -> list[int]:
    """Every rank this one may ever exchange with (sorted)."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"spec.sync.topology: unknown topology {topology!r}; supported: {', '.join(TOPOLOGIES)}")
    if world <= 1:
        return []
    if topology == "random":
        return [r for r in range(world) if r != rank]
    return sorted({(rank + d) % world for d in _offsets(topology, world)} - {rank})


def matching(world: int, seed: int, round_index: int) -> list[int]:
    """partner[r] for round ``round_index`` (-1: sits out); identical on every rank."""
    perm = torch.randperm(world, generator=generator(derive_seed(seed, round_index))).tolist()
    partner = [-1] * world
    for a, b in zip(perm[0::2], perm[1::2], strict=False):
        partner[a], partner[b] = b, a
    return partner


def neighbours(topology: str, rank: int, world: int, round_index: int, seed: int) -> list[int]:
    """The ranks this one gossips with in round ``round_index``."""
    if topology == "random":
        partner = matching(world, seed, round_index)[rank] if world > 1 else -1
        return [] if partner < 0 else [partner]
    return peers(topology, rank, world)


def edge_weight(topology: str, world: int) -> float:
    """Mixing weight of one neighbour (the same at both ends of an edge)."""
    if topology == "random":
        return 0.5
    return 1.0 / (len(peers(topology, 0, world)) + 1)
