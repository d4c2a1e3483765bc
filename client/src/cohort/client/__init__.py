"""Cohort's client for people: a Python SDK and the ``cohort`` command for TrainingJobs on a cluster.

A package of its own (``cohort-client``, beside ``cohort-api``) rather than a
module of ``api/``: the API package is the contract the operator and the
trainer share and imports only PyYAML (never the Kubernetes client,
tests/contract/test_import_rules.py), while this one talks to clusters
through the ``kubernetes`` package. It imports neither torch nor kopf, so
``pip install cohort-client`` is a few MB; the trainer (torch) depends on it
for the one ``cohort`` command, whose ``run``, ``plan``, ``calibrate`` and
``validate`` dispatch to ``cohort.trainer.cli`` where it is installed.

    from cohort.client import Client
    c = Client()                       # $KUBECONFIG or ~/.kube/config, the context's namespace
    job = c.submit("examples/digits.yaml")
    c.wait(job.name, "Succeeded", timeout_s=600)

``Client`` is imported lazily, so ``cohort.client.cli`` (and ``cohort run
--local`` through it) works where the Kubernetes package is absent, as in the
trainer image.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ApiError, CohortError, JobFailed, NotFound
from .job import TrainingJob
from .progress import format_progress

if TYPE_CHECKING:
    from .client import Client, Event

__all__ = ["ApiError", "Client", "CohortError", "Event", "JobFailed", "NotFound", "TrainingJob", "format_progress"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "Event"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
