"""The operator's Prometheus metrics (docs/contracts.md §4, "Operator metrics").

Names and labels are part of the contract; dashboards and alerts use them.
They live in their own registry so tests and embedders can run several
operators in one process without clashes.
"""

from __future__ import annotations

from collections import Counter as _Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from cohort.api.models import PHASES


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("cohort_operator_jobs", "TrainingJobs by phase", ["phase"], registry=r)
        self.reconcile_seconds = Histogram(
            "cohort_operator_reconcile_seconds", "Reconcile duration", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.pods_created = Counter("cohort_operator_pods_created_total", "Worker pods created", registry=r)
        self.pods_deleted = Counter("cohort_operator_pods_deleted_total", "Worker pods deleted", registry=r)
        self.replacements = Counter("cohort_operator_replacements_total", "Workers replaced", ["reason"], registry=r)
        self.world_changes = Counter("cohort_operator_world_changes_total", "World versions published", registry=r)
        self.errors = Counter("cohort_operator_errors_total", "Errors while reconciling", ["where"], registry=r)
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        for reason in ("failure", "straggler"):
            self.replacements.labels(reason=reason)
        for where in ("reconcile", "events", "resync"):
            self.errors.labels(where=where)

    def set_phases(self, phases: Iterable[str]) -> None:
        tally = _Tally(phases)
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(tally.get(phase, 0))

    def serve(self, port: int) -> None:
        """Serve /metrics on ``port`` from a background thread."""
        start_http_server(port, registry=self.registry)
