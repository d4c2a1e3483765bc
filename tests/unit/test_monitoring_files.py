"""The chart's Grafana dashboard and alert rules, read as files (no cluster).

- the dashboard is well-formed Grafana JSON and covers what issue 8 lists;
- every metric name its queries and the alerts use is in the metric catalogue
  of docs/contracts.md §4, under the name Prometheus exposes (histograms as
  _bucket/_sum/_count, counters as _total). tests/e2e/test_monitoring.py
  checks the same names against a live operator's and worker's /metrics;
- the PromQL metric-name extraction those checks rely on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.prometheus import dashboard_exprs, metric_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "helm/cohort/dashboards/cohort.json"
ALERTS = REPO / "helm/cohort/rules/alerts.yaml"


def catalogue() -> dict[str, str]:
    """Metric name -> type, from the tables of docs/contracts.md."""
    out = {}
    for line in (REPO / "docs/contracts.md").read_text().splitlines():
        m = re.match(r"\|\s*`(cohort_[a-z_]+)`\s*\|\s*(gauge|counter|histogram)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def exposed(name: str, kind: str) -> set[str]:
    """The sample names a metric of the catalogue shows up under in Prometheus."""
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if kind == "counter":
        return {name if name.endswith("_total") else f"{name}_total"}
    return {name}


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def without_helm(text: str) -> str:
    return re.sub(r"\{\{.*?\}\}", "1", text)


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_is_well_formed(dashboard):
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace", "trainingjob"}
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["description"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
    # Worker panels are filtered by the two variables.
    for title, expr in dashboard_exprs(dashboard):
        if any(n.startswith("cohort_") and not n.startswith("cohort_operator_") for n in metric_names(expr)):
            assert '$namespace' in expr and '$trainingjob' in expr, title


@pytest.mark.parametrize("topic, metrics", [
    ("jobs by phase", {"cohort_operator_jobs"}),
    ("throughput", {"cohort_samples_per_second"}),
    ("loss", {"cohort_loss"}),
    ("step time: compute and communication", {"cohort_step_compute_seconds_sum", "cohort_step_comm_seconds_sum"}),
    ("throughput in tokens and MFU", {"cohort_tokens_per_second", "cohort_mfu"}),
    ("bytes sent", {"cohort_bytes_sent_total"}),
    ("compression ratio", {"cohort_compression_ratio"}),
    ("replica drift", {"cohort_replica_drift"}),
    ("recoveries", {"cohort_recoveries_total"}),
    ("replacements", {"cohort_operator_replacements_total"}),
    ("checkpoint durations", {"cohort_checkpoint_seconds_sum", "cohort_checkpoint_seconds_bucket"}),
    ("goodput", {"cohort_operator_goodput_seconds_total"}),
    ("queues", {"cohort_operator_queue_workers", "cohort_operator_queue_admissions_total",
                "cohort_operator_queue_evictions_total", "cohort_operator_queue_wait_seconds_bucket"}),
])
def test_dashboard_covers(dashboard, topic, metrics):
    used = set().union(*(metric_names(e) for _, e in dashboard_exprs(dashboard)))
    assert metrics <= used, f"{topic}: {metrics - used} not on the dashboard"


def test_alerts_are_the_four_of_the_issue():
    rules = alert_rules()
    assert [r["alert"] for r in rules] == ["CohortTrainingJobFailed", "CohortTrainingJobNoProgress",
                                          "CohortStragglerReplaced", "CohortRecoveryStorm"]
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]


def test_every_metric_used_is_in_the_contract_catalogue(dashboard):
    known = set().union(*(exposed(n, k) for n, k in catalogue().items()))
    assert len(catalogue()) >= 25  # the tables were found
    used = {(title, n) for title, e in dashboard_exprs(dashboard) for n in metric_names(e)}
    used |= {(r["alert"], n) for r in alert_rules() for n in metric_names(without_helm(r["expr"]))}
    unknown = sorted((where, n) for where, n in used if n not in known)
    assert not unknown, f"not in docs/contracts.md §4 (or not under the exposed name): {unknown}"


def test_per_job_operator_series_are_selected_by_their_own_labels(dashboard):
    """The operator's per-job series carry job_namespace and trainingjob; namespace and job on them are the
    operator pod's (Prometheus's scrape-target labels), so a query that selects or groups a job by those
    shows nothing. (The alerts' sums by namespace over operator-wide series are meant: the operator's.)"""
    per_job = [n for n in per_job_metrics() if n.startswith("cohort_operator_")]
    assert {"cohort_operator_queue_workers", "cohort_operator_goodput_seconds_total"} <= set(per_job)
    exprs = dashboard_exprs(dashboard) + [(r["alert"], without_helm(r["expr"])) for r in alert_rules()]
    wrong, checked = [], 0
    for where, expr in exprs:
        if not any(n in expr for n in per_job):
            continue
        checked += 1
        for name, selector in re.findall(r"(cohort_operator_\w+)\{([^}]*)\}", expr):
            if name in per_job:
                wrong += [(where, m) for m in re.findall(r"\b(namespace|job)\s*=", selector)]
        wrong += [(where, g) for g in re.findall(r"by \(([^)]*\b(?:namespace|job)\b[^)]*)\)", expr)]
    assert checked >= 4 and not wrong, wrong


def per_job_metrics() -> set[str]:
    """Metrics whose row in docs/contracts.md lists a `trainingjob` label."""
    rows = (REPO / "docs/contracts.md").read_text().splitlines()
    return {m.group(1) for line in rows if "`trainingjob`" in line
            and (m := re.match(r"\|\s*`(cohort_[a-z_]+)`", line))}


@pytest.mark.parametrize("expr, names", [
    ('sum by (phase) (cohort_operator_jobs)', {"cohort_operator_jobs"}),
    ('rate(a_sum{x=~"$namespace", y="by (z)"}[$__rate_interval]) / on (pod) group_left(le) b_count',
     {"a_sum", "b_count"}),
    ('histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m]))) > bool 1e3', {"x_bucket"}),
    ('increase(c_total[10m]) == 0 and on (ns) count by (ns) (c_total offset 10m)', {"c_total"}),
    ('max by (job) (max_over_time(g[1h:1m])) unless absent(h)', {"g", "h"}),
    ('sum without (instance) (cohort_step) or vector(0)', {"cohort_step"}),
])
def test_metric_names_are_extracted_from_promql(expr, names):
    assert metric_names(expr) == names
