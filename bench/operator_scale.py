#!/usr/bin/env python
"""Operator scale benchmark (issue 3): N TrainingJobs x 4 workers on kwok nodes.

Not a test: it prints a table of ratios. For each N it runs, on the same
cluster and in the same invocation:

- **baseline**: a plain kubernetes-client script creating the same worker pods
  (the operator's own pod builder, minus owner references) from a thread pool
  of ``--concurrency`` threads, run before and after the operator and averaged;
- **operator**: ``cohort-operator`` (a subprocess, ``--api-concurrency`` equal
  to that concurrency) turning N TrainingJobs, created at the same
  concurrency, into the same number of pods, plus everything else a job
  owns (config, world, Service, RBAC, PDB, status, Events).

It reports the time until every pod exists and until every job is Running
(every pod Ready, for the baseline), p50/p99 apply->Running per job, the
operator's peak RSS, and its idle CPU once everything runs and the operator
has settled (no reconcile for 5 s: the Service/RBAC/PDB follow-ups and the
deferred Events are done). Its own kwok
nodes (``--nodes`` x ``--pods-per-node``) are created first and deleted at
the end, with the namespaces.

    python bench/operator_scale.py --jobs 100 --jobs 500 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.stats import host, spread  # noqa: E402
from cohort.api.models import TrainingJobSpec  # noqa: E402
from cohort.api.schema import parse, to_dict  # noqa: E402
from cohort.operator.pods import build_worker_pod  # noqa: E402
from cohort.operator.settings import Settings  # noqa: E402
from cohort.trainer.runtime.ports import free_ports  # noqa: E402
from tests.support.wait import wait_for  # noqa: E402

GROUP, VERSION, PLURAL = "cohort.dev", "v1alpha1", "trainingjobs"
NODE_LABEL = "cohort.dev/bench"
INSTANCE = "bench"
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
BENCH_DEFAULTS = Settings(default_image="cohort-trainer:bench").pod_defaults


def job_spec(workers: int) -> dict[str, Any]:
    return {
        "workload": {"model": "mlp", "dataset": "digits"},
        "replicas": {"min": workers, "max": workers, "target": workers},
        "scheduling": {"nodeSelector": {NODE_LABEL: "true"}, "tolerations": [TOLERATION]},
        "stragglers": {"policy": "ignore"},
        "faultTolerance": {"belowMinTimeoutSeconds": 3600},
    }


class Cluster:
    def __init__(self) -> None:
        cfg = client.Configuration()
        config.load_kube_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = 128
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.ext = client.ApiextensionsV1Api(self.api)

    def ensure_crd(self) -> None:
        crd = yaml.safe_load((REPO / "crds/trainingjobs.cohort.dev.yaml").read_text())
        try:
            current = self.ext.read_custom_resource_definition(crd["metadata"]["name"])
            crd["metadata"]["resourceVersion"] = current.metadata.resource_version
            self.ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
        except ApiException as e:
            if e.status != 404:
                raise
            self.ext.create_custom_resource_definition(crd)

    def create_nodes(self, prefix: str, count: int, pods: int) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(pods), "nvidia.com/gpu": "64"}
        for name in names:
            self.core.create_node({
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"kubernetes.io/hostname": name, NODE_LABEL: "true", "type": "kwok-bench"}},
                "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]}})
            self.core.patch_node_status(name, {"status": {"capacity": capacity, "allocatable": capacity}})
        wait_for(lambda: all(any(c.type == "Ready" and c.status == "True"
                                 for c in self.core.read_node(n).status.conditions or []) for n in names),
                 120, what="bench nodes Ready")
        return names

    def delete_nodes(self, names: list[str]) -> None:
        for name in names:
            try:
                self.core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise

    def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {"cohort.dev/bench": "true"}}})
        wait_for(lambda: self.core.list_namespaced_service_account(name).items, 60, what="default ServiceAccount")
        return name

    def drop_namespace(self, name: str) -> None:
        # Pods first, immediately: kwok completes the deletions, so the namespace goes quickly.
        self.core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        self.core.delete_namespace(name, propagation_policy="Background")

        def gone() -> bool:
            try:
                self.core.read_namespace(name)
                return False
            except ApiException as e:
                return e.status == 404

        wait_for(gone, 600, what=f"namespace {name} deleted")


class Recorder:
    """Watches a namespace: when each pod first exists and is Ready, when each job is first Running."""

    def __init__(self, cluster: Cluster, ns: str, *, jobs: bool):
        self.pod_seen: dict[str, float] = {}
        self.pod_ready: dict[str, float] = {}
        self.job_running: dict[str, float] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._pods, args=(cluster, ns), daemon=True)]
        if jobs:
            self._threads.append(threading.Thread(target=self._jobs, args=(cluster, ns), daemon=True))
        for t in self._threads:
            t.start()

    def _pods(self, cluster: Cluster, ns: str) -> None:
        while not self._stop.is_set():
            for ev in watch.Watch().stream(cluster.core.list_namespaced_pod, ns, deserialize=False,
                                           timeout_seconds=30):
                now = time.monotonic()
                obj = ev["object"] if isinstance(ev["object"], dict) else json.loads(ev["object"])
                name = obj["metadata"]["name"]
                self.pod_seen.setdefault(name, now)
                conds = (obj.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    self.pod_ready.setdefault(name, now)
                if self._stop.is_set():
                    return

    def _jobs(self, cluster: Cluster, ns: str) -> None:
        while not self._stop.is_set():
            for ev in watch.Watch().stream(cluster.custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
                                           deserialize=False, timeout_seconds=30):
                now = time.monotonic()
                obj = ev["object"] if isinstance(ev["object"], dict) else json.loads(ev["object"])
                if (obj.get("status") or {}).get("phase") == "Running":
                    self.job_running.setdefault(obj["metadata"]["name"], now)
                if self._stop.is_set():
                    return

    def stop(self) -> None:
        self._stop.set()


def worker_pods(n_jobs: int, workers: int, ns: str) -> list[dict[str, Any]]:
    """The pods the operator would create for these jobs, without owner references."""
    spec_dict = to_dict(parse(TrainingJobSpec, job_spec(workers)))
    spec = parse(TrainingJobSpec, spec_dict)
    out = []
    for j in range(n_jobs):
        job = {"metadata": {"name": f"job{j}", "namespace": ns, "uid": str(uuid.uuid4())}, "spec": spec_dict}
        for i in range(workers):
            pod = build_worker_pod(job, spec, i, defaults=BENCH_DEFAULTS)
            del pod["metadata"]["ownerReferences"]  # no owner exists: the GC would delete them
            pod["spec"]["serviceAccountName"] = "default"  # no per-job RBAC in the baseline
            out.append(pod)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_baseline(cluster: Cluster, n_jobs: int, workers: int, concurrency: int) -> dict[str, float]:
    ns = cluster.namespace("bench-baseline")
    try:
        pods = worker_pods(n_jobs, workers, ns)
        rec = Recorder(cluster, ns, jobs=False)
        time.sleep(1)  # the watch is open
        t0 = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda p: cluster.core.create_namespaced_pod(ns, p, _preload_content=False), pods))
        wait_for(lambda: len(rec.pod_seen) >= len(pods), 600, 0.05, what="baseline pods seen")
        t_exist = max(rec.pod_seen.values()) - t0
        wait_for(lambda: len(rec.pod_ready) >= len(pods), 900, 0.1, what="baseline pods Ready")
        t_ready = max(rec.pod_ready.values()) - t0
        rec.stop()
        return {"pods": len(pods), "exist_s": t_exist, "running_s": t_ready}
    finally:
        cluster.drop_namespace(ns)


def proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS in MB, CPU seconds so far) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


def reconciles(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("cohort_operator_reconcile_seconds_count "):
                return float(line.split()[1])
    return 0.0


def settle(metrics_port: int, quiet_s: float = 5, timeout_s: float = 300) -> float:
    """Wait until the operator has not reconciled anything for ``quiet_s``; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    last, since = reconciles(metrics_port), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(1)
        now = reconciles(metrics_port)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return since
    return time.monotonic()


def run_operator(cluster: Cluster, n_jobs: int, workers: int, concurrency: int, idle_s: float,
                 log_path: Path) -> dict[str, float]:
    ns = cluster.namespace("bench-operator")
    health, metrics = free_ports(2)
    cmd = [sys.executable, "-m", "cohort.operator.main", "--namespace", ns, "--instance", INSTANCE, "--standalone",
           "--metrics-port", str(metrics), "--health-port", str(health),
           "--api-concurrency", str(concurrency), "--log-level", "WARNING"]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def leading() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"operator exited; see {log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=1) as r:
                    return bool(json.loads(r.read()).get("role") == "leader")
            except OSError:
                return False

        wait_for(leading, 60, what="operator leading")
        rec = Recorder(cluster, ns, jobs=True)
        time.sleep(1)
        applied: dict[str, float] = {}

        def apply(j: int) -> None:
            name = f"job{j}"
            applied[name] = time.monotonic()
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
                    "metadata": {"name": name, "labels": {"cohort.dev/operator": INSTANCE}}, "spec": job_spec(workers)}
            cluster.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body, _preload_content=False)

        cpu_start = proc_stats(proc.pid)[1]
        t0 = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(apply, range(n_jobs)))
        total = n_jobs * workers
        wait_for(lambda: len(rec.pod_seen) >= total, 900, 0.05, what="operator pods seen")
        t_exist = max(rec.pod_seen.values()) - t0
        wait_for(lambda: len(rec.job_running) >= n_jobs, 900, 0.1, what="jobs Running")
        t_running = max(rec.job_running.values()) - t0
        latencies = [rec.job_running[j] - applied[j] for j in applied]
        busy_cpu_pct = 100 * (proc_stats(proc.pid)[1] - cpu_start) / (time.monotonic() - t0)
        rec.stop()
        # Idle means settled: the Service/RBAC/PDB follow-ups and deferred Events are done.
        settle_s = settle(metrics) - t0 - t_running
        rss, cpu0 = proc_stats(proc.pid)
        time.sleep(idle_s)
        rss, cpu1 = proc_stats(proc.pid)
        return {"pods": total, "exist_s": t_exist, "running_s": t_running, "settle_s": settle_s,
                "busy_cpu_pct": busy_cpu_pct,
                "p50_s": pct(latencies, 0.5),
                "p99_s": pct(latencies, 0.99), "rss_mb": rss, "idle_cpu_pct": 100 * (cpu1 - cpu0) / idle_s}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        cluster.drop_namespace(ns)


def table(n_jobs: int, workers: int, concurrency: int, rounds: list[tuple[dict[str, float], dict[str, float]]]) -> str:
    """One row per metric: the median and [min-max] over the rounds; a ratio is taken within its round."""
    def col(f: Callable[[dict[str, float], dict[str, float]], float], spec: str) -> str:
        return spread([f(base, op) for base, op in rounds], spec)

    def rate(r: dict[str, float]) -> float:
        return r["pods"] / r["exist_s"]

    rows = [
        ("all pods exist (s)", col(lambda b, o: o["exist_s"], ".1f"), col(lambda b, o: b["exist_s"], ".1f"),
         col(lambda b, o: b["exist_s"] / o["exist_s"], ".2f") + "x"),
        ("pod creation throughput (pods/s)", col(lambda b, o: rate(o), ".0f"), col(lambda b, o: rate(b), ".0f"),
         col(lambda b, o: rate(o) / rate(b), ".2f") + "x (target >= 0.8x)"),
        ("all jobs Running / all pods Ready (s)", col(lambda b, o: o["running_s"], ".1f"),
         col(lambda b, o: b["running_s"], ".1f"), col(lambda b, o: b["running_s"] / o["running_s"], ".2f") + "x"),
        ("apply->Running per job p50 (s)", col(lambda b, o: o["p50_s"], ".2f"), "", ""),
        ("apply->Running per job p99 (s)", col(lambda b, o: o["p99_s"], ".2f"), "", ""),
        ("operator settled after all Running (s)", col(lambda b, o: o["settle_s"], ".1f"), "",
         "Service/RBAC/PDB, Events"),
        ("operator CPU until all Running (% of one core)", col(lambda b, o: o["busy_cpu_pct"], ".0f"), "", ""),
        ("operator peak RSS (MB)", col(lambda b, o: o["rss_mb"], ".0f"), "", "target <= 250"),
        ("operator idle CPU (% of one core)", col(lambda b, o: o["idle_cpu_pct"], ".1f"), "", "target <= 5"),
    ]
    pods = rounds[0][1]["pods"]
    head = (f"N = {n_jobs} TrainingJobs x {workers} workers = {pods:.0f} pods, concurrency {concurrency}, "
            f"{len(rounds)} round(s): the median and [min-max]")
    lines = [head, "", "| metric | operator | baseline (plain client) | operator vs baseline |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, action="append", help="N (repeatable; default 100)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--pods-per-node", type=int, default=300)
    ap.add_argument("--idle-seconds", type=float, default=30)
    ap.add_argument("--repeats", type=int, default=1, help="rounds per N (baseline, operator, baseline each)")
    ap.add_argument("--log", type=Path, default=Path("/tmp/cohort-bench-operator.log"))
    args = ap.parse_args(argv)
    cluster = Cluster()
    cluster.ensure_crd()
    nodes = cluster.create_nodes(f"bench-kwok-{uuid.uuid4().hex[:4]}", args.nodes, args.pods_per_node)
    print(f"Host at the start: {host()}", flush=True)
    try:
        for n in args.jobs or [100]:
            rounds = []
            for r in range(args.repeats):
                # The baseline runs before and after the operator and is averaged:
                # a shared machine's load drifts, and both sides should see the same.
                before = run_baseline(cluster, n, args.workers, args.concurrency)
                op = run_operator(cluster, n, args.workers, args.concurrency, args.idle_seconds, args.log)
                after = run_baseline(cluster, n, args.workers, args.concurrency)
                rounds.append(({k: (before[k] + after[k]) / 2 for k in before}, op))
                print(f"(N = {n}, round {r + 1}: baseline before/after the operator: pods exist "
                      f"{before['exist_s']:.1f}/{after['exist_s']:.1f} s, Ready {before['running_s']:.1f}/"
                      f"{after['running_s']:.1f} s; operator {op['exist_s']:.1f}/{op['running_s']:.1f} s)", flush=True)
            print(flush=True)
            print(table(n, args.workers, args.concurrency, rounds), flush=True)
            print(flush=True)
    finally:
        cluster.delete_nodes(nodes)
        print(f"Host at the end: {host()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
