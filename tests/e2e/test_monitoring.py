"""Monitoring end to end: a real Prometheus scrapes the chart's operator and a job's workers.

The chart is installed with its operator on a real node (in a namespace
enforcing the restricted standard, with the chart's NetworkPolicies on, and
kube-router enforcing them), and the workers are containers;
hack/prometheus.sh's Prometheus (3.16, with the chart's alert rules) discovers
the operator pod and the worker pods through kubernetes_sd_configs. One job
trains; once Prometheus has seen its three workers, the test deletes one. Then:

- the job's NetworkPolicy holds: a pod of another job cannot connect to a
  worker's rendezvous or metrics port, while a worker of the same job can,
  and Prometheus scrapes every worker through it;

- every metric name the dashboard and the alerts use is exported by the
  live operator's and a live worker's /metrics;
- through Prometheus' HTTP API: the steps move, the survivors' recoveries
  counter went up after the kill, the operator's world changes too, every
  dashboard query runs, the alert rules are loaded and evaluate, and the
  "job failed" alert fires for a job that failed.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid

import pytest
import yaml
from kubernetes.client.rest import ApiException

from tests.support import helm
from tests.support.kube import Cluster, wait_for
from tests.support.operator import KWOK_TOLERATION, kubectl, wait_phase, world
from tests.support.prometheus import (
    Prometheus,
    dashboard_exprs,
    exported_names,
    metric_names,
    prometheus,  # noqa: F401  (a session fixture)
    substitute_grafana_variables,
    wait_query,
)
from tests.support.realnodes import RESTRICTED, real_nodes, wait_running  # noqa: F401  (a session fixture)
from tests.support.realnodes import pod as restricted_pod

pytestmark = [pytest.mark.e2e]
RELEASE = "cohort"
JOB = "mon"


def _job(instance: str) -> dict:
    job = yaml.safe_load((helm.REPO / "examples/digits.yaml").read_text())
    job["metadata"] = {"name": JOB, "labels": {"cohort.dev/operator": instance}}
    spec = job["spec"]
    spec["workload"].update(epochs=0, maxSteps=1_000_000)  # runs until the test has seen enough
    spec["replicas"] = {"min": 2, "max": 4, "target": 3}
    spec["checkpoint"] = {"everySteps": 100, "keep": 2}
    spec["faultTolerance"] = {"backoffSeconds": 1}
    spec["stragglers"] = {"policy": "ignore"}
    spec["scheduling"] = {"nodeSelector": {"cohort.dev/node-kind": "real"}}
    return job


def _by_pod(prom: Prometheus, expr: str, at: float | None = None) -> dict[str, float]:
    return prom.values_by(expr, "pod", at)


# A worker of another job: what the job's NetworkPolicy keeps out.
STRANGER = "stranger"
RDZV_PORT, METRICS_PORT = 29400, 9400


def _connect(cluster: Cluster, ns: str, from_pod: str, ip: str) -> dict[int, str]:
    """From inside `from_pod`: does a TCP connection to ip's rendezvous and metrics ports open?"""
    code = f"""
import errno, socket
for port in ({RDZV_PORT}, {METRICS_PORT}):
    try:
        socket.create_connection(('{ip}', port), timeout=5).close(); print(port, 'open')
    except socket.timeout:
        print(port, 'timed-out')
    except OSError as e:
        print(port, errno.errorcode.get(e.errno, e.errno))
"""
    out = kubectl(cluster, "exec", "-n", ns, from_pod, "--", "python", "-c", code)
    assert out.returncode == 0, out.stderr
    return {int(port): what for port, what in (line.split() for line in out.stdout.split("\n") if line)}


@pytest.fixture(scope="module")
def scenario(cluster: Cluster, prometheus: Prometheus, real_nodes):  # noqa: F811
    ns = f"monitoring-{uuid.uuid4().hex[:5]}"
    cluster.core.create_namespace({"metadata": {"name": ns, "labels": {"cohort.dev/test": "true", **RESTRICTED}}})
    values = helm.real_node_values(ns)
    values["operator"]["leaderElection"] = {"enabled": False}
    prom = prometheus
    timeout_s = 45 + 10 * prom.scrape_interval_s()  # pod discovery, then a few scrapes
    try:
        helm.install(cluster, RELEASE, ns, values)
        stranger = restricted_pod(STRANGER, "cohort-operator:0.1.0", ["python", "-c", "import time; time.sleep(3600)"])
        stranger["metadata"]["labels"] = {"cohort.dev/job": "other", "cohort.dev/role": "worker"}
        cluster.core.create_namespaced_pod(ns, stranger)
        op = helm.ready_operator_pod(cluster, ns, RELEASE)
        op_url = f"http://{op.status.pod_ip}:8080/metrics"
        t_start = time.time()
        cluster.create_job(ns, _job(ns))
        members = wait_for(lambda: len(m := world(cluster, ns, JOB)["members"]) == 3 and m, 90, 0.5,
                           what="a world of three workers")
        wait_for(lambda: cluster.get_job(ns, JOB).get("status", {}).get("progress", {}).get("step", 0) > 20, 60,
                 0.5, what="training under way")
        texts = {"worker": helm.http_get(f"http://{members[0]['ip']}:9400/metrics"), "operator": helm.http_get(op_url)}
        # members[0] hosts the rendezvous store (the world's master) and serves metrics.
        wait_running(cluster, ns, STRANGER)
        reach = {"peer": _connect(cluster, ns, members[1]["pod"], members[0]["ip"]),
                 "stranger": _connect(cluster, ns, STRANGER, members[0]["ip"])}

        sel = f'namespace="{ns}"'
        wait_query(prom, f"cohort_world_size{{{sel}}} == 3", lambda r: len(r) == 3, timeout_s,
                   "Prometheus scraping all three workers in a world of three")
        wait_query(prom, f'up{{job="cohort-operator", {sel}}} == 1', lambda r: len(r) == 1, timeout_s,
                   "Prometheus scraping the chart's operator")
        victim, survivors = members[2]["pod"], [m["pod"] for m in members[:2]]
        recoveries = f"sum by (pod) (cohort_recoveries_total{{{sel}}})"
        before = _by_pod(prom, recoveries)
        changes = f"sum(cohort_operator_world_changes_total{{{sel}}})"
        changes_before = float(prom.query(changes)[0]["value"][1])
        t_kill = time.time()
        cluster.core.delete_namespaced_pod(victim, ns)
        after = wait_query(prom, recoveries, lambda r: all(
            {s["metric"]["pod"]: float(s["value"][1]) for s in r}.get(p, 0) > before.get(p, 0) for p in survivors),
            timeout_s, "the survivors' recoveries going up")
        wait_query(prom, changes, lambda r: r and float(r[0]["value"][1]) > changes_before, timeout_s,
                   "the operator's world changes going up")
        # Training goes on after the recovery, as Prometheus sees it (and the range has points to show it).
        steps = f"max(cohort_step{{{sel}}})"
        at_recovery = float(prom.query(steps)[0]["value"][1])
        wait_query(prom, steps, lambda r: r and float(r[0]["value"][1]) > at_recovery, timeout_s,
                   "steps moving again after the recovery")
        t_end = time.time()
        yield {"ns": ns, "prom": prom, "texts": texts, "reach": reach,
               "t_start": t_start, "t_kill": t_kill, "t_end": t_end,
               "victim": victim, "survivors": survivors, "before": before,
               "after": {s["metric"]["pod"]: float(s["value"][1]) for s in after}}
    finally:
        # Stop training at once: three workers at full speed are a lot for a shared machine.
        with contextlib.suppress(ApiException):
            cluster.delete_job(ns, JOB)
        helm.uninstall(cluster, RELEASE, ns)
        cluster.delete_namespace(ns)


def test_network_policy_admits_the_jobs_own_workers_and_prometheus_only(scenario, cluster):
    # The operator gave the job its policy, and the chart gave the namespace the metrics-port one.
    policies = {p.metadata.name for p in cluster.networking.list_namespaced_network_policy(scenario["ns"]).items}
    assert {JOB, f"{RELEASE}-workers"} <= policies, policies
    # kube-router REJECTs what no policy admits, so the connection is refused rather than left to time out.
    assert scenario["reach"] == {"peer": {RDZV_PORT: "open", METRICS_PORT: "open"},
                                 "stranger": {RDZV_PORT: "ECONNREFUSED", METRICS_PORT: "ECONNREFUSED"}}, \
        scenario["reach"]
    # Prometheus (on the node itself, which policies admit) scraped all three workers: the
    # scenario waited for cohort_world_size from each. It still has them as targets, healthy.
    prom, sel = scenario["prom"], f'namespace="{scenario["ns"]}"'
    up = prom.query(f'up{{job="cohort-workers", {sel}}}', at=scenario["t_end"])
    assert sum(float(s["value"][1]) for s in up) >= 2, up


def test_dashboard_and_alert_metrics_are_exported_by_the_live_operator_and_worker(scenario):
    exported = exported_names(scenario["texts"]["worker"]) | exported_names(scenario["texts"]["operator"])
    dashboard = json.loads((helm.CHART / "dashboards/cohort.json").read_text())
    rule = helm.find(helm.render(api_versions=helm.MONITORING_API_VERSIONS), "PrometheusRule")[0]
    used = {(title, n) for title, e in dashboard_exprs(dashboard) for n in metric_names(e)}
    used |= {(r["alert"], n) for g in rule["spec"]["groups"] for r in g["rules"] for n in metric_names(r["expr"])}
    assert len(used) > 20
    # The per-job queue gauge and the eviction counter have samples only once a job is queued or
    # evicted; tests/integration/test_kueue.py reads them from the operator of a queued job.
    queued_only = {"cohort_operator_queue_workers", "cohort_operator_queue_evictions_total"}
    missing = sorted((where, n) for where, n in used if n not in exported and n not in queued_only)
    assert not missing, f"used but not exported: {missing}"


def test_steps_move_in_prometheus(scenario):
    prom, sel = scenario["prom"], f'namespace="{scenario["ns"]}"'
    series = prom.query_range(f"max(cohort_step{{{sel}}})", scenario["t_start"], scenario["t_end"], 1)
    steps = [float(v) for _, v in series[0]["values"]]
    assert len(set(steps)) >= 3 and steps[-1] > steps[0], steps
    done = prom.query(f"sum(increase(cohort_steps_total{{{sel}}}[1m]))", at=scenario["t_end"])
    assert float(done[0]["value"][1]) > 0


def test_a_killed_worker_increments_the_survivors_recoveries(scenario):
    for pod in scenario["survivors"]:
        assert scenario["after"][pod] > scenario["before"].get(pod, 0), (pod, scenario["before"], scenario["after"])
    prom, sel = scenario["prom"], f'namespace="{scenario["ns"]}"'
    # Recovered from a live peer, not from a checkpoint: the survivors kept their state.
    peer = _by_pod(prom, f'cohort_recoveries_total{{{sel}, source="peer"}}', scenario["t_end"])
    assert all(peer.get(p, 0) >= 1 for p in scenario["survivors"]), peer


def test_every_dashboard_query_runs_in_prometheus(scenario):
    prom, ns, at = scenario["prom"], scenario["ns"], scenario["t_end"]
    dashboard = json.loads((helm.CHART / "dashboards/cohort.json").read_text())
    empty = []
    for title, expr in dashboard_exprs(dashboard):
        q = substitute_grafana_variables(expr.replace("$namespace", ns))
        result = prom.query(q, at=at)  # raises unless Prometheus accepted and evaluated it
        queue_panel = any(n.startswith("cohort_operator_queue_") for n in metric_names(expr))
        if not result and "checkpoint" not in title.lower() and "recovery time" not in title.lower() \
                and not queue_panel:
            empty.append(title)
    # Checkpoint and recovery-time panels may be empty within a short run, and the queue panels
    # for a job in no Kueue queue; the rest show this job.
    assert not empty, f"panels with no data for a training job: {empty}"
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"].replace("$namespace", ns)
            label = query.rsplit(",", 1)[1].strip(" )")
            metric = query[len("label_values("):].rsplit(",", 1)[0]
            values = prom.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
            assert (ns if label == "namespace" else JOB) in values, (var["name"], values)


def test_alert_rules_are_loaded_and_evaluate(scenario):
    rules = {r["name"]: r for r in scenario["prom"].rules() if r["type"] == "alerting"}
    expected = {"CohortTrainingJobFailed", "CohortTrainingJobNoProgress", "CohortStragglerReplaced",
                "CohortRecoveryStorm"}
    assert expected <= set(rules), sorted(rules)
    for name in expected:
        assert rules[name]["health"] == "ok", rules[name]
    # A job that trains is not "without progress".
    firing = [a for a in rules["CohortTrainingJobNoProgress"]["alerts"]
              if a["labels"].get("namespace") == scenario["ns"]]
    assert not firing, firing


def test_rendered_alert_rules_pass_promtool(tmp_path):
    from tests.support.prometheus import promtool

    docs = helm.render({"prometheusRule": {"noProgressMinutes": 3, "additionalLabels": {"team": "ml"}}},
                       api_versions=helm.MONITORING_API_VERSIONS)
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(helm.find(docs, "PrometheusRule")[0]["spec"]))
    proc = helm.run([promtool(), "check", "rules", str(path)], check=False)
    assert proc.returncode == 0 and "SUCCESS: 4 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_the_job_failed_alert_fires_on_a_failed_job(scenario, cluster):
    prom, ns = scenario["prom"], scenario["ns"]

    def alerts(state: str) -> list[dict]:
        return [a for a in prom.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] ==
                "CohortTrainingJobFailed" and a["labels"].get("namespace") == ns and a["state"] == state]
    assert not alerts("pending") and not alerts("firing")  # no job of this namespace has failed yet
    doomed = _job(ns)
    doomed["metadata"]["name"] = "doomed"
    doomed["spec"]["runPolicy"] = {"activeDeadlineSeconds": 1}  # fails with DeadlineExceeded at once
    doomed["spec"]["scheduling"] = {"nodeSelector": {"type": "kwok"}, "tolerations": [KWOK_TOLERATION]}
    cluster.create_job(ns, doomed)
    wait_phase(cluster, ns, "doomed", "Failed", 60)
    # The rule holds for 1 minute before it fires; Prometheus evaluates it every scrape interval.
    firing = wait_for(lambda: alerts("firing"), 90 + 5 * prom.scrape_interval_s(), 2,
                      what="CohortTrainingJobFailed firing")
    assert float(firing[0]["value"]) == 1.0, firing
    assert firing[0]["labels"]["severity"] == "warning"
