"""SYNCS: ``spec.sync.algorithm`` -> Sync class."""

from __future__ import annotations

from .allreduce import AllreduceSync
from .base import Sync
from .gossip import GossipSync
from .localsgd import LocalSGDSync

SYNCS: dict[str, type[Sync]] = {
    "allreduce": AllreduceSync,
    "gossip": GossipSync,
    "localsgd": LocalSGDSync,
}
