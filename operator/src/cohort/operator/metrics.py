"""The operator's Prometheus metrics (docs/contracts.md §4, "Operator metrics").

Names and labels are part of the contract; dashboards and alerts use them.
They live in their own registry so tests and embedders can run several
operators in one process without clashes.
"""

from __future__ import annotations

import contextlib
from collections import Counter as _Tally
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric

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
        # Jobs in Kueue queues (docs/kueue.md).
        self.queue_admissions = Counter("cohort_operator_queue_admissions_total",
                                        "Kueue admissions of queued TrainingJobs", registry=r)
        self.evictions = Counter("cohort_operator_queue_evictions_total",
                                 "Kueue evictions of TrainingJobs, by Kueue's reason", ["reason"], registry=r)
        self.queue_wait = Histogram(
            "cohort_operator_queue_wait_seconds", "Time a TrainingJob waited in its Kueue queue before an admission",
            registry=r, buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600))
        # Per-job series are labelled job_namespace and trainingjob, never namespace and job: Prometheus
        # keeps those two for the scrape target (the operator's pod) and renames a series' own exported_*.
        self.queue_workers = Gauge("cohort_operator_queue_workers",
                                   "Workers of a queued TrainingJob: kind=target (spec) or admitted (Kueue)",
                                   ["job_namespace", "trainingjob", "kind"], registry=r)
        # Each job's time ledger (status.goodput.seconds), exported as it stands: a counter whose value
        # is the status's, so a restarted operator continues each series where the last one left it.
        self.goodput: dict[tuple[str, str], dict[str, float]] = {}
        r.register(_GoodputCollector(self.goodput))
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

    def set_queue_workers(self, namespace: str, job: str, target: int | None, admitted: int | None) -> None:
        """The per-job queue gauges; None removes them (the job left its queue, finished or is gone)."""
        for kind, value in (("target", target), ("admitted", admitted)):
            if value is None:
                with contextlib.suppress(KeyError):
                    self.queue_workers.remove(namespace, job, kind)
            else:
                self.queue_workers.labels(job_namespace=namespace, trainingjob=job, kind=kind).set(value)

    def set_goodput(self, namespace: str, job: str, seconds: Mapping[str, float] | None) -> None:
        """A job's ledger by category (status.goodput.seconds); None when the job is gone."""
        if seconds is None:
            self.goodput.pop((namespace, job), None)
        elif any(seconds.values()):
            self.goodput[(namespace, job)] = dict(seconds)

    def serve(self, port: int) -> None:
        """Serve /metrics on ``port`` from a background thread."""
        start_http_server(port, registry=self.registry)


class _GoodputCollector:
    """``cohort_operator_goodput_seconds_total{job_namespace, trainingjob, category}`` from the operator's ledgers
    (``trainingjob`` is the workers' label for the same job)."""

    def __init__(self, jobs: dict[tuple[str, str], dict[str, float]]):
        self.jobs = jobs

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("cohort_operator_goodput_seconds",
                                     "Seconds of a TrainingJob's wall time by what they were spent on (status.goodput)",
                                     labels=["job_namespace", "trainingjob", "category"])
        for (namespace, job), seconds in sorted(self.jobs.items()):
            for category, value in seconds.items():
                family.add_metric([namespace, job, category], value)
        yield family
