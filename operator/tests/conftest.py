"""Fixtures for the operator's unit tests: plain dicts, no cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cohort.operator.api.models import TrainingJobSpec
from cohort.operator.api.schema import parse, to_dict

# A job must say what it trains; tests that do not care train the digits MLP.
WORKLOAD = {"model": "mlp", "dataset": "digits"}


def with_workload(spec: dict[str, Any] | None) -> dict[str, Any]:
    """``spec`` (a fragment), with the workload's model and dataset filled in where it names none."""
    out = copy.deepcopy(spec or {})
    out["workload"] = {**WORKLOAD, **out.get("workload", {})}
    return out


def make_job(name: str = "digits", namespace: str = "ns", spec: dict[str, Any] | None = None,
             generation: int = 1) -> dict[str, Any]:
    """A TrainingJob as the API server returns it: every default applied."""
    full = to_dict(parse(TrainingJobSpec, with_workload(spec)))
    return {
        "apiVersion": "cohort.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": generation},
        "spec": full,
    }


@pytest.fixture(name="make_job")
def make_job_fixture():
    """The factory :func:`make_job`, as a fixture (test modules do not import conftest)."""
    return make_job
