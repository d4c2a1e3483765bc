"""Fixtures for the operator's unit tests: plain dicts, no cluster."""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.specs import with_workload

from cohort.api.models import TrainingJobSpec
from cohort.api.schema import parse, to_dict


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
