"""Spec fragments for tests: a job must say what it trains, and tests that do not care train the digits MLP."""

from __future__ import annotations

import copy
from typing import Any

WORKLOAD = {"model": "mlp", "dataset": "digits"}


def with_workload(spec: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``spec`` whose workload names a model and a dataset (the digits MLP where it names none)."""
    out = copy.deepcopy(spec or {})
    out["workload"] = {**WORKLOAD, **out.get("workload", {})}
    return out
