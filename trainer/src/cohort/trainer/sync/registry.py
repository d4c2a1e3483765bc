"""SYNCS: ``spec.sync.algorithm`` -> Sync class."""

from __future__ import annotations

from .allreduce import AllreduceSync
from .base import Sync

SYNCS: dict[str, type[Sync]] = {
    "allreduce": AllreduceSync,
}
